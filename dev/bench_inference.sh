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
# A last table sets the prompt (prefill) time and the decoding speed after it against llama.cpp
# (node-llama-cpp's prebuilt CPU binary, dev/llama_speed.mjs) on GGUF files convert_model
# writes from the same model: ours fp32 against F32, bf16 against BF16, int8 against Q8_0. Both
# sides run three prompts in one process (ours as --num-samples 3) and count the last two (warm);
# medians over REPS, the runs interleaved; ours' first prompt (cold: oneDNN creates its kernels
# for the prompt's shapes) is shown apart. LLAMA=0 skips it, PYTORCH=0 the PyTorch tables.
#
#   dev/bench_inference.sh   # env: THREADS=2 NEW_TOKENS=64 CONTEXTS="64 512" REPS=3
#                                #      WEIGHTS="fp32 bf16 int8" PYTORCH=1 LLAMA=1
#                                #      MODEL=/tmp/gpt2_random_124M.bin BUILD=build
#                                #      LLAMA_MODULES=.deps/llama-cpp/node_modules
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
pytorch=${PYTORCH:-1}
llama=${LLAMA:-1}
llama_modules=${LLAMA_MODULES:-$root/.deps/llama-cpp/node_modules}
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
ninja -C "$build" inference convert_model >/dev/null
# GPT-2's tokenizer files for a model file without a tokenizer (the random llm.c file); a
# checkpoint of train_gpt2 (any architecture: MODEL=out/model_000001.bin of --model llama-135M
# --tokenizer gpt2) carries its own.
tokenizer_flags=(--tokenizer gpt2 --tokenizer-dir "$tokenizer_dir")
if "$build/inference" "$model" --prompt " the" --max-new-tokens 1 --threads 1 --log-level error \
    >/dev/null 2>&1; then
    tokenizer_flags=()
fi
if [[ $llama == 1 ]]; then
    if ! command -v node >/dev/null || [[ ! -d $llama_modules/node-llama-cpp ]]; then
        echo "bench_inference: node or node-llama-cpp (in $llama_modules) is missing: set" \
            "LLAMA_MODULES, install it with GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh, or LLAMA=0" >&2
        exit 1
    fi
    # The GGUF files llama.cpp reads, written once beside the model: ours fp32 -> F32,
    # bf16 -> BF16, int8 -> Q8_0.
    for fmt in $weights; do
        case $fmt in fp32) dtype=f32 ;; bf16) dtype=bf16 ;; int8) dtype=q8_0 ;; esac
        gguf=${model%.bin}_$dtype.gguf
        if [[ ! -f $gguf ]]; then
            echo "writing $gguf" >&2
            "$build/convert_model" "$model" "$gguf" --dtype "$dtype" \
                "${tokenizer_flags[@]:2}" >/dev/null 2>"$work/convert.err" ||
                { cat "$work/convert.err" >&2; exit 1; }
        fi
    done
fi

# The prompt is " the" repeated: one GPT-2 token (262) each, so N repetitions are N tokens.
for ctx in $contexts; do
    printf ' the%.0s' $(seq "$ctx") >"$work/prompt_$ctx.txt"
done
: >"$work/pytorch.jsonl"
# Interleaved (ours, then each PyTorch variant, per context and repetition) so that load from
# other jobs on the machine hits all of them alike; the best repetition of each is reported.
for rep in $(seq "$reps"); do
    [[ $pytorch == 1 ]] || break
    for ctx in $contexts; do
        echo "run $rep/$reps, context $ctx: ours" >&2
        "$build/inference" "$model" "${tokenizer_flags[@]}" \
            --prompt-file "$work/prompt_$ctx.txt" --max-new-tokens "$new_tokens" \
            --temperature 0 --threads "$threads" --no-stream >"$work/ours_$ctx.out" \
            2>"$work/ours.err"
        # The log line is "[HH:MM:SS] stats: sample=1 prompt_tokens=... ..."
        grep -o 'stats: .*' "$work/ours.err" >>"$work/ours_$ctx.stats"
        for fmt in $weights; do
            [[ $fmt == fp32 ]] && continue
            echo "run $rep/$reps, context $ctx: ours --weights $fmt" >&2
            "$build/inference" "$model" "${tokenizer_flags[@]}" \
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
[[ $pytorch == 1 ]] && "$python" - "$work" "$tokenizer_dir" "$threads" "$new_tokens" "$reps" \
    "$weights" $contexts <<'EOF'
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

