#!/usr/bin/env bash
# Training throughput of build/train_gpt2 against plain PyTorch (dev/bench_pytorch_train.py)
# on the same model, batch and optimizer, with two cores used either by worker threads (one
# rank, --threads 2) or by MPI ranks (mpiexec -n 2, --threads 1, half the batch per rank so the
# global batch is the same). Issue 8.
#
# Configurations (B = global sequences per step):
#   1  gpt2-124M   L12 H12 C768, V 50257 (GPT-2 BPE), B 4,  T 64   (position table 1024)
#   2  d6-bpe      L6  H6  C384, V 50257 (GPT-2 BPE), B 8,  T 256
#   3  d6-char     L6  H6  C384, V 65    (characters), B 16, T 256
#   4  gpt2-124M   L12 H12 C768, V 50257, B 4, T 256     (the mixed-precision issue's comparison)
#   5  gpt2-124M   L12 H12 C768, V 50257, B 4, T 1024    (the model's real context; 3 steps)
#
# Each configuration runs in fp32 and in bf16: ours with --precision bf16 and PyTorch with
# torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss (its one-line recipe); both
# logs name the kernels their bf16 products ran on (--no-bf16 skips these runs).
#
# The runs are interleaved (ours threads, PyTorch, ours ranks; --repeats times) because the host is
# shared and noisy; the table shows medians over the repeats. Each run does 2 untimed warm-up steps
# and then --steps timed ones; its figure is the median step time. FLOPs per token use the same
# formula on both sides: 6 * (12*L*C^2 + Vp*C) + 12*L*T*C, Vp = V rounded up to a multiple of 128.
#
# Usage: dev/bench.sh [--quick] [--repeats R] [--steps N] [--configs 1,2,3] [--no-bf16] [--log-dir DIR]
#   --quick       smoke test: configuration 3 only, 2 timed steps, 1 repeat
#   --repeats R   runs of each variant per configuration (default 1)
#   --steps N     timed steps per run (default 5 for configuration 1, 10 for the others)
#   --configs L   comma-separated subset of 1,2,3,4,5 (default 1,2,3)
#   --no-bf16     fp32 only (no --precision bf16 and no autocast runs)
#   --timeout S   stop a run after S seconds (default 3600): SIGTERM, then SIGKILL 30 s later
#                 (train_gpt2 --benchmark does not act on SIGTERM/SIGINT until it finishes)
#   --log-dir D   keep every run's full output there (default: a fresh directory under /tmp)
#   --python P    python with torch (default /usr/bin/python3)
#   --pytorch-blas K  OpenBLAS kernels for PyTorch's GEMMs: 'same' (default: the family ours
#                 reports in its log, so both sides multiply with the same kernels), 'env' (leave
#                 OPENBLAS_CORETYPE as inherited), or a name such as SkylakeX or Haswell
#
# Needs build/train_gpt2 (this script builds nothing: `ninja -C build train_gpt2`), mpiexec,
# data/tinyshakespeare.txt and, for configurations 1 and 2, the GPT-2 tokenizer files
# (encoder.json, vocab.bpe) in data/gpt2 or ../shared/data/gpt2 (scripts/get_gpt2_tokenizer.sh).
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

die() { echo "bench.sh: $*" >&2; exit 1; }
usage() { sed -n '/^# Usage:/,/^#$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

quick=0
repeats=""
steps=""
configs="1,2,3"
bf16=1
timeout_s=3600
log_dir=""
python=/usr/bin/python3
pytorch_blas=same
while (($#)); do
  case "$1" in
    --quick) quick=1; shift ;;
    --repeats) repeats="${2:?--repeats needs a value}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a value}"; shift 2 ;;
    --configs) configs="${2:?--configs needs a value}"; shift 2 ;;
    --no-bf16) bf16=0; shift ;;
    --timeout) timeout_s="${2:?--timeout needs a value}"; shift 2 ;;
    --log-dir) log_dir="${2:?--log-dir needs a value}"; shift 2 ;;
    --python) python="${2:?--python needs a value}"; shift 2 ;;
    --pytorch-blas) pytorch_blas="${2:?--pytorch-blas needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
if ((quick)); then
  [[ "$configs" == "1,2,3" ]] && configs=3
  steps="${steps:-2}"
