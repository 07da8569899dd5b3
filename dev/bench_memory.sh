#!/usr/bin/env bash
# Memory against worker threads: peak RSS and tok/s of GPT-2 124M (B=8, T=64, GPT-2 tokenizer)
# for W = 1, 2, 4, 8 workers in one rank, and how much each adds over one worker.
#   dev/bench_memory.sh [--workers "1 2 4 8"] [--steps 3] [--binary build/train_gpt2]
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
workers="1 2 4 8"
steps=3
binary=build/train_gpt2
while (($#)); do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    *) echo "usage: $0 [--workers \"1 2 4 8\"] [--steps N] [--binary PATH]" >&2; exit 2 ;;
  esac
done
[[ -x $binary ]] || { echo "$binary missing: run scripts/setup.sh" >&2; exit 1; }
[[ -s data/tinyshakespeare.txt ]] || { echo "data/tinyshakespeare.txt missing: run scripts/setup.sh" >&2; exit 1; }

echo "GPT-2 124M, B=8, T=64, $steps timed steps, $(nproc) cores, $(lscpu | sed -n 's/Model name: *//p'), $binary"
printf '%-8s %14s %10s %18s\n' "workers" "peak RSS GiB" "tok/s" "RSS over W=1 GiB"
base=""
for w in $workers; do
  out=$("$binary" --optimizer adamw --model gpt2-124M --tokenizer gpt2 --seq-len 64 --batch-size 8 --threads "$w" \
    --benchmark "$steps" --data data/tinyshakespeare.txt 2>&1 | grep '^benchmark:') || {
    echo "W=$w: the run failed" >&2; exit 1; }
  rss=$(sed -n 's/.*peak RSS \([0-9.]*\) GiB.*/\1/p' <<<"$out")
  tok=$(sed -n 's/.*| \([0-9.]*\) tok\/s.*/\1/p' <<<"$out")
  [[ -n $base ]] || base=$rss
  printf '%-8s %14s %10s %18.2f\n' "$w" "$rss" "$tok" "$(awk -v a="$rss" -v b="$base" 'BEGIN{print a-b}')"
done
