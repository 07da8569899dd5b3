#!/usr/bin/env bash
# Time to the same validation loss, AdamW against Muon, side by side (issue 58): each optimizer
# trained with every learning rate of its sweep on the same workload, the best of each kept (the
# lowest final validation loss; the sweep is recorded), then: the steps, tokens and training
# seconds each needs to reach AdamW's final validation loss, and each one's loss at equal
# wall-clock (the shorter run's training time). Training time is the sum of the steps' own times
# (the metrics file's "ms"), validation excluded.
#
# Workloads (--workloads, comma-separated):
#   default      train_gpt2's default run: char, L4 H4 C128, batch 64 x 64, 600 steps
#   shakespeare  nanoGPT's shakespeare_char CPU recipe: L4 H4 C128, block 64, batch 12, 2000
#                iterations, lr 1e-3 -> 1e-4, warmup 100, beta2 0.99
#   bpe          GPT-2's BPE: d6 (L6 H6 C384) with GPT-2's tokenizer, T 256, batch 8, 300 steps, on
#                data/tinyshakespeare.txt (the largest corpus here: 1.1 MB, 338K tokens, so about
#                two epochs); needs data/gpt2/encoder.json and vocab.bpe
#
# Model variants (--variants, ';'-separated, each NAME or NAME=FLAGS added to the workload's):
#   gpt2         the workload's model as it is (the default, and the others' target)
#   speedrun     bpe only: d6's shape with modded-nanogpt's block of 2024-11-03 and its heads of
#                128 (--model speedrun --n-layer 6 --n-head 3 --n-embd 384 --block-size 256)
#   NAME=FLAGS   any other, e.g. 'sr-tied=--model speedrun --n-layer 6 --n-head 3 --n-embd 384
#                --block-size 256 --arch head=tied' (an ablation); a flag given here replaces the
#                workload's (each takes one value)
# Every variant is trained with every optimizer of --optimizers over its sweep; the table then
# gives each one's seconds to gpt2's best AdamW final validation loss.
#
# Usage: dev/bench_time_to_loss.sh [--workloads default,shakespeare,bpe] [--adamw-lrs 3e-3,6e-3]
#          [--muon-lrs 0.02,0.04] [--variants 'gpt2;speedrun'] [--optimizers adamw,muon]
#          [--steps N] [--threads W] [--out-dir DIR] [--report-only]
#   --adamw-lrs L   AdamW's --lr values (Muon runs keep the workload's --lr for its AdamW part)
#   --muon-lrs L    Muon's --muon-lr values
#   --optimizers L  which of adamw, muon to train (default both)
#   --steps N       every workload N steps (short checks; the schedule spans them)
#   --threads W     workers (default: train_gpt2's, one per core up to the batch)
#   --report-only   train nothing: the table and plot again from DIR's recorded runs
#
# Writes to DIR (default bench-time-to-loss/): runs/*.jsonl (each run's metrics), sweep.csv
# (every run's final validation loss and training seconds), time_to_loss.md (the table, with
# the CPU and date) and time_to_loss.png (validation loss against seconds and against tokens;
# needs /usr/bin/python3 with matplotlib). Needs build/train_gpt2 and data/tinyshakespeare.txt.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
me=bench_time_to_loss.sh
usage="usage: dev/bench_time_to_loss.sh [--workloads default,shakespeare,bpe] [--adamw-lrs L] [--muon-lrs L] [--variants V] [--optimizers L] [--steps N] [--threads W] [--out-dir DIR] [--report-only] (--help: more)"
bad() { echo "$me: $* ($usage)" >&2; exit 2; }
die() { echo "$me: $*" >&2; exit 1; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
workloads="default,shakespeare" adamw_lrs="" muon_lrs="0.02,0.04" steps="" threads="" out_dir=""
variants="gpt2" optimizers="adamw,muon"
report_only=0
while (($#)); do
  case "$1" in --report-only) report_only=1; shift; continue ;; esac
  [[ $# -ge 2 ]] || bad "$1 needs a value"
  case "$1" in
    --workloads) workloads=$2 ;;
    --adamw-lrs) adamw_lrs=$2 ;;
    --muon-lrs) muon_lrs=$2 ;;
    --variants) variants=$2 ;;
    --optimizers) [[ "$2" =~ ^(adamw|muon)(,(adamw|muon))*$ ]] || bad "--optimizers takes adamw, muon or both"; optimizers=$2 ;;
    --steps) [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad "--steps must be a positive whole number"; steps=$2 ;;
    --threads) [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad "--threads must be a positive whole number"; threads=$2 ;;
    --out-dir) out_dir=$2 ;;
    *) bad "unknown argument '$1'" ;;
  esac
  shift 2