fi
repeats="${repeats:-1}"
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer (got '$repeats')"
[[ -z "$steps" || "$steps" =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer (got '$steps')"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer (got '$timeout_s')"
IFS=',' read -r -a config_list <<<"$configs"
for c in "${config_list[@]}"; do
  [[ "$c" =~ ^[1-5]$ ]] || die "--configs takes a comma-separated subset of 1,2,3,4,5 (got '$configs')"
done

# ---- prerequisites ------------------------------------------------------------------------------
trainer="$repo/build/train_gpt2"
[[ -x "$trainer" ]] || die "$trainer is missing: build it first (cmake -S . -B build -G Ninja && ninja -C build train_gpt2)"
command -v mpiexec >/dev/null || die "mpiexec not found (apt-get install openmpi-bin)"
command -v timeout >/dev/null || die "timeout (coreutils) not found"
[[ -x "$python" ]] || die "python '$python' not found (--python)"
"$python" -c 'import torch' 2>/dev/null || die "$python cannot import torch"

data=""
for d in "$repo/data/tinyshakespeare.txt" "$repo/../shared/data/tinyshakespeare.txt"; do
  [[ -f "$d" ]] && { data="$d"; break; }
done
[[ -n "$data" ]] || die "data/tinyshakespeare.txt is missing (scripts/setup.sh fetches it, or copy it from ../shared/data)"

needs_bpe=0
for c in "${config_list[@]}"; do [[ "$c" != 3 ]] && needs_bpe=1; done
tok_dir=""
if ((needs_bpe)); then
  for d in "$repo/data/gpt2" "$repo/../shared/data/gpt2"; do
    [[ -f "$d/encoder.json" && -f "$d/vocab.bpe" ]] && { tok_dir="$d"; break; }
  done
  [[ -n "$tok_dir" ]] || die "GPT-2 tokenizer files (encoder.json, vocab.bpe) not in data/gpt2 or ../shared/data/gpt2: run scripts/get_gpt2_tokenizer.sh (or --configs 3)"
fi

if [[ -z "$log_dir" ]]; then
  log_dir="$(mktemp -d /tmp/gpt2-bench.XXXXXX)"
else
  mkdir -p "$log_dir"
fi
mpi_env=()
((EUID == 0)) && mpi_env=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)

# ---- configurations -----------------------------------------------------------------------------
# name L NH C V B T block tokenizer default-steps
declare -A cfg=(
  [1]="gpt2-124M 12 12 768 50257 4 64 1024 gpt2 5"
  [2]="d6-bpe 6 6 384 50257 8 256 256 gpt2 10"
  [3]="d6-char 6 6 384 65 16 256 256 char 10"
  [4]="gpt2-124M 12 12 768 50257 4 256 1024 gpt2 5"
  [5]="gpt2-124M 12 12 768 50257 4 1024 1024 gpt2 3"
)

# ---- header -------------------------------------------------------------------------------------
cpu_model="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
git_rev="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$repo" diff --quiet HEAD 2>/dev/null || git_rev+=" (+ uncommitted changes)"
echo "== gpt2-mpi training benchmark: ours vs PyTorch =="
echo "date:     $(date '+%Y-%m-%d %H:%M:%S %Z')"
echo "cpu:      ${cpu_model:-unknown} | $(nproc) cores usable ($(lscpu | sed -n 's/^CPU(s):[[:space:]]*//p') online)"
echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min; the host is shared, figures are noisy)"
echo "ours:     $trainer (built $(date -r "$trainer" '+%Y-%m-%d %H:%M')), git $git_rev"
echo "pytorch:  $("$python" -c 'import torch; print(torch.__version__)') ($python)"
echo "mpi:      $(mpiexec --version 2>&1 | head -n1)"
echo "openblas: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} inherited; PyTorch kernels: $pytorch_blas"
echo "data:     $data${tok_dir:+ | GPT-2 tokenizer $tok_dir}"
echo "runs:     configs ${configs}, repeats $repeats, steps ${steps:-5 (configs 1, 4) / 3 (5) / 10}, 2 warm-up steps each, bf16 $( ((bf16)) && echo on || echo off); logs in $log_dir"
echo

trainer_mtime="$(stat -c %Y "$trainer")"

# ---- running ------------------------------------------------------------------------------------
failures=0
declare -A results  # "<config>/<variant>/<repeat>" -> the result line, or FAIL

