#!/usr/bin/env bash
# Benchmark single-threaded sgemm backends on GPT-2 training shapes (scripts/bench_sgemm.cpp):
# OpenBLAS (serial build, and pthread build at 1 thread), BLIS (serial build), oneDNN (1 OpenMP
# thread per calling thread).
# Each backend is timed on one thread alone and on 2 threads calling sgemm concurrently on their
# own buffers; runs are interleaved over ROUNDS rounds and the tables show medians.
#
# Usage (from anywhere; paths are relative to the repo root):
#   scripts/bench_sgemm.sh [bench_sgemm options, e.g. --filter C768 --min-time 0.1]
# Environment:
#   ROUNDS=3        interleaved rounds per variant (medians are taken over these)
#   MIN_TIME=0.1    seconds of timed calls per shape and mode (at least one call)
#   CXX=g++         compiler
#   ONLY=REGEX      run only variants whose label matches (e.g. 'SkylakeX|skx|onednn')
#   KEEP_TMP=1      keep the temp dir with binaries, raw CSVs and result dumps
#
# Debian packages: libopenblas-serial-dev (+ libopenblas-pthread-dev), libblis-dev
# (+ libblis4-serial), libdnnl-dev. A backend whose package is missing is skipped with a note.
# With the defaults (6 variants on an AVX-512 CPU, 3 rounds) it takes 5-12 minutes on 2 cores.
# Exit status 1 if any variant produced wrong results (the tables are printed regardless).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$repo_root/scripts/bench_sgemm.cpp"
cxx="${CXX:-g++}"
rounds="${ROUNDS:-3}"
min_time="${MIN_TIME:-0.1}"
extra_args=("$@")

multiarch="$(gcc -print-multiarch 2>/dev/null || true)"
multiarch="${multiarch:-x86_64-linux-gnu}"
libdir="/usr/lib/$multiarch"
incdir="/usr/include/$multiarch"
cxxflags=(-std=c++20 -O2 -Wall -Wextra -pthread)

tmp="$(mktemp -d -t bench_sgemm.XXXXXX)"
if [[ "${KEEP_TMP:-0}" == 1 ]]; then
    echo "temp dir (kept): $tmp"
else
    trap 'rm -rf "$tmp"' EXIT
fi

note() { echo "note: $*"; }

# ---- build ------------------------------------------------------------------------------------
echo "== building backends in $tmp"
built=()  # backend names with a binary $tmp/bench_<name>
# Per-backend environment that forces one library thread per call for non-serial builds.
declare -A thread_env=([openblas]="" [openblas-pt]="" [blis]="" [dnnl]="OMP_NUM_THREADS=1")

build() {  # build NAME ARGS... ; compile errors are shown and the backend is skipped
    local name="$1"
    shift
    if "$cxx" "${cxxflags[@]}" "$@" -o "$tmp/bench_$name" 2>"$tmp/build_$name.log"; then
        built+=("$name")
        echo "built $name"
    else
        note "skipping $name: compile/link failed:"
        sed 's/^/    /' "$tmp/build_$name.log" | head -20
    fi
}

# OpenBLAS: the serial build, and the pthread build forced to 1 thread per call (its locking is
# the pthread-mutex kind; Debian's serial 0.3.21 gives wrong results under concurrent calls here).
if [[ -f "$incdir/openblas-serial/cblas.h" && -e "$libdir/openblas-serial/libopenblas.so" ]]; then
    build openblas -DBACKEND_OPENBLAS -isystem "$incdir/openblas-serial" "$src" \
        -L"$libdir/openblas-serial" -Wl,-rpath,"$libdir/openblas-serial" -lopenblas
else
    note "skipping openblas (serial): no $incdir/openblas-serial/cblas.h" \
        "(install libopenblas-serial-dev)"
fi
if [[ -f "$incdir/openblas-pthread/cblas.h" && -e "$libdir/openblas-pthread/libopenblas.so" ]]; then
    thread_env[openblas-pt]="OPENBLAS_NUM_THREADS=1"
    build openblas-pt -DBACKEND_OPENBLAS -isystem "$incdir/openblas-pthread" "$src" \
        -L"$libdir/openblas-pthread" -Wl,-rpath,"$libdir/openblas-pthread" -lopenblas
else
    note "skipping openblas-pt (pthread build, 1 thread): no $incdir/openblas-pthread/cblas.h" \
        "(install libopenblas-pthread-dev)"
fi

