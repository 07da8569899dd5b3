#!/usr/bin/env bash
# prepare_data on Parquet against the same documents as JSON Lines: generates a JSON Lines corpus
# of --gb GB (runs of tinyshakespeare's lines, as scripts/bench_prepare.sh does), converts it with
# DuckDB to snappy Parquet (DuckDB's default row groups, 122,880 rows) and to a quarter-size
# Parquet file of its first documents, prepares GPT-2 shards from each and prints throughput and
# peak RSS: Parquet in to shards out beside JSON Lines, and the peak RSS of the two Parquet sizes
# (bounded by a page and a batch, not by the file). Checks that both corpora give the same shards.
#
#   scripts/bench_prepare_parquet.sh [--gb 1] [--threads N] [--work DIR] [--keep]
#
# DuckDB comes from .deps/parquet (GPT2_WITH_PARQUET=1 scripts/setup.sh). Prints figures, asserts
# no timing.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gb=1
threads=$(nproc)
work="${TMPDIR:-/tmp}/gpt2-mpi-bench-parquet"
keep=0
while (($#)); do
  case "$1" in
    --gb) gb=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--gb 1] [--threads N] [--work DIR] [--keep]" >&2; exit 2 ;;
  esac
done
text="$repo/data/tinyshakespeare.txt"
[[ -f "$text" ]] || text="$repo/../shared/data/tinyshakespeare.txt"
gpt2_dir="$repo/data/gpt2"
[[ -f "$gpt2_dir/encoder.json" ]] || gpt2_dir="$repo/../shared/data/gpt2"
[[ -f "$text" && -f "$gpt2_dir/encoder.json" ]] || {
  echo "bench_prepare_parquet.sh: needs tinyshakespeare.txt and the GPT-2 tokenizer (scripts/setup.sh)" >&2
  exit 1
}
[[ -x "$repo/build/prepare_data" ]] || { echo "bench_prepare_parquet.sh: build the project first" >&2; exit 1; }
modules="$repo/.deps/parquet/node_modules"
[[ -d "$modules/@duckdb/node-api" ]] || {
  echo "bench_prepare_parquet.sh: needs DuckDB in $modules (GPT2_WITH_PARQUET=1 scripts/setup.sh)" >&2
  exit 1
}
mkdir -p "$work"
((keep)) || trap 'rm -rf "$work"' EXIT

echo "generating $gb GB of JSON Lines ..."
/usr/bin/python3 - "$text" "$work/corpus.jsonl" "$gb" <<'PY'
import json, random, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
target = int(float(sys.argv[3]) * 1e9)
rng = random.Random(1)
written = 0
with open(sys.argv[2], "w", encoding="utf-8") as out:
    while written < target:
        block = []
        for _ in range(256):
            start = rng.randrange(len(lines) - 100)
            doc = "\n".join(lines[start:start + rng.randrange(20, 100)])
            block.append(json.dumps({"text": doc}, ensure_ascii=False))
        chunk = "\n".join(block) + "\n"
        out.write(chunk)
        written += len(chunk.encode("utf-8"))
PY
documents=$(wc -l < "$work/corpus.jsonl")
head -n $((documents / 4)) "$work/corpus.jsonl" > "$work/quarter.jsonl"

echo "converting to Parquet with DuckDB (snappy) ..."
MODULES="$modules" WORK="$work" node --input-type=module - <<'JS'
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
const require = createRequire(join(process.env.MODULES, "package.json"));
const { DuckDBInstance } = await import(pathToFileURL(require.resolve("@duckdb/node-api")).href);
const db = await DuckDBInstance.create(":memory:");
const c = await db.connect();
await c.run("SET preserve_insertion_order = true");
for (const name of ["corpus", "quarter"]) {
  const from = join(process.env.WORK, `${name}.jsonl`), to = join(process.env.WORK, `${name}.parquet`);
  await c.run(`COPY (SELECT text FROM read_json('${from}', format = 'newline_delimited', columns = {text: 'VARCHAR'}, maximum_object_size = 100000000)) TO '${to}' (FORMAT parquet, COMPRESSION snappy)`);
  const [m] = (await c.runAndReadAll(`SELECT count(DISTINCT row_group_id) AS groups, max(row_group_num_rows) AS rows, max(total_compressed_size) AS chunk FROM parquet_metadata('${to}')`)).getRowObjectsJson();
  console.log(`${name}.parquet: ${m.groups} row groups of up to ${m.rows} rows, column chunks of up to ${(Number(m.chunk) / 1e6).toFixed(1)} MB`);
}
JS

run() {  # NAME INPUT: prepares INPUT into $work/NAME, prints "MB/s peak_RSS_GiB"
  rm -rf "$work/$1"
  /usr/bin/time -v "$repo/build/prepare_data" --data "$2" --name c --tokenizer gpt2 \
    --tokenizer-dir "$gpt2_dir" --out-dir "$work/$1" --threads "$threads" \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log" >&2; exit 1; }
  local summary rss_kb
  summary=$(grep "prepared " "$work/$1.log")
  rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$work/$1.log")
  echo "$(sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary") $(awk -v k="$rss_kb" 'BEGIN{printf "%.2f", k/1048576}')"
}
echo "prepare_data, $threads threads: JSON Lines, Parquet, quarter-size Parquet ..."
read -r jsonl_mbs jsonl_rss < <(run jsonl "$work/corpus.jsonl")
read -r parquet_mbs parquet_rss < <(run parquet "$work/corpus.parquet")
read -r quarter_mbs quarter_rss < <(run quarter "$work/quarter.parquet")
same=yes
for f in "$work"/jsonl/*.bin; do
  cmp -s "$f" "$work/parquet/$(basename "$f")" || same=no
done

cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
echo
grep "prepared " "$work/parquet.log"
echo "corpus $gb GB of text, $documents documents, GPT-2 tokenizer, $(nproc) cores, $cpu"
printf '%-40s %12s %10s %12s\n' "input" "stored MB" "MB/s" "peak RSS"
printf '%-40s %12.0f %10s %8s GiB\n' "JSON Lines" "$(($(stat -c %s "$work/corpus.jsonl") / 1000000))" "$jsonl_mbs" "$jsonl_rss"
printf '%-40s %12.0f %10s %8s GiB\n' "Parquet (snappy)" "$(($(stat -c %s "$work/corpus.parquet") / 1000000))" "$parquet_mbs" "$parquet_rss"
printf '%-40s %12.0f %10s %8s GiB\n' "Parquet, its first quarter" "$(($(stat -c %s "$work/quarter.parquet") / 1000000))" "$quarter_mbs" "$quarter_rss"
printf 'Parquet / JSON Lines throughput: %.2f; shards identical: %s\n' \
  "$(awk -v a="$parquet_mbs" -v b="$jsonl_mbs" 'BEGIN{print a/b}')" "$same"