# run_one KEY LOG EXPECT_PREFIX CHECK_REGEX CMD...: runs CMD, keeps the result line that starts
# with EXPECT_PREFIX, and complains precisely when it is missing or does not match CHECK_REGEX.
run_one() {
  local key="$1" log="$2" prefix="$3" check="$4"
  shift 4
  local rc=0 line start end
  start=$(date +%s)
  { echo "\$ $*"; echo; } >"$log"
  timeout --kill-after=30 "$timeout_s" "$@" >>"$log" 2>&1 || rc=$?
  end=$(date +%s)
  line="$(grep -E "^${prefix}: median " "$log" | tail -n1 || true)"
  if ((rc != 0)) || [[ -z "$line" ]]; then
    results[$key]=FAIL
    failures=$((failures + 1))
    if ((rc == 124 || rc == 137)); then
      printf '  %-22s FAILED: timed out after %s s (%s)\n' "$key" "$timeout_s" "$log"
    else
      printf '  %-22s FAILED: exit %s, %s (%s); last lines:\n' "$key" "$rc" \
        "$([[ -z "$line" ]] && echo "no '${prefix}:' line" || echo "result line present")" "$log"
    fi
    tail -n 8 "$log" | sed 's/^/      | /'
    return 0
  fi
  results[$key]="$line"
  printf '  %-22s %s  [%ss]\n' "$key" "${line#"${prefix}": }" "$((end - start))"
  if ! [[ "$line" =~ $check ]]; then
    printf '  %-22s WARNING: unexpected report (wanted /%s/)\n' "" "$check"
  fi
  local suspicious
  suspicious="$(sed '1,2d' "$log" | grep -v -E "^${prefix}: median " | grep -iwE 'non-finite|error|nan|warning' || true)"
  if [[ -n "$suspicious" ]]; then
    printf '  %-22s WARNING: the log mentions non-finite/error/nan/warning:\n' ""
    head -n3 <<<"$suspicious" | sed 's/^/      | /'
  fi
}

