#!/usr/bin/env bash
# Two simulated hosts (scripts/multihost_rig.sh, TCP over tc-limited links) x 1 worker each, on a
# model whose gradient allreduce is comparable to its compute (L6 C384, GPT-2 vocabulary, B=8 per
# rank, T=256): step time of the compute alone (1 rank), of one blocking allreduce after backward
# (--bucket-mb 0), of the overlapped buckets (--bucket-mb 25) and of ZeRO-1 (--zero 1, after
# backward and in overlapped buckets) at each link rate, with each rank's AdamW moment bytes; how
# much of the blocking allreduce's time the overlap hid, and what ZeRO-1 cost. The exposed time is
# split into how much longer forward/backward took than alone (the communication's CPU work on
# the workers' cores), the wait after backward, and the rest (ZeRO-1's allgather after the
# update), from rank 0's per-step log (medians). With --ranks-per-host K (K > 1), also K ranks
# of 1 worker on each host (batch 8/K per rank, the same global batch): each host's ranks sharing
# memory, each slice summed between hosts in 25 MiB buckets while backward runs (the default) or in
# one allreduce after it (--bucket-mb 0), against every rank in overlapped buckets and in one
# allreduce (--share-memory off). Needs root (network namespaces).
#   dev/bench_multihost.sh [--rates "1gbit 10gbit"] [--steps 3] [--ranks-per-host K]
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
rates="1gbit 10gbit"
steps=3
per_host=1
while (($#)); do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    *) echo "usage: $0 [--rates \"1gbit 10gbit\"] [--steps N] [--ranks-per-host K]" >&2; exit 2 ;;
  esac
done
[[ $per_host =~ ^[1-8]$ ]] && ((8 % per_host == 0)) || { echo "--ranks-per-host: 1, 2, 4 or 8" >&2; exit 2; }
[[ -x build/train_gpt2 ]] || { echo "build/train_gpt2 missing: run scripts/setup.sh" >&2; exit 1; }
[[ -s data/gpt2/encoder.json ]] || { echo "data/gpt2 (GPT-2 tokenizer) missing: run scripts/setup.sh" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=(--optimizer adamw --n-layer 6 --n-head 6 --n-embd 384 --tokenizer gpt2 --seq-len 256 --threads 1
       --benchmark "$steps" --data data/tinyshakespeare.txt --log-level debug)
ms() { sed -n 's/^benchmark: median \([0-9.]*\) ms\/step.*/\1/p'; }
# Median over rank 0's timed steps (the last $steps) of a phase of the debug step log:
# "forward/backward" or "allreduce" (the wait after backward).
phase() {
  grep "rank 0 step" | tail -n "$steps" | sed -n "s|.*$1 \([0-9.]*\) ms.*|\1|p" | sort -n |
    awk '{v[NR]=$1} END{if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
}
# The rank's optimizer bytes from the startup memory line (with or without shared weights; AdamW's
# moments, or Muon's momentum with AdamW's moments for the rest).
moments() { sed -n 's/.* \([0-9.]* [KMG]*i*B\) \(Muon momentum and \)\{0,1\}AdamW moments.*/\1/p' | head -1; }
rig=bm$(($$ % 100000))
trap 'scripts/multihost_rig.sh down $rig' EXIT

out_c=$(build/train_gpt2 "${model[@]}" --batch-size 8 2>&1)
compute=$(ms <<<"$out_c") compute_fb=$(phase forward/backward <<<"$out_c")
echo "L6 C384 V50257 B=8 T=256 per rank, 1 worker per host, $(nproc) cores shared by the simulated hosts,"
echo "$(lscpu | sed -n 's/Model name: *//p')"
printf '%-8s %-34s %8s %15s %16s %14s %6s %13s\n' "link" "configuration" "ms/step" \
  "comm exposed ms" "of it: backward" "after backward" "rest" "moments/rank"
printf '%-8s %-34s %8.0f %15s %16s %14s %6s %13s\n' "-" "compute only (1 rank)" "$compute" "-" \
  "(${compute_fb%.*} ms)" "-" "-" "-"
# One row: link, configuration, the run's output.
row() {
  local step exposed slower after
  step=$(ms <<<"$3")
  exposed=$(awk -v a="$step" -v c="$compute" 'BEGIN{print a-c}')
  slower=$(awk -v f="$(phase forward/backward <<<"$3")" -v c="$compute_fb" 'BEGIN{printf "%+.0f", f-c}')
  after=$(phase allreduce <<<"$3")
  printf '%-8s %-34s %8.0f %15.0f %16s %14.0f %6.0f %13s\n' "$1" "$2" "$step" "$exposed" "$slower" \
    "$after" "$(awk -v e="$exposed" -v s="$slower" -v a="$after" 'BEGIN{print e-s-a}')" \
    "$(moments <<<"$3")"
}
for rate in $rates; do
  scripts/multihost_rig.sh up $rig 2 "$rate" >/dev/null
  out_b=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --bucket-mb 0 2>&1)
  out_o=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --bucket-mb 25 2>&1)
  out_z=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --zero 1 --bucket-mb 0 2>&1)
  out_zb=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --zero 1 --bucket-mb 25 2>&1)
  if ((per_host > 1)); then
    many() {
      RIG_SLOTS=$per_host scripts/multihost_rig.sh mpirun $rig -np $((2 * per_host)) build/train_gpt2 \
        "${model[@]}" --batch-size $((8 / per_host)) "$@" 2>&1
    }
    out_s=$(many) out_sa=$(many --bucket-mb 0) out_ob=$(many --share-memory off --bucket-mb 25)
    out_f=$(many --share-memory off --bucket-mb 0)
  fi
  scripts/multihost_rig.sh down $rig
  row "$rate" "2 hosts, one allreduce" "$out_b"
  row "$rate" "2 hosts, overlapped 25 MiB buckets" "$out_o"
  row "$rate" "2 hosts, ZeRO-1" "$out_z"
  row "$rate" "2 hosts, ZeRO-1 in 25 MiB buckets" "$out_zb"
  awk -v b="$(ms <<<"$out_b")" -v o="$(ms <<<"$out_o")" -v z="$(ms <<<"$out_z")" -v c="$compute" \
    -v r="$rate" 'BEGIN{if (b > c) printf "%-8s overlap hid %.0f%% of the blocking allreduce time; ZeRO-1 step time %+.1f%%\n", r, 100*(b-o)/(b-c), 100*(z/b-1)}'
  if ((per_host > 1)); then
    row "$rate" "2x$per_host shared, slices overlapped" "$out_s"
    row "$rate" "2x$per_host shared, slices after" "$out_sa"
    row "$rate" "2x$per_host ranks, overlapped buckets" "$out_ob"
    row "$rate" "2x$per_host ranks, one allreduce" "$out_f"
  fi
done
