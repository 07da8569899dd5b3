#!/usr/bin/env bash
# Builds llm.c's HellaSwag evaluation file OUT/hellaswag_val.bin (data/hellaswag/hellaswag_val.bin)
# with our GPT-2 tokenizer, for train_gpt2 --hellaswag: downloads HellaSwag's public validation
# JSONL (10,042 examples) unless --jsonl names a copy (of any name), then tokenizes it with
# prepare_data --hellaswag.
#   scripts/get_hellaswag.sh [--jsonl FILE] [--out DIR] [--tokenizer-dir DIR] [--prepare-data PROGRAM]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# GPT2_HELLASWAG_URL: another address for the file (tests give one on loopback).
url=${GPT2_HELLASWAG_URL:-https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl}
jsonl=""
out=data/hellaswag
tokenizer_dir=data/gpt2
prepare=""
while (($#)); do
  case "$1" in
    --jsonl) jsonl=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tokenizer-dir) tokenizer_dir=$2; shift 2 ;;
    --prepare-data) prepare=$2; shift 2 ;;
    *) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
# The program: as given, next to an installed script (PREFIX/bin), in a checkout's build/, on PATH.
for candidate in "$prepare" "$here/../../../bin/prepare_data" "$here/../build/prepare_data"; do
  if [[ -n $candidate && -x $candidate ]]; then prepare=$candidate; break; fi
done
[[ -x $prepare ]] || prepare=$(command -v prepare_data) || {
  echo "get_hellaswag.sh: prepare_data not found (build the project or pass --prepare-data)" >&2
  exit 1
}
mkdir -p "$out"
if [[ -z $jsonl ]]; then
  jsonl="$out/hellaswag_val.jsonl"
  if [[ ! -s $jsonl ]]; then
    echo "downloading $url"
    # One line when it fails (offline, say): curl's reason and what to do, and nothing after it.
    if ! why=$(curl -fsSL -o "$jsonl.tmp" "$url" 2>&1); then
      rm -f "$jsonl.tmp"
      echo "get_hellaswag.sh: cannot download $url (${why:-curl failed}): fetch hellaswag_val.jsonl elsewhere and give it with --jsonl FILE" >&2
      exit 1
    fi
    mv "$jsonl.tmp" "$jsonl"
  fi
fi
# One name whatever the JSONL is called: the one the README and train_gpt2 --help give.
"$prepare" --hellaswag "$jsonl" --name hellaswag_val --tokenizer gpt2 --tokenizer-dir "$tokenizer_dir" \
  --out-dir "$out"
