#!/usr/bin/env bash
# Thread and rank scaling of one training step on a compute-bound configuration
# (L6 H6 C384, T=256, B=8, char vocabulary): tokens/s for 1 worker, 2 workers (np=1), and
# 2 ranks x 1 worker (np=2), interleaved over --repeats rounds (medians), and the speedups.
#   dev/bench_threads.sh [--repeats 3] [--steps 5]
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
repeats=3
steps=5
while (($#)); do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: $0 [--repeats N] [--steps N]" >&2; exit 2 ;;
  esac
done
[[ -x build/train_gpt2 ]] || { echo "build/train_gpt2 missing: run scripts/setup.sh" >&2; exit 1; }
[[ -s data/tinyshakespeare.txt ]] || { echo "data/tinyshakespeare.txt missing: run scripts/setup.sh" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--optimizer adamw --n-layer 6 --n-head 6 --n-embd 384 --seq-len 256 --benchmark "$steps" --data data/tinyshakespeare.txt)

tok_s() { sed -n 's/.*| \([0-9.]*\) tok\/s.*/\1/p' | tail -1; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

w1=() w2=() r2=()
for ((i = 1; i <= repeats; i++)); do
  w1+=("$(build/train_gpt2 "${common[@]}" --batch-size 8 --threads 1 | tok_s)")
  w2+=("$(build/train_gpt2 "${common[@]}" --batch-size 8 --threads 2 | tok_s)")
  r2+=("$(mpirun --oversubscribe -np 2 --bind-to core build/train_gpt2 "${common[@]}" --batch-size 4 --threads 1 | tok_s)")
  echo "round $i: W=1 ${w1[-1]}  W=2 ${w2[-1]}  np=2xW=1 ${r2[-1]} tok/s"
done
m1=$(printf '%s\n' "${w1[@]}" | median)
m2=$(printf '%s\n' "${w2[@]}" | median)
mr=$(printf '%s\n' "${r2[@]}" | median)
echo
echo "L6 H6 C384 T256, global batch 8 sequences, $(nproc) cores, $(lscpu | sed -n 's/Model name: *//p')"
printf '%-28s %10s %9s\n' "configuration" "tok/s" "speedup"
printf '%-28s %10.0f %9s\n' "np=1 x 1 worker" "$m1" "1.00x"
printf '%-28s %10.0f %8.2fx\n' "np=1 x 2 workers (threads)" "$m2" "$(awk -v a="$m2" -v b="$m1" 'BEGIN{print a/b}')"
printf '%-28s %10.0f %8.2fx\n' "np=2 x 1 worker (ranks)" "$mr" "$(awk -v a="$mr" -v b="$m1" 'BEGIN{print a/b}')"
