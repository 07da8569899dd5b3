#!/usr/bin/env bash
# LoRA against full fine-tuning: GPT-2 124M (random weights), B=--batch-size, T=--seq-len, LoRA
# r=16 alpha=32 on all four projections vs training every weight, run side by side interleaved
# (--rounds pairs of --benchmark runs), the median step time of each, their ratio and peak RSS;
# then GPT-2 1558M with LoRA, --recompute layers --batch-size 1, and its peak RSS.
#   dev/bench_lora.sh [--seq-len 1024] [--batch-size 1] [--steps 3] [--rounds 3] [--threads N]
#                     [--no-1558m] [--binary build/train_gpt2]
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
seq_len=1024
batch=1
steps=3
rounds=3
threads=$(nproc)
big=1
binary=build/train_gpt2
while (($#)); do
  case "$1" in
    --seq-len) seq_len=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --no-1558m) big=0; shift ;;
    --binary) binary=$2; shift 2 ;;
    *) echo "usage: $0 [--seq-len T] [--batch-size B] [--steps N] [--rounds N] [--threads N] [--no-1558m] [--binary PATH]" >&2; exit 2 ;;
  esac
done
[[ -x $binary ]] || { echo "$binary missing: run scripts/setup.sh" >&2; exit 1; }
[[ -s data/tinyshakespeare.txt ]] || { echo "data/tinyshakespeare.txt missing: run scripts/setup.sh" >&2; exit 1; }
threads=$((threads < batch ? threads : batch))

# One --benchmark run; prints "median_ms rss_gib".
bench() {
  local out
  out=$("$binary" --tokenizer gpt2 --data data/tinyshakespeare.txt --seq-len "$seq_len" \
    --batch-size "$batch" --threads "$threads" --benchmark "$steps" "$@" 2>&1) || {
    echo "the run failed ($*):" >&2; tail -3 <<<"$out" >&2; exit 1; }
  out=$(grep '^benchmark:' <<<"$out")
  echo "$(sed -n 's/.*median \([0-9.]*\) ms\/step.*/\1/p' <<<"$out") $(sed -n 's/.*peak RSS \([0-9.]*\) \(GiB\|MiB\).*/\1 \2/p' <<<"$out")"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

echo "$(lscpu | sed -n 's/Model name: *//p'), $(nproc) cores, $threads workers, $binary"
echo "GPT-2 124M (random weights), B=$batch, T=$seq_len, $steps timed steps per run, $rounds rounds interleaved"
full_ms="" lora_ms="" full_rss="" lora_rss=""
for ((r = 1; r <= rounds; r++)); do
  read -r ms rss unit < <(bench --model gpt2-124M)
  full_ms+=" $ms"; full_rss="$rss $unit"
  read -r ms rss unit < <(bench --model gpt2-124M --lora-rank 16 --lora-alpha 32)
  lora_ms+=" $ms"; lora_rss="$rss $unit"
  echo "  round $r: full $(awk '{print $NF}' <<<"$full_ms") ms, LoRA $ms ms"
done
f=$(median <<<"$full_ms")
l=$(median <<<"$lora_ms")
printf '%-26s %16s %14s\n' "" "median ms/step" "peak RSS"
printf '%-26s %16s %14s\n' "full fine-tuning" "$f" "$full_rss"
printf '%-26s %16s %14s\n' "LoRA r=16, all four" "$l" "$lora_rss"
echo "LoRA / full step time: $(awk -v a="$l" -v b="$f" 'BEGIN{printf "%.2f", a/b}')"

if ((big)); then
  echo "GPT-2 1558M (random weights), LoRA r=16 alpha=32, --recompute layers, B=1, T=$seq_len, 1 worker"
  read -r ms rss unit < <(threads=1 batch=1 bench --model gpt2-1558M --recompute layers \
    --lora-rank 16 --lora-alpha 32)
  echo "  median $ms ms/step, peak RSS $rss $unit"
fi