done
out_dir="${out_dir:-$repo/bench-time-to-loss}"
train="$repo/build/train_gpt2"
[[ -x "$train" ]] || die "$train not found (ninja -C build train_gpt2)"
[[ -f "$repo/data/tinyshakespeare.txt" ]] || die "$repo/data/tinyshakespeare.txt not found (scripts/setup.sh)"
mkdir -p "$out_dir/runs"

# A workload's flags, its steps and its validation interval; its AdamW sweep unless given.
workload_flags() {
  case "$1" in
    default) echo "--data $repo/data/tinyshakespeare.txt" ;;
    shakespeare) echo "--data $repo/data/tinyshakespeare.txt --n-layer 4 --n-head 4 --n-embd 128 --seq-len 64 --batch-size 12 --lr 1e-3 --min-lr 1e-4 --warmup-steps 100 --beta2 0.99" ;;
    bpe) echo "--data $repo/data/tinyshakespeare.txt --model d6 --tokenizer gpt2 --tokenizer-dir $repo/data/gpt2 --seq-len 256 --batch-size 8 --lr 1e-3 --warmup-steps 20" ;;
    *) bad "unknown workload '$1' (default, shakespeare, bpe)" ;;
  esac
}
# A variant's name and flags for workload $1 from its spec $2.
variant_flags() {
  case "$2" in
    gpt2) echo "" ;;
    speedrun)
      [[ "$1" == bpe ]] || bad "the speedrun variant is defined for the bpe workload (give NAME=FLAGS)"
      echo "--model speedrun --n-layer 6 --n-head 3 --n-embd 384 --block-size 256" ;;
    *=*) echo "${2#*=}" ;;
    *) bad "unknown variant '$2' (gpt2, speedrun, or NAME=FLAGS)" ;;
  esac
}
variant_name() { local n="${1%%=*}"; [[ "$n" =~ ^[A-Za-z0-9_.-]+$ ]] || bad "variant name '$n' (letters, digits, . _ -)"; echo "$n"; }
workload_steps() { case "$1" in default) echo 600 ;; shakespeare) echo 2000 ;; bpe) echo 300 ;; esac; }
workload_adamw_lrs() { case "$1" in default) echo "3e-3,6e-3" ;; shakespeare) echo "1e-3,2e-3" ;; bpe) echo "1e-3,2e-3" ;; esac; }

echo "run,workload,optimizer,lr,final_val_loss,train_seconds" >"$out_dir/sweep.csv"
IFS=, read -r -a workload_list <<<"$workloads"
IFS=';' read -r -a variant_list <<<"$variants"
((report_only)) && workload_list=()
for w in "${workload_list[@]}"; do
  n="${steps:-$(workload_steps "$w")}"
  every=$(( n / 12 > 0 ? n / 12 : 1 ))
  IFS=, read -r -a alrs <<<"${adamw_lrs:-$(workload_adamw_lrs "$w")}"
  IFS=, read -r -a mlrs <<<"$muon_lrs"
  runs=()
  [[ ",$optimizers," == *,adamw,* ]] && for lr in "${alrs[@]}"; do runs+=("adamw:$lr"); done
  [[ ",$optimizers," == *,muon,* ]] && for lr in "${mlrs[@]}"; do runs+=("muon:$lr"); done
  for spec in "${variant_list[@]}"; do
  vname="$(variant_name "$spec")"
  vflags="$(variant_flags "$w" "$spec")" flags="$(workload_flags "$w")"
  # A flag the variant gives replaces the workload's (--model d6 -> --model speedrun).
  for f in $(grep -oE -- '--[a-z0-9-]+' <<<"$vflags" || true); do
    flags="$(sed -E "s/(^| )$f [^ ]+//" <<<"$flags")"
  done
  flags="$flags $vflags"
  for run in "${runs[@]}"; do
    opt="${run%%:*}" lr="${run#*:}"
    # gpt2's runs keep the names of the runs before variants (their --report-only reads them).
    if [[ "$vname" == gpt2 ]]; then name="$w-$opt-$lr"; else name="$w.$vname-$opt-$lr"; fi
    extra=(--max-steps "$n" --val-every "$every" --sample-every 0 --checkpoint-every 0
           --out-dir "$out_dir/runs/$name" --metrics-file "$out_dir/runs/$name.jsonl")
    [[ -n "$threads" ]] && extra+=(--threads "$threads")
    if [[ "$opt" == adamw ]]; then
      # The workload's own --lr is replaced by the sweep's (and its floor follows as lr / 10).
      # shellcheck disable=SC2086
      set -- $(echo "$flags" | sed -E 's/--lr [^ ]+//; s/--min-lr [^ ]+//') --optimizer adamw --lr "$lr"
    else
      # shellcheck disable=SC2086
      set -- $flags --optimizer muon --muon-lr "$lr"
    fi
    rm -rf "$out_dir/runs/$name" "$out_dir/runs/$name.jsonl"  # this script's own earlier run
    "$train" "$@" "${extra[@]}" --log-level warn >"$out_dir/runs/$name.log" 2>&1 ||
      die "$name failed: $out_dir/runs/$name.log"
    echo "  $name done"
  done
  done
