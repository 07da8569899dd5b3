#!/usr/bin/env bash
# Compares GPT-2 encoding speed (MB/s) of our tokenizer (build/bench_tokenizer) with js-tiktoken's
# on the same text, and times BPE training to 4096 tokens.
#
#   dev/bench_tokenizer.sh [BUILD_DIR] [TEXT_FILE] [GPT2_DIR]
#
# js-tiktoken is installed with npm into $TOKREF_DIR (default: a temp dir) when it is missing.
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
text="${2:-}"
gpt2_dir="${3:-}"
if [[ -z "$text" ]]; then
  text="$repo/data/tinyshakespeare.txt"
  [[ -f "$text" ]] || text="$repo/../shared/data/tinyshakespeare.txt"
fi
if [[ -z "$gpt2_dir" ]]; then
  gpt2_dir="$repo/data/gpt2"
  [[ -f "$gpt2_dir/encoder.json" ]] || gpt2_dir="$repo/../shared/data/gpt2"
fi
[[ -f "$text" ]] || { echo "bench_tokenizer.sh: no text file: $text" >&2; exit 1; }
[[ -f "$gpt2_dir/encoder.json" ]] || {
  echo "bench_tokenizer.sh: no GPT-2 tokenizer in $gpt2_dir (run scripts/get_gpt2_tokenizer.sh)" >&2
  exit 1
}
[[ -x "$build/bench_tokenizer" ]] || {
  echo "bench_tokenizer.sh: $build/bench_tokenizer is missing; build the project first" >&2
  exit 1
}

echo "== ours (C++, PCRE2) =="
"$build/bench_tokenizer" --input "$text" --tokenizer-dir "$gpt2_dir" --repeat 5 --threads 2

echo "== js-tiktoken (node $(node --version)) =="
tokref="${TOKREF_DIR:-${TMPDIR:-/tmp}/gpt2-mpi-tokref}"
if [[ ! -d "$tokref/node_modules/js-tiktoken" ]]; then
  mkdir -p "$tokref"
  npm install --prefix "$tokref" --no-audit --no-fund --silent js-tiktoken@1.0.21 >&2
fi
TOKREF="$tokref" node --input-type=module - "$text" <<'JS'
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
const require = createRequire(join(process.env.TOKREF, "package.json"));
const { getEncoding } = require("js-tiktoken");
const bytes = readFileSync(process.argv[2]);
const text = bytes.toString("utf8");
let start = performance.now();
const encoding = getEncoding("gpt2");
console.log(`gpt2 load: ${((performance.now() - start) / 1000).toFixed(3)} s`);
let best = Infinity;
let count = 0;
for (let i = 0; i < 5; i++) {
  start = performance.now();
  count = encoding.encode(text, "all").length;
  best = Math.min(best, (performance.now() - start) / 1000);
}
const mb = bytes.length / 1e6;
console.log(`gpt2 encode, 1 thread: ${(mb / best).toFixed(2)} MB/s (${count} tokens in ${best.toFixed(3)} s)`);
JS
