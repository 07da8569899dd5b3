#!/usr/bin/env bash
# Sanitizer builds: ThreadSanitizer over the threaded tests (build-tsan/), and
# AddressSanitizer + UndefinedBehaviorSanitizer over the unit tests (build-asan/).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)

cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPT2_SANITIZE=thread
cmake --build build-tsan -j "$jobs" --target test_threads test_model_reference
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -R "Thread|Workers|SplitRange"

# AddressSanitizer + UBSan over the whole suite, with leak checking. Open MPI keeps allocations
# in its plugins until exit: keep the plugins loaded and unwind fully so that those leaks are
# attributed to Open MPI (tests/lsan.supp) while our own code stays checked. Full unwinding makes
# every allocation slow, so the suite runs one test per core: most tests are one process that
# waits on that unwinding, and the whole-suite wall time is CI's largest part.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPT2_SANITIZE=address
cmake --build build-asan -j "$jobs"
OMPI_MCA_mca_base_component_disable_dlclose=1 \
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0" \
LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
