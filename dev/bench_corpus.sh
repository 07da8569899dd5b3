# shellcheck shell=bash
# Sourced by dev/bench_prepare.sh and dev/bench_prepare_parquet.sh: the inputs both need and the
# JSON Lines corpus both generate (documents are runs of tinyshakespeare's lines, seed 1).

# Sets `text` and `gpt2_dir` (repo $1's data/, else ../shared/data/); exits 1 naming the script
# ($2) when they or build/prepare_data are missing.
bench_corpus_inputs() {
  local repo=$1 script=$2
  text="$repo/data/tinyshakespeare.txt"
  [[ -f "$text" ]] || text="$repo/../shared/data/tinyshakespeare.txt"
  gpt2_dir="$repo/data/gpt2"
  [[ -f "$gpt2_dir/encoder.json" ]] || gpt2_dir="$repo/../shared/data/gpt2"
  [[ -f "$text" && -f "$gpt2_dir/encoder.json" ]] || {
    echo "$script: needs tinyshakespeare.txt and the GPT-2 tokenizer (scripts/setup.sh)" >&2
    exit 1
  }
  [[ -x "$repo/build/prepare_data" ]] || { echo "$script: build the project first" >&2; exit 1; }
}

# Writes about $1 GB of JSON Lines documents to $2, from `text`.
bench_corpus_generate() {
  /usr/bin/python3 - "$text" "$2" "$1" <<'PY'
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
}
