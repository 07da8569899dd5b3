#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install what gpt2-mpi needs, place the
# tinyshakespeare corpus at data/, configure a Release build and build it. Safe to run again.
#   scripts/setup.sh            # everything
#   GPT2_NATIVE=OFF scripts/setup.sh   # portable binaries (no -march=native)
#   GPT2_WITH_PYTHON=1 scripts/setup.sh # also PyTorch/matplotlib/Node (fixtures, benchmarks, plots)
#   GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh # also llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU
#                                          # binary, in .deps/) and NumPy: convert_model's checks
#                                          # and scripts/llama_generate.sh
#   GPT2_WITH_PARQUET=1 scripts/setup.sh   # also DuckDB, parquet-wasm (arrow-rs) and hyparquet (npm,
#                                          # in .deps/parquet): the Parquet fixtures' writers and a
#                                          # third reader for tests/test_parquet.cpp
#   GPT2_WITH_OPENAI_CLIENT=1 scripts/setup.sh  # also the openai npm client (.deps/openai), which
#                                               # tests/test_serve.cpp points at build/serve
#   GPT2_SETUP_DRY_RUN=1 scripts/setup.sh # only print the packages it would install
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git
          libopenmpi-dev openmpi-bin libopenblas-dev libdnnl-dev
          libgtest-dev libgmock-dev libcli11-dev libspdlog-dev libfmt-dev
          nlohmann-json3-dev libpcre2-dev zlib1g-dev libzstd-dev libsnappy-dev libcpp-httplib-dev clang
          libclang-rt-14-dev)
# ip and tc build the simulated hosts of the multi-host tests (skipped without them).
{ command -v ip && command -v tc; } >/dev/null || packages+=(iproute2)
if [[ "${GPT2_WITH_PYTHON:-0}" == "1" ]]; then
  # What is already there counts, wherever it came from: Node from nodesource or nvm conflicts
  # with Debian's npm package, so the commands and modules are checked, not package names.
  for module in torch numpy matplotlib; do
    /usr/bin/python3 -c "import $module" 2>/dev/null || packages+=("python3-$module")
  done
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi
if [[ "${GPT2_WITH_LLAMA_CPP:-0}" == "1" ]]; then
  /usr/bin/python3 -c "import numpy" 2>/dev/null || packages+=(python3-numpy)
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi
if [[ "${GPT2_WITH_OPENAI_CLIENT:-0}" == "1" ]]; then
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi
if [[ "${GPT2_WITH_PARQUET:-0}" == "1" ]]; then
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [[ "${GPT2_SETUP_DRY_RUN:-0}" == "1" ]]; then  # tests: say what would be installed, stop
  echo "setup: would install: ${missing[*]}"
  exit 0
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ "$(id -u)" -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# llama.cpp for the GGUF checks (tests/test_gguf.cpp): the package and its prebuilt linux-x64
# CPU binary only (the CUDA/Vulkan variants are 600 MB more), nothing built or downloaded later.
if [[ "${GPT2_WITH_LLAMA_CPP:-0}" == "1" && ! -d .deps/llama-cpp/node_modules/@node-llama-cpp/linux-x64 ]]; then
  echo "setup: installing node-llama-cpp 3.21.1 into .deps/llama-cpp"
  mkdir -p .deps/llama-cpp
  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix .deps/llama-cpp --no-audit --no-fund \
    --no-save --omit=optional --silent -E node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1
fi

# The official OpenAI client, which tests/test_serve.cpp points at build/serve.
if [[ "${GPT2_WITH_OPENAI_CLIENT:-0}" == "1" && ! -d .deps/openai/node_modules/openai ]]; then
  echo "setup: installing the openai npm client into .deps/openai"
  mkdir -p .deps/openai
  npm install --prefix .deps/openai --no-audit --no-fund --no-save --silent -E openai@4.104.0
fi

# Independent Parquet writers (DuckDB; parquet-wasm, which is arrow-rs) and a third reader
# (hyparquet) for the Parquet checks: dev/make_parquet_fixtures.mjs and tests/test_parquet.cpp.
if [[ "${GPT2_WITH_PARQUET:-0}" == "1" && ! -d .deps/parquet/node_modules/hyparquet-compressors ]]; then
  echo "setup: installing DuckDB, parquet-wasm and hyparquet into .deps/parquet"
  mkdir -p .deps/parquet
  npm install --prefix .deps/parquet --no-audit --no-fund --no-save --silent -E \
    @duckdb/node-api@1.5.6-r.1 parquet-wasm@0.8.0 apache-arrow@21.2.0 hyparquet@1.33.0 \
    hyparquet-compressors@1.1.2
fi

# The corpus: from ../shared/data when this checkout sits beside it, otherwise its public URL.
mkdir -p data
if [[ ! -s data/tinyshakespeare.txt ]]; then
  if [[ -s ../shared/data/tinyshakespeare.txt ]]; then
    cp ../shared/data/tinyshakespeare.txt data/tinyshakespeare.txt
  else
    curl -fsSL -o data/tinyshakespeare.txt \
      https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
  fi
fi
# GPT-2's tokenizer files are optional (for --tokenizer gpt2): copied when ../shared has them.
if [[ ! -s data/gpt2/encoder.json && -s ../shared/data/gpt2/encoder.json ]]; then
  mkdir -p data/gpt2
  cp ../shared/data/gpt2/encoder.json ../shared/data/gpt2/vocab.bpe data/gpt2/
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_NATIVE="${GPT2_NATIVE:-ON}"
cmake --build build -j "$(nproc)"
echo "setup: done. Train: build/train_gpt2   Test: ctest --test-dir build -j\$(nproc) --output-on-failure"