for c in "${config_list[@]}"; do
  read -r name L NH C V B T block tok def_steps <<<"${cfg[$c]}"
  n="${steps:-$def_steps}"
  ((B % 2 == 0)) || die "config $c: batch $B is not even"
  echo "-- config $c: $name  L$L H$NH C$C V$V  B=$B T=$T  ($n timed steps)"
  if [[ "$tok" == gpt2 ]]; then
    tok_flags=(--tokenizer gpt2 --tokenizer-dir "$tok_dir")
  else
    tok_flags=(--tokenizer char)
  fi
  if [[ "$name" == gpt2-124M ]]; then
    model_flags=(--model gpt2-124M)
  else
    model_flags=(--n-layer "$L" --n-head "$NH" --n-embd "$C" --block-size "$block")
  fi
  # Constant lr 3e-4 like the PyTorch side; weight decay 0.1 and clip 1.0 are the defaults.
  # --benchmark skips validation, samples and checkpoints; the other flags make that explicit.
  ours=("$trainer" "${model_flags[@]}" "${tok_flags[@]}" --data "$data" --seq-len "$T"
    --optimizer adamw --lr 3e-4 --min-lr 3e-4 --schedule constant --warmup-steps 0 --weight-decay 0.1
    --grad-clip 1.0 --val-every 0 --sample-every 0 --checkpoint-every 0
    --out-dir "$log_dir/out" --benchmark "$n")
  torch_cmd=("$python" "$repo/dev/bench_pytorch_train.py" --n-layer "$L" --n-head "$NH"
    --n-embd "$C" --vocab "$V" --block-size "$block" --batch-size "$B" --seq-len "$T"
    --steps "$n" --warmup 2 --threads 2)
  for ((r = 1; r <= repeats; r++)); do
    run_one "$c/threads/$r" "$log_dir/c${c}-threads-r$r.log" benchmark \
      "\| $n steps, ranks 1 x workers 2$" \
      "${ours[@]}" --batch-size "$B" --threads 2
    # PyTorch (Debian's build calls the system OpenBLAS) gets the kernels ours just used.
    blas_env=()
    case "$pytorch_blas" in
      env) ;;
      same)
        k="$(grep -ohE 'GEMM kernels [A-Za-z0-9_]+' "$log_dir/c${c}-threads-r$r.log" 2>/dev/null | head -n1 | awk '{ print $3 }' || true)"
        if [[ -n "$k" ]]; then blas_env=(OPENBLAS_CORETYPE="$k"); else
          echo "  (ours' log names no GEMM kernels: PyTorch keeps OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)})"; fi ;;
      *) blas_env=(OPENBLAS_CORETYPE="$pytorch_blas") ;;
    esac
    run_one "$c/pytorch/$r" "$log_dir/c${c}-pytorch-r$r.log" pytorch \
      "\| $n steps, threads 2 \| OpenBLAS " \
      env "${blas_env[@]}" "${torch_cmd[@]}"
    run_one "$c/ranks/$r" "$log_dir/c${c}-ranks-r$r.log" benchmark \
      "\| $n steps, ranks 2 x workers 1$" \
      env "${mpi_env[@]}" mpiexec -n 2 --oversubscribe --bind-to none \
      "${ours[@]}" --batch-size "$((B / 2))" --threads 1
    if ((bf16)); then
      run_one "$c/bf16/$r" "$log_dir/c${c}-bf16-r$r.log" benchmark \
        "\| $n steps, ranks 1 x workers 2$" \
        "${ours[@]}" --batch-size "$B" --threads 2 --precision bf16
      run_one "$c/autocast/$r" "$log_dir/c${c}-autocast-r$r.log" pytorch \
        "\| $n steps, threads 2 \| OpenBLAS .* \| autocast bf16 on " \
        env "${blas_env[@]}" "${torch_cmd[@]}" --autocast bf16
    fi
  done
  if ((bf16)); then
    isa_ours="$(grep -ohE 'products on [^,]+' "$log_dir/c${c}-bf16-r1.log" 2>/dev/null | head -n1 | sed 's/products on //' || true)"
    isa_torch="$(grep -ohE 'autocast bf16 on .*$' "$log_dir/c${c}-autocast-r1.log" 2>/dev/null | head -n1 | sed 's/autocast bf16 on //' || true)"
    echo "  bf16 products: ours on ${isa_ours:-?}; PyTorch autocast on ${isa_torch:-?}"
  fi
  # Our log states the vocabulary it built; it must be the one PyTorch was given.
  # Both sides should have multiplied with the same OpenBLAS kernels.
  k_ours="$(grep -ohE 'GEMM kernels [A-Za-z0-9_]+' "$log_dir/c${c}-threads-r1.log" "$log_dir/c${c}-ranks-r1.log" 2>/dev/null | awk '{ print $3 }' | sort -u | paste -sd/ || true)"
  k_torch="$(grep -ohE 'OpenBLAS [A-Za-z0-9_]+$' "$log_dir/c${c}-pytorch-r1.log" 2>/dev/null | awk '{ print $2 }' | sort -u | paste -sd/ || true)"
  if [[ "$(stat -c %Y "$trainer" 2>/dev/null || echo gone)" != "$trainer_mtime" ]]; then
    echo "  WARNING: $trainer was rebuilt during the benchmark: its runs may mix two builds"
  fi
  echo "  GEMM kernels: ours ${k_ours:-?}, PyTorch ${k_torch:-?}"
  [[ -n "$k_ours" && "$k_ours" == "$k_torch" ]] || echo "  WARNING: the two sides did not use the same GEMM kernels; the ratio compares BLAS kernels too"
  if got_v="$(grep -ohE ' V=[0-9]+ ' "$log_dir/c${c}-threads-r1.log" | head -n1 | tr -dc 0-9)" && [[ -n "$got_v" && "$got_v" != "$V" ]]; then
    echo "  WARNING: ours built V=$got_v, PyTorch ran V=$V"
  fi
  echo
done

# ---- table --------------------------------------------------------------------------------------
# field LINE REGEX: the first capture group of REGEX in LINE, or empty.
field() { if [[ "$1" =~ $2 ]]; then echo "${BASH_REMATCH[1]}"; fi; }
tok_s() { field "$1" '\| ([0-9.]+) tok/s'; }
mfu() { field "$1" '\| MFU ([0-9.]+)%'; }
rss_mib() {  # peak RSS in MiB
  local v u
  v="$(field "$1" 'peak RSS ([0-9.]+) [KMG]iB')"
  u="$(field "$1" 'peak RSS [0-9.]+ ([KMG])iB')"
  [[ -z "$v" ]] && return 0
  awk -v v="$v" -v u="$u" 'BEGIN { f = (u == "G") ? 1024 : (u == "K") ? 1 / 1024 : 1; printf "%.0f", v * f }'
}
# median of the numbers on stdin (mean of the middle two for an even count); "-" when none.
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# collect CONFIG VARIANT EXTRACTOR: the extractor's values over the repeats that succeeded.
collect() {
  local r line
  for ((r = 1; r <= repeats; r++)); do
    line="${results[$1/$2/$r]:-FAIL}"
    [[ "$line" == FAIL ]] || "$3" "$line"
    echo
  done | sed '/^$/d'
}
fmt_num() { if [[ "$1" == - ]]; then echo -; else awk -v x="$1" 'BEGIN { printf "%.0f", x }'; fi; }

