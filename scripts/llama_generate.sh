#!/usr/bin/env bash
# Generates text from a GGUF file (convert_model's, or any llama.cpp model) with llama.cpp, through
# node-llama-cpp's prebuilt CPU binary, the way build/inference does from a checkpoint: it prints
# the prompt and --max-new-tokens new tokens (end-of-text does not stop it), and at --temperature 0
# (greedy) the same text as inference --temperature 0 while prompt and output fit the context.
# --lora ADAPTER.gguf (convert_model --to gguf-lora's) applies a LoRA adapter to MODEL at scale 1.
#   llama_generate.sh MODEL.gguf --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
#                     [--top-p P] [--seed S] [--threads N] [--lora ADAPTER.gguf] [--verbose]
# --threads 0 (the default): one per core this process may run on, and for a model under 100M
# parameters fewer, one per 50M (llama.cpp's threads spin waiting for each other at every
# operation); --verbose says on stderr how many it took.
# node-llama-cpp is looked for in $GPT2_LLAMA_CPP_DIR (a folder holding node_modules), a
# checkout's .deps/llama-cpp, then PREFIX/share/gpt2-mpi/llama-cpp, where cmake --install copies
# the checkout's. `GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh` installs Node and node-llama-cpp.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
me=llama_generate.sh
usage="usage: $me MODEL.gguf --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N] [--lora ADAPTER.gguf] [--verbose]"
fail() { echo "$me: $2" >&2; exit "$1"; }

model="" lora="" prompt="" max_new_tokens=256 temperature=1 top_k=0 top_p=1 seed=1337 threads=0 verbose=0
uint='^[0-9]+$'
real='^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$'
while (($#)); do
  case "$1" in
    -h | --help) echo "$usage"; exit 0 ;;
    --verbose) verbose=1; shift ;;
    --prompt | --max-new-tokens | --temperature | --top-k | --top-p | --seed | --threads | --lora)
      (($# >= 2)) || fail 2 "$1 needs a value"
      case "$1" in
        --prompt) prompt=$2 ;;
        --lora) lora=$2 ;;
        --max-new-tokens) [[ $2 =~ $uint ]] || fail 2 "--max-new-tokens must be a whole number >= 0, not '$2'"
                          max_new_tokens=$2 ;;
        --temperature) [[ $2 =~ $real ]] || fail 2 "--temperature must be a number >= 0, not '$2'"
                       temperature=$2 ;;
        --top-k) [[ $2 =~ $uint ]] || fail 2 "--top-k must be a whole number >= 0 (0: all), not '$2'"
                 top_k=$2 ;;
        --top-p) [[ $2 =~ $real ]] && awk "BEGIN { exit !($2 > 0 && $2 <= 1) }" ||
                   fail 2 "--top-p must be in (0, 1], not '$2'"
                 top_p=$2 ;;
        --seed) [[ $2 =~ $uint ]] && ((${#2} <= 10 && 10#$2 <= 4294967295)) ||
                  fail 2 "--seed must be a whole number in 0..4294967295, not '$2'"
                seed=$2 ;;
        --threads) [[ $2 =~ $uint ]] || fail 2 "--threads must be a whole number >= 0 (0: one per core this process may run on, fewer for a small model: one per 50M parameters), not '$2'"
                   threads=$2 ;;
      esac
      shift 2 ;;
    -*) fail 2 "unknown flag $1 ($usage)" ;;
    *) [[ -z $model ]] || fail 2 "one model file only: '$model' and '$1' ($usage)"
       model=$1; shift ;;
  esac
done
[[ -n $model ]] || fail 2 "no model file ($usage)"
[[ -f $model && -r $model ]] || fail 1 "$model: no such file (or not readable)"
[[ "$(head -c 4 "$model")" == GGUF ]] ||
  fail 1 "$model: not a GGUF file (convert_model MODEL NAME.gguf writes one)"
if [[ -n $lora ]]; then
  [[ -f $lora && -r $lora ]] || fail 1 "--lora $lora: no such file (or not readable)"
  [[ "$(head -c 4 "$lora")" == GGUF ]] ||
    fail 1 "--lora $lora: not a GGUF file (convert_model MODEL NAME.gguf --to gguf-lora --lora-from DIR writes one)"
fi

command -v node >/dev/null ||
  fail 1 "node (Node.js) not found; GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it with node-llama-cpp"
modules=""
for candidate in ${GPT2_LLAMA_CPP_DIR:+"$GPT2_LLAMA_CPP_DIR"} "$here/../.deps/llama-cpp" "$here/../llama-cpp"; do
  if [[ -f $candidate/node_modules/node-llama-cpp/dist/index.js ]]; then
    modules="$(cd "$candidate/node_modules" && pwd)"
    break
  fi
done
[[ -n $modules ]] ||
  fail 1 "node-llama-cpp not found in ${GPT2_LLAMA_CPP_DIR:+\$GPT2_LLAMA_CPP_DIR ($GPT2_LLAMA_CPP_DIR), }$(cd "$here/.." && pwd)/.deps/llama-cpp or $(cd "$here/.." && pwd)/llama-cpp; GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it into a checkout's .deps (then cmake --install copies it), or set GPT2_LLAMA_CPP_DIR"

# The generation itself: llama_generate.mjs beside this script, given its settings by environment.
[[ -f $here/llama_generate.mjs ]] || fail 1 "$here/llama_generate.mjs is missing (it is installed with this script)"
LLAMA_GENERATE_MODULES=$modules LLAMA_GENERATE_MODEL=$model LLAMA_GENERATE_LORA=$lora \
LLAMA_GENERATE_PROMPT=$prompt \
LLAMA_GENERATE_MAX_NEW_TOKENS=$max_new_tokens LLAMA_GENERATE_TEMPERATURE=$temperature \
LLAMA_GENERATE_TOP_K=$top_k LLAMA_GENERATE_TOP_P=$top_p LLAMA_GENERATE_SEED=$seed \
LLAMA_GENERATE_THREADS=$threads LLAMA_GENERATE_VERBOSE=$verbose exec node "$here/llama_generate.mjs"