done

/usr/bin/python3 - "$out_dir" "$workloads" <<'PY'
import glob, json, os, re, subprocess, sys, datetime
out, workloads = sys.argv[1], sys.argv[2].split(",")

def load(path):
    seconds, tokens_per_step, rows, t = 0.0, None, [], 0.0
    train_ms = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "run":
            tokens_per_step = r.get("tokens_per_step")
        if r.get("type") == "train":
            t += r["ms"] / 1000.0
            train_ms[r["step"]] = t
        if r.get("type") == "val":
            rows.append((r["step"], train_ms.get(r["step"], t), r["val_loss"]))
    return tokens_per_step, rows

def first_reaching(rows, target):
    for i, (step, sec, loss) in enumerate(rows):
        if loss <= target:
            if i == 0:
                return step, sec
            s0, t0, l0 = rows[i - 1]
            f = (l0 - target) / (l0 - loss) if l0 != loss else 1.0
            return s0 + f * (step - s0), t0 + f * (sec - t0)
    return None

def loss_at(rows, seconds):
    last = rows[0][2]
    for step, sec, loss in rows:
        if sec > seconds:
            return last
        last = loss
    return last

cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"],
                     capture_output=True, text=True).stdout.strip()
lines = [f"# Time to the same validation loss: AdamW and Muon", "",
         f"{cpu}, {os.cpu_count()} CPUs; {datetime.date.today()}", ""]
