#!/usr/bin/env bash
# prepare_data on a corpus larger than it should hold in memory: generates a JSON Lines corpus of
# --gb GB (documents are runs of tinyshakespeare's lines), prepares GPT-2 shards from it and
# prints throughput and peak RSS, next to js-tiktoken encoding the corpus's first 50 MB of
# documents the way llm.c's data scripts do with tiktoken (each document: EOT + encode_ordinary),
# measured in the same run.
#
#   dev/bench_prepare.sh [--gb 2] [--threads N] [--work DIR] [--keep]
#
# js-tiktoken is installed with npm into $TOKREF_DIR (default: a temp dir) when it is missing.
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gb=2
threads=$(nproc)
work="${TMPDIR:-/tmp}/gpt2-mpi-bench-prepare"
keep=0
while (($#)); do
  case "$1" in
    --gb) gb=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--gb 2] [--threads N] [--work DIR] [--keep]" >&2; exit 2 ;;
  esac
done
# shellcheck source=dev/bench_corpus.sh
source "$repo/dev/bench_corpus.sh"
bench_corpus_inputs "$repo" bench_prepare.sh
mkdir -p "$work"
corpus="$work/corpus.jsonl"
((keep)) || trap 'rm -rf "$work"' EXIT

echo "generating $gb GB of JSON Lines in $corpus ..."
bench_corpus_generate "$gb" "$corpus"

rm -rf "$work/shards"
echo "prepare_data, $threads threads ..."
/usr/bin/time -v "$repo/build/prepare_data" --input "$corpus" --tokenizer gpt2 \
  --tokenizer-dir "$gpt2_dir" --out-dir "$work/shards" --threads "$threads" \
  > "$work/prepare.log" 2>&1 || { cat "$work/prepare.log" >&2; exit 1; }
summary=$(grep "prepared " "$work/prepare.log")
ours=$(sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary")
rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$work/prepare.log")

echo "js-tiktoken, 1 thread, first 50 MB of documents ..."
tokref="${TOKREF_DIR:-${TMPDIR:-/tmp}/gpt2-mpi-tokref}"
if [[ ! -d "$tokref/node_modules/js-tiktoken" ]]; then
  mkdir -p "$tokref"
  npm install --prefix "$tokref" --no-audit --no-fund --silent js-tiktoken@1.0.21 >&2
fi
theirs=$(TOKREF="$tokref" node --input-type=module - "$corpus" <<'JS'
import { openSync, readSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
const require = createRequire(join(process.env.TOKREF, "package.json"));
const { getEncoding } = require("js-tiktoken");
const buffer = Buffer.alloc(50e6);
const got = readSync(openSync(process.argv[2], "r"), buffer, 0, buffer.length, 0);
const lines = buffer.subarray(0, got).toString("utf8").split("\n");
lines.pop();  // maybe cut short
const documents = lines.map((line) => JSON.parse(line).text);
const encoding = getEncoding("gpt2");
const eot = 50256;
const start = performance.now();
let bytes = 0, tokens = 0;
for (const text of documents) {
  const ids = [eot, ...encoding.encode(text, [], [])];  // llm.c: [eot] + encode_ordinary
  tokens += ids.length;
  bytes += Buffer.byteLength(text);
}
const seconds = (performance.now() - start) / 1000;
console.log((bytes / 1e6 / seconds).toFixed(2));
JS
)

cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
echo
echo "$summary"
echo "corpus $gb GB JSON Lines, GPT-2 tokenizer, $(nproc) cores, $cpu"
printf '%-44s %10s %14s\n' "preparation" "MB/s" "peak RSS"
printf '%-44s %10s %11.2f GiB\n' "prepare_data, $threads threads" "$ours" "$(awk -v k="$rss_kb" 'BEGIN{print k/1048576}')"
printf '%-44s %10s %14s\n' "js-tiktoken, 1 thread (llm.c: 1 per core)" "$theirs" "-"
printf 'ours / js-tiktoken per thread: %.1fx\n' "$(awk -v a="$ours" -v b="$theirs" -v t="$threads" 'BEGIN{print a/t/b}')"
