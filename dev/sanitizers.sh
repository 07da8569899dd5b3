#!/usr/bin/env bash
# Sanitizer builds: ThreadSanitizer over the threaded tests (build-tsan/), and
# AddressSanitizer + UndefinedBehaviorSanitizer over the tests that exercise memory (build-asan/).
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OPENBLAS_CORETYPE  # the kernels a user of this CPU gets (src/ops/gemm.hpp), not inherited ones
jobs=$(nproc)

# -O1 -g1: a third of -O2 -g's compile time under the sanitizers (the builds are most of CI's time),
# and line tables are all a report needs.
flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
# The AddressSanitizer build uses clang, the compiler dev/fuzz.sh builds with: it compiles an
# ASan-instrumented file in two thirds of GCC's time (test_mpi_training.cpp: 22.6 s against
# 32.3 s). ThreadSanitizer stays on GCC: no faster with clang, and clang 14's runtime hangs
# threads.ThreadPoolStart's refused thread start.
asan_compilers=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
# ThreadSanitizer: the pool and the layer-by-layer reduction, the threaded step against PyTorch,
# the shared-memory step in one process, and train_gpt2 under mpiexec with two workers per rank
# beside the communication thread (buckets, shared memory, slices in buckets across simulated
# machines). Open MPI's libraries are not instrumented; tests/tsan.supp holds the reports inside
# them, nothing else.
cmake -S . -B build-tsan "${flags[@]}" -DGPT2_SANITIZE=thread
cmake --build build-tsan -j "$jobs" --target test_threads test_model_reference test_shared_memory \
  test_threaded_step test_lora_training test_muon test_llama_reference train_gpt2
# With the CPU's own OpenBLAS kernels, and where it has AVX-512 with the AVX2 family as well: the
# -O1 build's summation orders differ from the Release build's.
tsan_families=("")
grep -qw avx512f /proc/cpuinfo && tsan_families+=(Haswell)
for family in "${tsan_families[@]}"; do
  GPT2_OPENBLAS_CORETYPE="$family" \
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" \
    -R "^threads\.|^muon\.|^llama_reference\.|^model_reference\.Workers|^shared_memory\.SharedReplica|^threaded_step\.|^lora_training\.LoraReplica\."
done

# AddressSanitizer + UBSan, with leak checking, over the tests that exercise memory: every test
# of the code in-process (kernels, model, formats, tokenizers, parsers, data, threads) and the
# program runs that take each program through its paths (training on one rank and on several
# with shared memory, ZeRO-1 and buckets, resume, LoRA, inference, prepare_data, convert_model).
# Left to the ordinary suite, because their programs' paths are run under ASan by the tests
# above: the command-line refusals and bad inputs (the programs stop at the first check), the
# signal, kill and simulated-host scenarios, the scripts, the install, the README's commands, and
# the runs of llama.cpp (node) and of long trainings (a bf16 char model to its loss, a Hugging
# Face model trained) -- half the ASan time for none of its coverage (docs/development.md).
# Open MPI keeps allocations in its plugins until exit: the plugins stay loaded, and the
# processes that start MPI record full allocation stacks (src/parallel/comm.cpp asks for it), so
# that those leaks are attributed to Open MPI (tests/lsan.supp) while our own code stays checked.
# Full stacks make allocation several times slower: the three program-heavy test sets run without
# leak checking (tests/CMakeLists.txt), and the suite runs one test per core.
asan_left_out='^(quick_start|readme|scripts|install|multihost|faults|command_line|bad_input)\.'
asan_left_out+='|^convert_model\.ConvertModel\.TrainingAndInferenceStartFromAHuggingFaceDirectory$'
asan_left_out+='|^precision\.Precision\.Bf16CharModelReachesTheFp32ValidationLossWithinTwoPercent$'
asan_left_out+='|^gguf\.LlamaCpp\.|^lora_export\.LoraExport\.LlamaCpp|^lora_llama\.LlamaLora\.LlamaCpp'
asan_left_out+='|^digits_pretokenizer\.DigitsPretokenizer\.LlamaCpp'
# Refusal tables of the training program (each case stops at its first check; the runs before
# them are the other tests' runs): 32 s of the stage for no path of its own.
asan_left_out+='|^lora_training\.LoraTraining\.(UnsupportedCombinationsAndBadValuesAreRefused'
asan_left_out+='NamingTheFlags|AResumeThatContradictsTheLoraStateIsRefusedNamingWhatDiffers)$'
asan_left_out+='|^loss_mask\.TrainLossMask\.RefusesMissingAndMismatchedMasks$'
asan_left_out+='|_NOT_BUILT'
cmake -S . -B build-asan "${flags[@]}" "${asan_compilers[@]}" -DGPT2_SANITIZE=address
# The programs and the test programs whose tests run here (the others are not built).
asan_targets=(train_gpt2 inference prepare_data convert_model serve)
for test_source in tests/test_*.cpp; do
  name=$(basename "$test_source" .cpp)
  case "$name" in
    test_quick_start | test_readme | test_scripts | test_install | test_multihost | test_faults | \
      test_command_line | test_bad_input) ;;
    *) asan_targets+=("$name") ;;
  esac
done
cmake --build build-asan -j "$jobs" --target "${asan_targets[@]}"
OMPI_MCA_mca_base_component_disable_dlclose=1 \
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -E "$asan_left_out"
