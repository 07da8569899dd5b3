#!/usr/bin/env bash
# Two simulated hosts (scripts/multihost_rig.sh, TCP over tc-limited links) x 1 worker each, on a
# model whose gradient allreduce is comparable to its compute (L6 C384, GPT-2 vocabulary, B=8 per
# rank, T=256): step time of the compute alone (1 rank), of one blocking allreduce after backward
# (--bucket-mb 0), of the overlapped buckets (--bucket-mb 25) and of ZeRO-1 (--zero 1, after
# backward and in overlapped buckets) at each link rate, with each rank's AdamW moment bytes; how
# much of the blocking allreduce's time the overlap hid, and what ZeRO-1 cost. With --ranks-per-host K (K > 1), also K ranks of 1 worker on
# each host (batch 8/K per rank, the same global batch): each host's ranks sharing memory, each
# slice summed between hosts in 25 MiB buckets while backward runs (the default) or in one
# allreduce after it (--bucket-mb 0), against every rank in overlapped buckets and in one
# allreduce (--share-memory off). Needs root (network namespaces).
#   scripts/bench_multihost.sh [--rates "1gbit 10gbit"] [--steps 3] [--ranks-per-host K]
set -euo pipefail
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
model=(--n-layer 6 --n-head 6 --n-embd 384 --tokenizer gpt2 --seq-len 256 --threads 1
       --benchmark "$steps" --data data/tinyshakespeare.txt)
ms() { sed -n 's/^benchmark: median \([0-9.]*\) ms\/step.*/\1/p'; }
moments() { sed -n 's/.*weights, \([0-9.]* [KMG]*i*B\) AdamW moments.*/\1/p' | head -1; }
rig=bm$(($$ % 100000))
trap 'scripts/multihost_rig.sh down $rig' EXIT

compute=$(build/train_gpt2 "${model[@]}" --batch-size 8 2>&1 | ms)
echo "L6 C384 V50257 B=8 T=256 per rank, 1 worker per host, $(nproc) cores shared by the simulated hosts,"
echo "$(lscpu | sed -n 's/Model name: *//p')"
printf '%-8s %-34s %10s %16s %14s\n' "link" "configuration" "ms/step" "comm exposed ms" "moments/rank"
printf '%-8s %-34s %10.0f %16s %14s\n' "-" "compute only (1 rank)" "$compute" "-" "-"
for rate in $rates; do
  scripts/multihost_rig.sh up $rig 2 "$rate" >/dev/null
  out_b=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --bucket-mb 0 2>&1)
  out_o=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --bucket-mb 25 2>&1)
  out_z=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --zero 1 --bucket-mb 0 2>&1)
  out_zb=$(scripts/multihost_rig.sh mpirun $rig -np 2 build/train_gpt2 "${model[@]}" --batch-size 8 --zero 1 --bucket-mb 25 2>&1)
  if ((per_host > 1)); then
    many() {
      RIG_SLOTS=$per_host scripts/multihost_rig.sh mpirun $rig -np $((2 * per_host)) build/train_gpt2 \
        "${model[@]}" --batch-size $((8 / per_host)) "$@" 2>&1 | ms
    }
    ms_s=$(many) ms_sa=$(many --bucket-mb 0) ms_ob=$(many --share-memory off --bucket-mb 25)
    ms_f=$(many --share-memory off --bucket-mb 0)
  fi
  scripts/multihost_rig.sh down $rig
  ms_b=$(ms <<<"$out_b") ms_o=$(ms <<<"$out_o") ms_z=$(ms <<<"$out_z") ms_zb=$(ms <<<"$out_zb")
  exposed_b=$(awk -v a="$ms_b" -v c="$compute" 'BEGIN{print a-c}')
  exposed_o=$(awk -v a="$ms_o" -v c="$compute" 'BEGIN{print a-c}')
  exposed_z=$(awk -v a="$ms_z" -v c="$compute" 'BEGIN{print a-c}')
  exposed_zb=$(awk -v a="$ms_zb" -v c="$compute" 'BEGIN{print a-c}')
  printf '%-8s %-34s %10.0f %16.0f %14s\n' "$rate" "2 hosts, one allreduce" "$ms_b" "$exposed_b" "$(moments <<<"$out_b")"
  printf '%-8s %-34s %10.0f %16.0f %14s\n' "$rate" "2 hosts, overlapped 25 MiB buckets" "$ms_o" "$exposed_o" "$(moments <<<"$out_o")"
  printf '%-8s %-34s %10.0f %16.0f %14s\n' "$rate" "2 hosts, ZeRO-1" "$ms_z" "$exposed_z" "$(moments <<<"$out_z")"
  printf '%-8s %-34s %10.0f %16.0f %14s\n' "$rate" "2 hosts, ZeRO-1 in 25 MiB buckets" "$ms_zb" "$exposed_zb" "$(moments <<<"$out_zb")"
  awk -v b="$exposed_b" -v o="$exposed_o" -v r="$rate" -v zb="$ms_b" -v z="$ms_z" \
    'BEGIN{if (b > 0) printf "%-8s overlap hid %.0f%% of the blocking allreduce time; ZeRO-1 step time %+.1f%%\n", r, 100*(1-o/b), 100*(z/zb-1)}'
  if ((per_host > 1)); then
    printf '%-8s %-34s %10.0f\n' "$rate" "2x$per_host shared, slices overlapped" "$ms_s"
    printf '%-8s %-34s %10.0f\n' "$rate" "2x$per_host shared, slices after" "$ms_sa"
    printf '%-8s %-34s %10.0f\n' "$rate" "2x$per_host ranks, overlapped buckets" "$ms_ob"
    printf '%-8s %-34s %10.0f\n' "$rate" "2x$per_host ranks, one allreduce" "$ms_f"
  fi
done