echo "== results: tokens/s (global batch, median over $repeats repeat(s)); peak RSS of one process =="
hdr=("config" "ours np=1 W=2" "ours np=2 W=1" "PyTorch W=2" "ours(best)/PyTorch" "ours MFU" "peak RSS ours vs PyTorch")
printf '%-40s | %13s | %13s | %11s | %18s | %8s | %s\n' "${hdr[@]}"
printf '%s\n' "$(printf -- '-%.0s' {1..156})"
for c in "${config_list[@]}"; do
  read -r name L NH C V B T block tok def_steps <<<"${cfg[$c]}"
  thr="$(collect "$c" threads tok_s | median)"
  rk="$(collect "$c" ranks tok_s | median)"
  pt="$(collect "$c" pytorch tok_s | median)"
  best=- best_v=threads
  if [[ "$thr" != - || "$rk" != - ]]; then
    best="$(awk -v a="$thr" -v b="$rk" 'BEGIN { if (a == "-") a = -1; if (b == "-") b = -1; print (a >= b) ? a : b }')"
    [[ "$rk" != - && ( "$thr" == - || $(awk -v a="$thr" -v b="$rk" 'BEGIN { print (b > a) }') == 1 ) ]] && best_v=ranks
  fi
  ratio=-
  [[ "$best" != - && "$pt" != - ]] && ratio="$(awk -v a="$best" -v b="$pt" -v v="$best_v" 'BEGIN { printf "%.2fx (%s)", a / b, v }')"
  m="$(collect "$c" "$best_v" mfu | median)"
  [[ "$m" != - ]] && m="$(awk -v x="$m" 'BEGIN { printf "%.1f%%", x }')"
  rss_o="$(collect "$c" threads rss_mib | median)"
  rss_r="$(collect "$c" ranks rss_mib | median)"
  rss_p="$(collect "$c" pytorch rss_mib | median)"
  rss="$(fmt_num "$rss_o") vs $(fmt_num "$rss_p") MiB (np=2: $(fmt_num "$rss_r") per rank)"
  printf '%-40s | %13s | %13s | %11s | %18s | %8s | %s\n' \
    "$c $name L$L H$NH C$C V$V B$B T$T" "$(fmt_num "$thr")" "$(fmt_num "$rk")" "$(fmt_num "$pt")" \
    "$ratio" "$m" "$rss"
done
if ((bf16)); then
  echo
  echo "== bf16: tokens/s, 1 rank x 2 threads (ours --precision bf16) and PyTorch autocast bf16, 2 threads =="
  printf '%-40s | %10s | %10s | %12s | %16s | %18s\n' "config" "ours fp32" "ours bf16" "bf16/fp32" "PyTorch autocast" "ours bf16/autocast"
  printf '%s\n' "$(printf -- '-%.0s' {1..120})"
  for c in "${config_list[@]}"; do
    read -r name L NH C V B T block tok def_steps <<<"${cfg[$c]}"
    thr="$(collect "$c" threads tok_s | median)"
    b16="$(collect "$c" bf16 tok_s | median)"
    ac="$(collect "$c" autocast tok_s | median)"
    up=- vs=-
    [[ "$thr" != - && "$b16" != - ]] && up="$(awk -v a="$b16" -v b="$thr" 'BEGIN { printf "%.2fx", a / b }')"
    [[ "$ac" != - && "$b16" != - ]] && vs="$(awk -v a="$b16" -v b="$ac" 'BEGIN { printf "%.2fx", a / b }')"
    printf '%-40s | %10s | %10s | %12s | %16s | %18s\n' "$c $name L$L H$NH C$C V$V B$B T$T" \
      "$(fmt_num "$thr")" "$(fmt_num "$b16")" "$up" "$(fmt_num "$ac")" "$vs"
  done
fi
echo
peak="$(grep -ohE 'MFU peak [0-9.]+ GFLOP/s \([^)]*\)' "$log_dir"/c*-threads-r1.log 2>/dev/null | head -n1 || true)"
echo "MFU: ours' own figure for the better of its two layouts, against the cores' FMA peak it"
echo "measured at start-up (${peak:-see its log}; --peak-gflops sets it). np=2 RSS is rank 0's."
echo "Full output of every run: $log_dir"
if ((failures)); then
  echo "bench.sh: $failures run(s) failed; see above" >&2
  exit 1
fi