# BLIS: libblis-dev ships one flavour's headers (blis-openmp on Debian 12); the ABI is the same
# for all flavours, so link the serial runtime library by path when it is installed.
blis_inc=""
for flavor in blis-serial blis-pthread blis-openmp; do
    if [[ -f "$incdir/$flavor/blis.h" ]]; then
        blis_inc="$incdir/$flavor"
        break
    fi
done
blis_lib=""
for flavor in blis-serial blis-pthread blis-openmp; do
    if [[ -e "$libdir/$flavor/libblis.so.4" ]]; then
        blis_lib="$libdir/$flavor/libblis.so.4"
        break
    fi
done
if [[ -z "$blis_inc" || -z "$blis_lib" ]]; then
    note "skipping blis: no $incdir/blis-*/blis.h or libblis.so.4 (install libblis-dev)"
else
    if [[ "$blis_lib" != */blis-serial/* ]]; then
        note "blis: serial library not found, using $blis_lib forced to 1 thread" \
            "(install libblis4-serial)"
        thread_env[blis]="BLIS_NUM_THREADS=1 OMP_NUM_THREADS=1"
    fi
    build blis -DBACKEND_BLIS -isystem "$blis_inc" "$src" "$blis_lib" \
        -Wl,-rpath,"$(dirname "$blis_lib")" -lm
fi

# oneDNN (OpenMP runtime): the benchmark also calls omp_set_num_threads(1) in every thread.
if [[ -f /usr/include/dnnl.h || -f /usr/include/oneapi/dnnl/dnnl.h ]]; then
    build dnnl -DBACKEND_DNNL "$src" -ldnnl -lgomp
else
    note "skipping dnnl: no /usr/include/dnnl.h (install libdnnl-dev)"
fi

if [[ ${#built[@]} -eq 0 ]]; then
    echo "error: no backend could be built" >&2
    exit 1
fi

# ---- variants: backend + kernel selection -----------------------------------------------------
# Each variant is "backend|env assignments". Both OpenBLAS (DYNAMIC_ARCH) and BLIS pick kernels by
# cpuid and may not know a new CPU: also run the AVX-512 / Zen kernel sets explicitly.
has_avx512=0
grep -qw avx512f /proc/cpuinfo && has_avx512=1
has_avx2=0
grep -qw avx2 /proc/cpuinfo && has_avx2=1

info() {  # info BACKEND ENV... : run --info with the given environment, print its label
    local backend="$1"
    shift
    env "$@" "$tmp/bench_$backend" --info 2>/dev/null | sed -n 's/^label: //p'
}

variants=()
echo
echo "== backends and kernel selection"
for backend in "${built[@]}"; do
    read -r -a base_env <<<"${thread_env[$backend]}"
    env "${base_env[@]}" "$tmp/bench_$backend" --info | sed "s/^/[$backend] /"
    auto_label="$(info "$backend" "${base_env[@]}")"
    case "$backend" in
        openblas | openblas-pt)
            # DYNAMIC_ARCH OpenBLAS may not know a new CPU and fall back to AVX2 kernels: also run
            # the AVX-512 kernels. To save time the pthread build runs only the best kernel set.
            skx=0
            if [[ $has_avx512 == 1 && "$auto_label" != *SkylakeX* && "$auto_label" != *Cooper* &&
                "$auto_label" != *Sapphire* ]]; then
                skx=1
                note "$backend auto-selected '${auto_label#*:}' on an AVX-512 CPU;" \
                    "running OPENBLAS_CORETYPE=SkylakeX too"
            fi
            if [[ $backend == openblas || $skx == 0 ]]; then
                variants+=("$backend|${thread_env[$backend]}")
            fi
            if [[ $skx == 1 ]]; then
                variants+=("$backend|${thread_env[$backend]} OPENBLAS_CORETYPE=SkylakeX")
            fi
            ;;
        blis)
            forced=()
            [[ $has_avx512 == 1 ]] && forced+=(skx)
            [[ $has_avx2 == 1 ]] && forced+=(zen3)
            if [[ "$auto_label" == "blis:generic" && ${#forced[@]} -gt 0 ]]; then
                note "blis auto-selected 'generic' (slow reference kernels: this BLIS does not" \
                    "know the CPU); running forced configs instead: ${forced[*]}"
            else
                variants+=("blis|${thread_env[blis]}")
            fi
            for arch in "${forced[@]}"; do
                [[ "$auto_label" == "blis:$arch" ]] && continue
                if idx="$("$tmp/bench_blis" --blis-arch-index "$arch")" &&
                    [[ -n "$(info blis "${base_env[@]}" BLIS_ARCH_TYPE="$idx")" ]]; then
                    variants+=("blis|${thread_env[blis]} BLIS_ARCH_TYPE=$idx")
                else
                    note "blis config '$arch' is not available in this BLIS build"
                fi
            done
            ;;
        *)
            variants+=("$backend|${thread_env[$backend]}")
            ;;
    esac
done
if [[ -n "${ONLY:-}" ]]; then
    kept=()
    for v in "${variants[@]}"; do
        read -r -a v_env <<<"${v#*|}"
        label="$(info "${v%%|*}" "${v_env[@]}")"
        if [[ "$label" =~ $ONLY ]]; then kept+=("$v"); else note "ONLY: skipping $label"; fi
    done
    variants=("${kept[@]}")
fi
if [[ ${#variants[@]} -eq 0 ]]; then
    echo "error: no variant left to run" >&2
    exit 1
fi

# ---- run ------------------------------------------------------------------------------------------
echo
echo "== running ${#variants[@]} variant(s) x $rounds round(s), min time ${min_time}s per" \
    "measurement (${extra_args[*]:-all shapes})"
status=0
failed=()
start=$SECONDS
for ((round = 0; round < rounds; round++)); do
    for ((n = 0; n < ${#variants[@]}; n++)); do
        # Rotate the order every round so slow drifts of the host do not favour one variant.
        idx=$(((n + round) % ${#variants[@]}))
        backend="${variants[$idx]%%|*}"
        read -r -a run_env <<<"${variants[$idx]#*|}"
        out="$tmp/run_${idx}_${round}.csv"
        args=(--min-time "$min_time")
        if [[ $round == 0 ]]; then
            args+=(--dump "$tmp/dump_$idx.tsv")
        else
            args+=(--stress-calls 0)  # the concurrency stress test runs in round 1 only
        fi
        t0=$SECONDS
        ok=1
        env "${run_env[@]}" "$tmp/bench_$backend" "${args[@]}" "${extra_args[@]}" >"$out" || ok=0
        label="$(sed -n 's/^# label: \([^,]*\),.*/\1/p' "$out")"
        label="${label:-$backend}"
        echo "round $((round + 1))/$rounds: $label ($((SECONDS - t0)) s)"
        grep -E '^# (FAIL|stress|note|[0-9]+ correctness)' "$out" | sed 's/^# /   /' || true
        if [[ $ok == 0 ]]; then
            status=1
            echo "   !! $label (${run_env[*]:-default env}) FAILED correctness checks or crashed"
            [[ " ${failed[*]} " == *" $label "* ]] || failed+=("$label")
        fi
    done
done
echo "total benchmark time: $((SECONDS - start)) s"

# ---- cross-backend check ------------------------------------------------------------------------
echo
echo "== results vs first variant (sampled entries, |diff| / sum|a*b|)"
ref_label="$(sed -n 's/^# label: \([^,]*\),.*/\1/p' "$tmp/run_0_0.csv")"
for ((idx = 1; idx < ${#variants[@]}; idx++)); do
    label="$(sed -n 's/^# label: \([^,]*\),.*/\1/p' "$tmp/run_${idx}_0.csv")"
    printf '%s vs %s: ' "$label" "$ref_label"
    "$tmp/bench_${built[0]}" --compare "$tmp/dump_0.tsv" "$tmp/dump_$idx.tsv" --rtol 1e-5 || status=1
done

# ---- tables -------------------------------------------------------------------------------------
echo
echo "######## GFLOP/s by wall time ########"
"$tmp/bench_${built[0]}" --summarize --metric wall "$tmp"/run_*.csv
echo
echo "######## GFLOP per CPU-second of the measuring thread(s) ########"
echo "(about what a dedicated core gives; prefer these when CPU/wall above is well below 1.0,"
echo "i.e. other processes shared the cores during the run)"
"$tmp/bench_${built[0]}" --summarize --metric cpu "$tmp"/run_*.csv
echo
echo "step-weighted = total flops / total time with each shape counted as often as it runs in"
echo "one training step of a 12-layer model (LM head once)."
if [[ $status != 0 ]]; then
    echo
    echo "CORRECTNESS FAILURES (wrong results, see the round log above) in: ${failed[*]:-see above}"
    echo "Do not use a failing variant from several threads at once."
fi
exit "$status"
