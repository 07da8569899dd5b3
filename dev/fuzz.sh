#!/usr/bin/env bash
# Fuzzes every parser of outside bytes: builds the libFuzzer targets (build-fuzz/, clang, ASan +
# UBSan), replays each target's saved crash inputs (tests/fuzz/regressions/NAME/), then fuzzes each
# target for SECONDS (default 30) on a temporary copy of its seed corpus (tests/fuzz/corpus/NAME/,
# whose entries may be links to test files).
# A new crash input is copied into tests/fuzz/regressions/NAME/ (commit it once understood) unless
# it is the same crash as a saved input that still fails. Exits non-zero if any saved input or
# fuzzing run crashed, leaked, timed out or ran out of memory.
# FUZZ_TARGETS="shard tokenizer" limits the run to those targets; FUZZ_SEED=N fixes the seed;
# FUZZ_JOBS=N fuzzes N targets at a time (default: the cores available).
# Usage: dev/fuzz.sh [SECONDS]
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
seconds=${1:-30}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -eq 0 ]]; then
  echo "usage: $0 [seconds per target, default 30]" >&2
  exit 2
fi
parallel=${FUZZ_JOBS:-$(nproc)}
if ! [[ $parallel =~ ^[1-9][0-9]*$ ]]; then
  echo "FUZZ_JOBS must be a positive number (got '$parallel')" >&2
  exit 2