sweep = [l.strip() for l in open(os.path.join(out, "sweep.csv"))][:1]
plots, variant_curves = [], {}
for w in workloads:
    every, runs = {}, {}  # (variant, optimizer, lr) -> (tokens a step, rows)
    for path in sorted(glob.glob(os.path.join(out, "runs", f"{w}-*.jsonl")) +
                       glob.glob(os.path.join(out, "runs", f"{w}.*-*.jsonl"))):
        name = os.path.basename(path)[:-6]
        head, opt, lr = re.match(r"^(.*?)-(adamw|muon)-(.+)$", name).groups()
        variant = head.split(".", 1)[1] if "." in head else "gpt2"
        tps, rows = load(path)
        if not rows:
            continue
        every[(variant, opt, lr)] = (tps, rows)
        sweep.append(f"{name},{w},{opt},{lr},{rows[-1][2]:.4f},{rows[-1][1]:.1f}")
    best_of = {}  # (variant, optimizer) -> the lr of the lowest final loss
    for (variant, opt, lr), (tps, rows) in every.items():
        key = (variant, opt)
        if key not in best_of or rows[-1][2] < every[(variant, opt, best_of[key])][1][-1][2]:
            best_of[key] = lr
    runs = {(opt, lr): v for (variant, opt, lr), v in every.items() if variant == "gpt2"}
    variant_curves[w] = [(f"{variant} {opt} lr {lr}", every[(variant, opt, lr)][1],
                          every[(variant, opt, lr)][0])
                         for (variant, opt), lr in sorted(best_of.items()) if variant != "gpt2"]
    best = {opt: lr for (variant, opt), lr in best_of.items() if variant == "gpt2"}
    if "adamw" in best and any(v != "gpt2" for v, _ in best_of):
        # The variants against gpt2's best AdamW: seconds to its final loss.
        base_tps, base = runs[("adamw", best["adamw"])]
        goal = base[-1][2]
        base_hit = first_reaching(base, goal)
        lines += [f"## {w}: model variants", "",
                  f"target: gpt2 AdamW (lr {best['adamw']})'s final validation loss {goal:.4f}", "",
                  "| variant | optimizer | best lr (swept) | final val loss | steps to target | seconds to target | s/step | time to target / gpt2 AdamW's |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for (variant, opt), lr in sorted(best_of.items(), key=lambda kv: (kv[0][0] != "gpt2", kv[0])):
            tps, rows = every[(variant, opt, lr)]
            swept = ", ".join(f"{l} {every[(v, o, l)][1][-1][2]:.4f}" for (v, o, l) in sorted(every)
                              if v == variant and o == opt)
            hit = first_reaching(rows, goal)
            lines.append(f"| {variant} | {opt} | {lr} ({swept}) | {rows[-1][2]:.4f} | "
                         f"{f'{hit[0]:.0f}' if hit else 'not reached'} | "
                         f"{f'{hit[1]:.1f}' if hit else '-'} | {rows[-1][1] / rows[-1][0]:.3f} | "
                         f"{f'{hit[1] / base_hit[1]:.2f}' if hit and base_hit else '-'} |")
        lines.append("")
    if "adamw" not in best or "muon" not in best:
        continue
    a_tps, a = runs[("adamw", best["adamw"])]
    m_tps, m = runs[("muon", best["muon"])]
    target = a[-1][2]
    lines += [f"## {w}", "",
              f"best of the sweep: AdamW lr {best['adamw']}, Muon lr {best['muon']}; target: AdamW's final validation loss {target:.4f}", "",
              "| optimizer | final val loss | steps to target | tokens to target | seconds to target | s/step | loss at the shorter run's time |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    equal = min(a[-1][1], m[-1][1])
    for opt, tps, rows in (("AdamW", a_tps, a), ("Muon", m_tps, m)):
        hit = first_reaching(rows, target)
        steps = f"{hit[0]:.0f}" if hit else "not reached"
        tokens = f"{hit[0] * (tps or 0):,.0f}" if hit and tps else "-"
        secs = f"{hit[1]:.1f}" if hit else "-"
        lines.append(f"| {opt} | {rows[-1][2]:.4f} | {steps} | {tokens} | {secs} | "
                     f"{rows[-1][1] / rows[-1][0]:.3f} | {loss_at(rows, equal):.4f} |")
    ha, hm = first_reaching(a, target), first_reaching(m, target)
    if ha and hm:
        lines += ["", f"Muon needs {hm[1] / ha[1]:.2f}x AdamW's training time to AdamW's final loss ({ha[1] / hm[1]:.2f}x less), {hm[0] / ha[0]:.2f}x its steps."]
    else:
        lines += ["", "Muon does not reach AdamW's final loss in its run."]
    lines.append("")
    plots.append((w, a, m, a_tps, m_tps, best))
open(os.path.join(out, "sweep.csv"), "w").write("\n".join(sweep) + "\n")
open(os.path.join(out, "time_to_loss.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, max(1, len(plots)), figsize=(6 * max(1, len(plots)), 8), squeeze=False)
    for j, (w, a, m, a_tps, m_tps, best) in enumerate(plots):
        curves = [(f"AdamW lr {best['adamw']}", a, a_tps), (f"Muon lr {best['muon']}", m, m_tps)]
        curves += variant_curves.get(w, [])
        for label, rows, tps in curves:
            axes[0][j].plot([r[1] for r in rows], [r[2] for r in rows], marker="o", label=label)
            axes[1][j].plot([r[0] * (tps or 1) for r in rows], [r[2] for r in rows], marker="o", label=label)
        axes[0][j].set_title(w); axes[0][j].set_xlabel("training seconds"); axes[0][j].set_ylabel("val loss")
        axes[1][j].set_xlabel("tokens"); axes[1][j].set_ylabel("val loss")
        for ax in (axes[0][j], axes[1][j]):
            ax.legend(); ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "time_to_loss.png"), dpi=90)
    print(f"plot: {os.path.join(out, 'time_to_loss.png')}")
except ImportError:
    print("plot: skipped (no matplotlib)")
PY
