#!/usr/bin/env bash
# Generation speed of build/inference (KV cache) against PyTorch incremental generation with the
# same GPT-2 124M-shaped random weights, at a 64- and a 512-token context: prefill the prompt, then
# generate NEW_TOKENS greedily; reports tokens/s and ms/token of the generation phase (prefill
# excluded, best of REPS runs: the machine is shared) and whether all produced the same tokens.
# PyTorch runs twice: "tuned" (addmv and bmm for one-token steps, its fast CPU paths) and "hf"
# (F.linear and matmul throughout, as transformers' GPT-2 does). Ours also runs with
# --weights bf16 and --weights int8 (compact matrices for decoding); a second table compares them
# with ours in fp32 (WEIGHTS="fp32" skips them).
#
#   dev/bench_inference.sh   # env: THREADS=2 NEW_TOKENS=64 CONTEXTS="64 512" REPS=3
#                                #      WEIGHTS="fp32 bf16 int8"
#                                #      MODEL=/tmp/gpt2_random_124M.bin BUILD=build
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
python=${PYTHON:-/usr/bin/python3}
model=${MODEL:-/tmp/gpt2_random_124M.bin}
tokenizer_dir=${TOKENIZER_DIR:-$root/../shared/data/gpt2}
threads=${THREADS:-2}
new_tokens=${NEW_TOKENS:-64}
contexts=${CONTEXTS:-64 512}
reps=${REPS:-3}
weights=${WEIGHTS:-fp32 bf16 int8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -f $tokenizer_dir/encoder.json || ! -f $tokenizer_dir/vocab.bpe ]]; then
    echo "bench_inference: GPT-2's encoder.json and vocab.bpe are not in $tokenizer_dir" \
        "(set TOKENIZER_DIR)" >&2
    exit 1
fi
if [[ ! -f $model ]]; then
    echo "writing random GPT-2 124M weights to $model" >&2
    "$python" "$root/dev/bench_inference_pytorch.py" --write-random "$model"
fi
ninja -C "$build" inference >/dev/null

# The prompt is " the" repeated: one GPT-2 token (262) each, so N repetitions are N tokens.
for ctx in $contexts; do
    printf ' the%.0s' $(seq "$ctx") >"$work/prompt_$ctx.txt"
done
: >"$work/pytorch.jsonl"
# Interleaved (ours, then each PyTorch variant, per context and repetition) so that load from
# other jobs on the machine hits all of them alike; the best repetition of each is reported.
for rep in $(seq "$reps"); do
    for ctx in $contexts; do
        echo "run $rep/$reps, context $ctx: ours" >&2
        "$build/inference" "$model" --tokenizer gpt2 --tokenizer-dir "$tokenizer_dir" \
            --prompt-file "$work/prompt_$ctx.txt" --max-new-tokens "$new_tokens" \
            --temperature 0 --threads "$threads" --no-stream >"$work/ours_$ctx.out" \
            2>"$work/ours.err"
        # The log line is "[HH:MM:SS] stats: sample=1 prompt_tokens=... ..."
        grep -o 'stats: .*' "$work/ours.err" >>"$work/ours_$ctx.stats"
        for fmt in $weights; do
            [[ $fmt == fp32 ]] && continue
            echo "run $rep/$reps, context $ctx: ours --weights $fmt" >&2
            "$build/inference" "$model" --tokenizer gpt2 --tokenizer-dir "$tokenizer_dir" \
                --prompt-file "$work/prompt_$ctx.txt" --max-new-tokens "$new_tokens" \
                --temperature 0 --threads "$threads" --no-stream --weights "$fmt" \
                >"$work/ours_${fmt}_$ctx.out" 2>"$work/ours.err"
            grep -o 'stats: .*' "$work/ours.err" >>"$work/ours_${fmt}_$ctx.stats"
        done
        for variant in tuned hf; do
            echo "run $rep/$reps, context $ctx: pytorch $variant" >&2
            "$python" "$root/dev/bench_inference_pytorch.py" --model "$model" \
                --contexts "$ctx" --variants "$variant" --new-tokens "$new_tokens" \
                --threads "$threads" >>"$work/pytorch.jsonl"
        done
    done
done

# shellcheck disable=SC2086
"$python" - "$work" "$tokenizer_dir" "$threads" "$new_tokens" "$reps" "$weights" $contexts <<'EOF'
import json, os, sys

work, tokenizer_dir, threads, new_tokens, reps, weights = sys.argv[1:7]
contexts = [int(c) for c in sys.argv[7:]]
formats = [f for f in weights.split() if f != "fp32"]