fi
root=$PWD
fuzz_dir=$root/tests/fuzz
bin_dir=$root/build-fuzz/fuzz
targets=${FUZZ_TARGETS:-"checkpoint resume_state shard tokenizer llmc_tokenizer gpt2_tokenizer
  train_config documents multiple_choice safetensors hf_config parquet gguf serve_request"}
fuzz_flags=(-rss_limit_mb=2048 -timeout=10)
# FUZZ_SEED=N makes the mutation sequence repeatable (CI uses it).
[[ -n ${FUZZ_SEED:-} ]] && fuzz_flags+=("-seed=$FUZZ_SEED")

for name in $targets; do
  if [[ ! -d $fuzz_dir/corpus/$name ]]; then
    echo "no seed corpus tests/fuzz/corpus/$name: build make_seeds (cmake --build build-fuzz" \
      "--target make_seeds), run build-fuzz/fuzz/make_seeds tests/fuzz/corpus and commit it" >&2
    exit 2
  fi
done

# -O1 -g1 as the sanitizer builds (dev/sanitizers.sh): the build is most of this script's time, and
# -O2 -g took twice as long for no input the fuzzer would not reach in the same seconds.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DGPT2_FUZZ=ON -DGPT2_BUILD_TESTS=OFF \
  -DGPT2_NATIVE=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >/dev/null
cmake --build build-fuzz -j 2 --target fuzz
echo "build: ${SECONDS}s"

# Most targets rewrite a scratch file on every execution: on tmpfs they run about 4x faster.
scratch=/dev/shm
[[ -d $scratch && -w $scratch ]] || scratch=${TMPDIR:-/tmp}
work=$(mktemp -d "$scratch/gpt2-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The targets' scratch files go here too, so nothing is left behind even after a crash.
export TMPDIR=$work
export UBSAN_OPTIONS=print_stacktrace=1
failures=0
declare -A known_crashes  # target -> signatures of its saved inputs that still fail

# A crash's identity: its first error line and the functions in the top three stack frames,
# without numbers, addresses, template arguments and parameter lists.
signature() {
  grep -m1 -E 'runtime error|==[0-9]+== ?ERROR|\*\*\* fuzz property' "$1" | sed -E 's/0x[0-9a-f]+|[0-9]+//g'
  grep -E '^ +#[0-9]+ 0x[0-9a-f]+ in ' "$1" | head -n 3 |
    sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ in //; s/ \/.*$//; s/ \(\/.*$//; :a; s/<[^<>]*>//g; ta; s/\(.*$//'
}

first_error() {
  grep -m1 -E '^(==[0-9]+== ?ERROR|SUMMARY|\*\*\*|.*runtime error)' "$1" | cut -c1-160 || true
}

echo "== replaying saved crash inputs (tests/fuzz/regressions)"
for name in $targets; do
  dir=$fuzz_dir/regressions/$name
  [[ -d $dir ]] || continue
  for input in "$dir"/*; do
    [[ -f $input ]] || continue
    log=$work/replay.log
    status=0
    "$bin_dir/fuzz_$name" "${fuzz_flags[@]}" -runs=0 "$input" >"$log" 2>&1 || status=$?
    if [[ $status -eq 0 ]]; then
      printf '  %-14s %-44s ok\n' "$name" "$(basename "$input")"
    else
      printf '  %-14s %-44s FAILS (exit %d): %s\n' "$name" "$(basename "$input")" "$status" \
        "$(first_error "$log")"
      known_crashes[$name]+="$(signature "$log")"$'\n\x1e'
      failures=$((failures + 1))
    fi
  done
done

# The targets fuzz side by side, one per core (FUZZ_JOBS, default the cores available): each
# still gets its SECONDS of its own core, and the run takes 1/cores of the time.
fuzz_target() {
  local name=$1 run=$work/$1 status=0
  mkdir -p "$run/artifacts" "$run/tmp"
  # -L: a corpus may link to the test files (corpus/parquet: tests/data/parquet).
  cp -rL "$fuzz_dir/corpus/$name" "$run/corpus"
  TMPDIR=$run/tmp "$bin_dir/fuzz_$name" "${fuzz_flags[@]}" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$run/artifacts/" "$run/corpus" >"$run/log" 2>&1 ||
    status=$?
  echo "$status" >"$run/status"
}

echo "== fuzzing each target for ${seconds}s, $parallel at a time"
for name in $targets; do
  while [[ $(jobs -rp | wc -l) -ge $parallel ]]; do wait -n || true; done
  fuzz_target "$name" &
done
wait
for name in $targets; do
  run=$work/$name
  # No status file: the job failed before its fuzzer ran (a missing corpus, say).
  status=$(cat "$run/status" 2>/dev/null || echo 1)
  runs=$(grep -m1 -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$run/log" ||
    grep -oP '^#\K[0-9]+' "$run/log" | tail -n1 || echo "?")
  secs=$(grep -m1 -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$run/log" || echo "?")
  cov=$(grep -oP '^#[0-9]+\s+\S+\s+cov: \K[0-9]+' "$run/log" | tail -n1 || echo "?")
  found=$(find "$run/artifacts" -type f | sort)
  if [[ $status -eq 0 && -z $found ]]; then
    printf '  %-14s %9s runs (%s/s)  cov %-5s nothing found\n' "$name" "$runs" "$secs" "$cov"
    continue
  fi
  failures=$((failures + 1))
  printf '  %-14s %9s runs (%s/s)  cov %-5s FOUND (exit %d): %s\n' "$name" "$runs" "$secs" "$cov" \
    "$status" "$(first_error "$run/log")"
  cp "$run/log" "$root/build-fuzz/fuzz_$name.log"
  echo "    log: build-fuzz/fuzz_$name.log"
  sig="$(signature "$run/log")"$'\n\x1e'
  if [[ ${known_crashes[$name]:-} == *"$sig"* ]]; then
    echo "    same crash as a saved input in tests/fuzz/regressions/$name/ (not saved again)"
    continue
  fi
  mkdir -p "$fuzz_dir/regressions/$name"
  for artifact in $found; do
    cp "$artifact" "$fuzz_dir/regressions/$name/"
    echo "    saved tests/fuzz/regressions/$name/$(basename "$artifact")"
  done
done

echo "total: ${SECONDS}s"
if [[ $failures -gt 0 ]]; then
  echo "fuzz: $failures failure(s)"
  exit 1
fi
echo "fuzz: all targets clean"
