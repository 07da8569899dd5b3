#!/usr/bin/env bash
# prepare_data on Parquet against the same documents as JSON Lines: generates a JSON Lines corpus
# of --gb GB (runs of tinyshakespeare's lines, as dev/bench_prepare.sh does) and converts it
# with DuckDB to snappy Parquet in row groups of 2,048 rows (about FineWeb's layout: small pages),
# also as a quarter-size file of its first documents, and in DuckDB's default row groups of
# 122,880 rows (pages of about 100 MB). Prepares GPT-2 shards from each and prints throughput, CPU
# seconds and peak RSS: Parquet in to shards out beside JSON Lines, and the peak RSS of the two
# sizes of the same layout (bounded by a page, a batch and the shard buffers, not by the file;
# every run writes shards of 5M tokens, which both sizes fill). Checks that JSON Lines and Parquet
# give the same shards. On a machine shared with other work, JSON Lines and the small-row-group Parquet run
# alternately --repeat times and each reports its best throughput (and that run's CPU seconds,
# user + system, which contention disturbs less than the clock).
#
#   dev/bench_prepare_parquet.sh [--gb 1] [--threads N] [--repeat 2] [--work DIR] [--keep]
#
# DuckDB comes from .deps/parquet (GPT2_WITH_PARQUET=1 scripts/setup.sh). Prints figures, asserts
# no timing.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gb=1
threads=$(nproc)
work="${TMPDIR:-/tmp}/gpt2-mpi-bench-parquet"
keep=0
repeat=2
while (($#)); do
  case "$1" in
    --gb) gb=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--gb 1] [--threads N] [--repeat 2] [--work DIR] [--keep]" >&2; exit 2 ;;
  esac
done
# shellcheck source=dev/bench_corpus.sh
source "$repo/dev/bench_corpus.sh"
bench_corpus_inputs "$repo" bench_prepare_parquet.sh
modules="$repo/.deps/parquet/node_modules"
[[ -d "$modules/@duckdb/node-api" ]] || {
  echo "bench_prepare_parquet.sh: needs DuckDB in $modules (GPT2_WITH_PARQUET=1 scripts/setup.sh)" >&2
  exit 1
}
mkdir -p "$work"
((keep)) || trap 'rm -rf "$work"' EXIT

echo "generating $gb GB of JSON Lines ..."
bench_corpus_generate "$gb" "$work/corpus.jsonl"
documents=$(wc -l < "$work/corpus.jsonl")
head -n $((documents / 4)) "$work/corpus.jsonl" >"$work/quarter.jsonl"

echo "converting to Parquet with DuckDB (snappy) ..."
MODULES="$modules" WORK="$work" node --input-type=module - <<'JS'
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
const require = createRequire(join(process.env.MODULES, "package.json"));
const { DuckDBInstance } = await import(pathToFileURL(require.resolve("@duckdb/node-api")).href);
const db = await DuckDBInstance.create(":memory:");
const c = await db.connect();
for (const [from, to, groups] of [["corpus", "small_groups", 2048], ["quarter", "quarter", 2048],
                                  ["corpus", "default_groups", 0]]) {
  const source = join(process.env.WORK, `${from}.jsonl`), target = join(process.env.WORK, `${to}.parquet`);
  await c.run(`COPY (SELECT text FROM read_json('${source}', format = 'newline_delimited', columns = {text: 'VARCHAR'}, maximum_object_size = 100000000)) TO '${target}' (FORMAT parquet, COMPRESSION snappy${groups ? `, ROW_GROUP_SIZE ${groups}` : ""})`);
  const [m] = (await c.runAndReadAll(`SELECT count(DISTINCT row_group_id) AS groups, max(row_group_num_rows) AS rows, max(total_compressed_size) AS chunk FROM parquet_metadata('${target}')`)).getRowObjectsJson();
  console.log(`${to}.parquet: ${m.groups} row groups of up to ${m.rows} rows, column chunks of up to ${(Number(m.chunk) / 1e6).toFixed(1)} MB`);
}
JS

run() {  # NAME INPUT: prepares INPUT into $work/NAME, prints "MB/s peak_RSS_GiB cpu_seconds"
  rm -rf "$work/$1"
  /usr/bin/time -v "$repo/build/prepare_data" --data "$2" --name c --tokenizer gpt2 \
    --tokenizer-dir "$gpt2_dir" --out-dir "$work/$1" --threads "$threads" \
    --shard-tokens 5000000 > "$work/$1.log" 2>&1 || { cat "$work/$1.log" >&2; exit 1; }
  local summary rss_kb cpu
  summary=$(grep "prepared " "$work/$1.log")
  rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$work/$1.log")
  cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.1f", s}' "$work/$1.log")
  echo "$(sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary") $(awk -v k="$rss_kb" 'BEGIN{printf "%.2f", k/1048576}') $cpu"
}
best() {  # keeps the run with the higher MB/s: best CURRENT NEW
  awk -v a="$1" -v b="$2" 'BEGIN{split(a, x, " "); split(b, y, " "); print (a == "" || y[1] > x[1]) ? b : a}'
}
echo "prepare_data, $threads threads, $repeat x (JSON Lines, Parquet), then two more Parquet files ..."
jsonl="" parquet=""
for ((i = 0; i < repeat; ++i)); do
  result=$(run jsonl "$work/corpus.jsonl")  # a failed run stops the script (set -e)
  jsonl=$(best "$jsonl" "$result")
  result=$(run parquet "$work/small_groups.parquet")
  parquet=$(best "$parquet" "$result")
done
quarter=$(run quarter "$work/quarter.parquet")
default=$(run default "$work/default_groups.parquet")
same=yes
for f in "$work"/jsonl/*.bin; do
  cmp -s "$f" "$work/parquet/$(basename "$f")" || same=no
  cmp -s "$f" "$work/default/$(basename "$f")" || same=no
done

cpu="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
row() {  # LABEL FILE "MB/s RSS CPU"
  local mbs rss cpu_s
  read -r mbs rss cpu_s <<<"$3"
  printf '%-44s %9d %7s %7s %8s GiB\n' "$1" "$(($(stat -c %s "$2") / 1000000))" "$mbs" "$cpu_s" "$rss"
}
echo
echo "corpus: $gb GB of text, $documents documents; GPT-2 tokenizer, $threads threads; $(nproc) cores, $cpu"
printf '%-44s %9s %7s %7s %12s\n' "input" "stored MB" "MB/s" "CPU s" "peak RSS"
row "JSON Lines" "$work/corpus.jsonl" "$jsonl"
row "Parquet, row groups of 2,048 rows" "$work/small_groups.parquet" "$parquet"
row "the same, its first quarter" "$work/quarter.parquet" "$quarter"
row "Parquet, DuckDB's default row groups" "$work/default_groups.parquet" "$default"
printf 'Parquet / JSON Lines: throughput %.2f, CPU seconds %.2f; shards identical: %s\n' \
  "$(awk -v a="${parquet%% *}" -v b="${jsonl%% *}" 'BEGIN{print a/b}')" \
  "$(awk -v a="${parquet##* }" -v b="${jsonl##* }" 'BEGIN{print a/b}')" "$same"