# GPT-2's byte <-> printable-character table, to turn PyTorch's token ids back into bytes.
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
to_char = {b: chr(b) for b in printable}
extra = 0
for b in range(256):
    if b not in to_char:
        to_char[b] = chr(256 + extra)
        extra += 1
to_byte = {c: b for b, c in to_char.items()}
with open(os.path.join(tokenizer_dir, "encoder.json"), encoding="utf-8") as f:
    id_to_text = {i: t for t, i in json.load(f).items()}

def decode(ids):
    return b"".join(bytes(to_byte[c] for c in id_to_text[i]) for i in ids)

def best(runs):
    return min(runs, key=lambda r: r["ms_per_token"])

torch_runs = {}
with open(os.path.join(work, "pytorch.jsonl")) as f:
    for line in f:
        r = json.loads(line)
        torch_runs.setdefault((r["variant"], r["context"]), []).append(r)

rows = []
def ours_best(stats_name):
    with open(os.path.join(work, stats_name)) as f:
        runs = [dict(kv.split("=") for kv in line.split()[1:]) for line in f if line.strip()]
    return best([{k: float(v) for k, v in r.items()} for r in runs])

for ctx in contexts:
    ours = ours_best(f"ours_{ctx}.stats")
    prompt = open(os.path.join(work, f"prompt_{ctx}.txt"), "rb").read()
    out = open(os.path.join(work, f"ours_{ctx}.out"), "rb").read()
    ours_text = out[len(prompt):-1] if out.startswith(prompt) else out
    tuned, hf = best(torch_runs[("tuned", ctx)]), best(torch_runs[("hf", ctx)])
    # inference prints valid UTF-8 only (ill-formed bytes as U+FFFD, as Python's "replace" does)
    same = all(decode(r["tokens"]).decode("utf-8", "replace").encode() == ours_text
               for v in ("tuned", "hf") for r in torch_runs[(v, ctx)])
    rows.append((ctx, ours, tuned, hf, same))

print(f"GPT-2 124M shape (L12 H12 C768 V50257), random weights, {threads} threads, greedy, "
      f"{new_tokens} new tokens, best of {reps}; tok/s and ms/tok of the generation phase")
print(f"{'context':>7} | {'ours tok/s':>10} {'ms/tok':>7} {'prefill':>8} | "
      f"{'torch tuned':>11} {'ms/tok':>7} {'prefill':>8} {'ratio':>6} | "
      f"{'torch hf':>8} {'ms/tok':>7} {'ratio':>6} | same tokens")
for ctx, o, t, h, same in rows:
    note = "" if int(o["prompt_tokens"]) == ctx else f" (prompt {int(o['prompt_tokens'])} tokens)"
    print(f"{ctx:>7} | {o['tokens_per_s']:>10.1f} {o['ms_per_token']:>7.2f} "
          f"{o['prefill_ms']:>6.0f}ms | {t['tokens_per_s']:>11.1f} {t['ms_per_token']:>7.2f} "
          f"{t['prefill_ms']:>6.0f}ms {o['tokens_per_s'] / t['tokens_per_s']:>5.2f}x | "
          f"{h['tokens_per_s']:>8.1f} {h['ms_per_token']:>7.2f} "
          f"{o['tokens_per_s'] / h['tokens_per_s']:>5.2f}x | {'yes' if same else 'NO'}{note}")
if len(rows) > 1:
    (c0, o0, t0, h0, _), (c1, o1, t1, h1, _) = rows[0], rows[-1]
    print(f"per-token cost from context {c0} to {c1}: ours x{o1['ms_per_token'] / o0['ms_per_token']:.2f}, "
          f"torch tuned x{t1['ms_per_token'] / t0['ms_per_token']:.2f}, "
          f"torch hf x{h1['ms_per_token'] / h0['ms_per_token']:.2f}")
if formats:
    print()
    print("ours with compact weights for decoding (--weights), same runs: tok/s of the generation "
          "phase and the ratio to ours in fp32")
    print(f"{'context':>7} | {'fp32':>8} | " + " | ".join(
        f"{f:>6} tok/s  ratio  same text as fp32" for f in formats))
    for ctx, o, _, _, _ in rows:
        fp32_out = open(os.path.join(work, f"ours_{ctx}.out"), "rb").read()
        cells = []
        for f in formats:
            c = ours_best(f"ours_{f}_{ctx}.stats")
            same = open(os.path.join(work, f"ours_{f}_{ctx}.out"), "rb").read() == fp32_out
            cells.append(f"{c['tokens_per_s']:>12.1f} {c['tokens_per_s'] / o['tokens_per_s']:>5.2f}x "
                         f" {'yes' if same else 'no (random weights: near-ties)':>17}")
        print(f"{ctx:>7} | {o['tokens_per_s']:>8.1f} | " + " | ".join(cells))
EOF