[[ $llama == 1 ]] || exit 0
# Prefill and decoding against llama.cpp: per repetition, context and format, ours then llama.cpp.
: >"$work/ours_llama.stats"
: >"$work/llama.jsonl"
for rep in $(seq "$reps"); do
    for ctx in $contexts; do
        for fmt in $weights; do
            case $fmt in fp32) dtype=f32 ;; bf16) dtype=bf16 ;; int8) dtype=q8_0 ;; esac
            echo "run $rep/$reps, context $ctx: ours --weights $fmt, llama.cpp $dtype" >&2
            "$build/inference" "$model" "${tokenizer_flags[@]}" \
                --prompt-file "$work/prompt_$ctx.txt" --max-new-tokens "$new_tokens" \
                --temperature 0 --threads "$threads" --no-stream --weights "$fmt" \
                --num-samples 3 >/dev/null 2>"$work/ours.err"
            grep -o 'stats: .*' "$work/ours.err" | sed "s/^stats: /format=$fmt context=$ctx /" \
                >>"$work/ours_llama.stats"
            node "$root/dev/llama_speed.mjs" "$llama_modules" "${model%.bin}_$dtype.gguf" \
                "$ctx" "$new_tokens" "$threads" 2 | sed "s/^{/{\"format\":\"$fmt\",/" \
                >>"$work/llama.jsonl"
        done
    done
done
# shellcheck disable=SC2086
"$python" - "$work" "$threads" "$new_tokens" "$reps" "$weights" $contexts <<'EOF'
import json, os, statistics, sys

work, threads, new_tokens, reps, weights = sys.argv[1:6]
contexts = [int(c) for c in sys.argv[6:]]
ours, llama = {}, {}
with open(os.path.join(work, "ours_llama.stats")) as f:
    for line in f:
        r = dict(kv.split("=") for kv in line.split())
        ours.setdefault((r["format"], int(r["context"])), []).append(r)
with open(os.path.join(work, "llama.jsonl")) as f:
    for line in f:
        r = json.loads(line)
        llama.setdefault((r["format"], r["prompt"]), []).append(r)
median = statistics.median
gguf = {"fp32": "F32", "bf16": "BF16", "int8": "Q8_0"}
print()
print(f"prompt (prefill) and decoding against llama.cpp on the same weights (GGUF written by "
      f"convert_model), {threads} threads, {new_tokens} greedy tokens; medians of {reps} x 2 "
      f"warm prompts")
print(f"{'context':>7} {'ours':>5} {'llama.cpp':>9} | {'prefill ms':>10} {'llama.cpp':>9} "
      f"{'ratio':>6} {'first':>6} | {'decode tok/s':>12} {'llama.cpp':>9} {'ratio':>6}")
for ctx in contexts:
    for fmt in weights.split():
        runs = ours[(fmt, ctx)]
        warm = [r for r in runs if r["sample"] != "1"]
        cold = [float(r["prefill_ms"]) for r in runs if r["sample"] == "1"]
        pre = median(float(r["prefill_ms"]) for r in warm)
        tok = median(float(r["tokens_per_s"]) for r in warm)
        lr = llama[(fmt, ctx)]
        lpre = median(r["prefill_ms"] for r in lr)
        ltok = median(1000.0 / r["ms_per_token"] for r in lr)
        print(f"{ctx:>7} {fmt:>5} {gguf[fmt]:>9} | {pre:>10.1f} {lpre:>9.1f} {pre / lpre:>5.2f}x "
              f"{median(cold):>6.1f} | {tok:>12.1f} {ltok:>9.1f} {tok / ltok:>5.2f}x")
print("ratio: ours / llama.cpp (prefill: below 1 is faster; decode: above 1 is faster); first: "
      "ours' prefill of the first prompt in the process")
EOF
