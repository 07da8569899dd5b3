#!/usr/bin/env bash
# Downloads OpenAI's GPT-2 124M from the Hugging Face Hub (openai-community/gpt2: config.json,
# generation_config.json, model.safetensors, vocab.json, merges.txt; 548 MB) into DIR, a Hugging
# Face directory the programs read as it is, and converts it with convert_model to llm.c's model
# file gpt2_124M.bin beside DIR (DIR's parent). Files already there are kept.
#   scripts/get_gpt2_weights.sh [DIR] [--llmc FILE | --no-llmc] [--convert-model PROGRAM]
# DIR defaults to gpt2-hf (so: gpt2-hf/ and gpt2_124M.bin in the current directory).
# GPT2_HF_BASE_URL replaces https://huggingface.co/openai-community/gpt2/resolve/main (a mirror,
# or file:///path for a local copy).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
me=get_gpt2_weights.sh
usage="usage: $me [DIR] [--llmc FILE | --no-llmc] [--convert-model PROGRAM]"
fail() { echo "$me: $2" >&2; exit "$1"; }
base="${GPT2_HF_BASE_URL:-https://huggingface.co/openai-community/gpt2/resolve/main}"
files=(config.json generation_config.json vocab.json merges.txt model.safetensors)

dir="" llmc="" no_llmc=0 convert=""
while (($#)); do
  case "$1" in
    -h | --help) echo "$usage"; exit 0 ;;
    --llmc) (($# >= 2)) && [[ -n $2 ]] || fail 2 "--llmc needs a value"
            llmc=$2; shift 2 ;;
    --convert-model) (($# >= 2)) && [[ -n $2 ]] || fail 2 "--convert-model needs a value"
                     convert=$2; shift 2 ;;
    --no-llmc) no_llmc=1; shift ;;
    -*) fail 2 "unknown flag $1 ($usage)" ;;
    *) [[ -z $dir ]] || fail 2 "one directory only: '$dir' and '$1' ($usage)"
       dir=$1; shift ;;
  esac
done
((no_llmc == 0)) || [[ -z $llmc ]] || fail 2 "--llmc and --no-llmc exclude each other"
dir="${dir:-gpt2-hf}"
dir="${dir%/}"
if [[ -z $llmc ]]; then
  parent="$(dirname "$dir")"
  llmc="gpt2_124M.bin"
  [[ $parent == . ]] || llmc="$parent/$llmc"
fi

command -v curl >/dev/null || fail 1 "curl not found (apt-get install curl)"
# The program before any download: as given, next to an installed script (PREFIX/bin), in a
# checkout's build/, on PATH.
if ((no_llmc == 0)); then
  for candidate in "$convert" "$here/../../../bin/convert_model" "$here/../build/convert_model"; do
    if [[ -n $candidate && -x $candidate ]]; then convert=$candidate; break; fi
  done
  [[ -n $convert && -x $convert ]] || convert=$(command -v convert_model) ||
    fail 1 "convert_model not found (build the project, or pass --convert-model PROGRAM, or --no-llmc)"
fi
if [[ -e $dir && ! -d $dir ]]; then fail 1 "$dir exists and is not a directory"; fi
mkdir -p "$dir" || fail 1 "$dir: cannot create the directory"

# A progress bar on a terminal; otherwise curl's complaint goes into the one error line.
for file in "${files[@]}"; do
  if [[ -s $dir/$file ]]; then
    echo "$dir/$file: already there"
    continue
  fi
  echo "downloading $base/$file"
  if [[ -t 2 ]]; then
    curl -fL --progress-bar -o "$dir/$file.part" "$base/$file" && why="" || why="see above"
  else
    why="$(curl -fLsS -o "$dir/$file.part" "$base/$file" 2>&1)" && why="" || why="${why:-curl failed}"
  fi
  if [[ -n $why ]]; then
    rm -f "$dir/$file.part"
    fail 1 "$base/$file: download failed (${why//$'\n'/ }); GPT2_HF_BASE_URL names another source"
  fi
  mv "$dir/$file.part" "$dir/$file"
done
echo "GPT-2 124M (Hugging Face) in $dir"

((no_llmc == 0)) || exit 0
if [[ -s $llmc ]]; then
  echo "$llmc: already there"
  exit 0
fi
"$convert" "$dir" "$llmc" || fail 1 "convert_model could not write $llmc from $dir"
echo "llm.c's model file: $llmc"
