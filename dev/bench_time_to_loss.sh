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
# Usage: dev/bench_time_to_loss.sh [--workloads default,shakespeare,bpe] [--adamw-lrs 3e-3,6e-3]
#          [--muon-lrs 0.02,0.04] [--steps N] [--threads W] [--out-dir DIR] [--report-only]
#   --adamw-lrs L   AdamW's --lr values (Muon runs keep the workload's --lr for its AdamW part)
#   --muon-lrs L    Muon's --muon-lr values
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
usage="usage: dev/bench_time_to_loss.sh [--workloads default,shakespeare,bpe] [--adamw-lrs L] [--muon-lrs L] [--steps N] [--threads W] [--out-dir DIR] [--report-only] (--help: more)"
bad() { echo "$me: $* ($usage)" >&2; exit 2; }
die() { echo "$me: $*" >&2; exit 1; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
workloads="default,shakespeare" adamw_lrs="" muon_lrs="0.02,0.04" steps="" threads="" out_dir=""
report_only=0
while (($#)); do
  if [[ "$1" == --report-only ]]; then report_only=1; shift; continue; fi
  [[ $# -ge 2 ]] || bad "$1 needs a value"
  case "$1" in
    --workloads) workloads=$2 ;;
    --adamw-lrs) adamw_lrs=$2 ;;
    --muon-lrs) muon_lrs=$2 ;;
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
workload_steps() { case "$1" in default) echo 600 ;; shakespeare) echo 2000 ;; bpe) echo 300 ;; esac; }
workload_adamw_lrs() { case "$1" in default) echo "3e-3,6e-3" ;; shakespeare) echo "1e-3,2e-3" ;; bpe) echo "1e-3,2e-3" ;; esac; }

echo "run,workload,optimizer,lr,final_val_loss,train_seconds" >"$out_dir/sweep.csv"
IFS=, read -r -a workload_list <<<"$workloads"
((report_only)) && workload_list=()
for w in "${workload_list[@]}"; do
  flags="$(workload_flags "$w")"
  n="${steps:-$(workload_steps "$w")}"
  every=$(( n / 12 > 0 ? n / 12 : 1 ))
  IFS=, read -r -a alrs <<<"${adamw_lrs:-$(workload_adamw_lrs "$w")}"
  IFS=, read -r -a mlrs <<<"$muon_lrs"
  runs=()
  for lr in "${alrs[@]}"; do runs+=("adamw:$lr"); done
  for lr in "${mlrs[@]}"; do runs+=("muon:$lr"); done
  for run in "${runs[@]}"; do
    opt="${run%%:*}" lr="${run#*:}"
    name="$w-$opt-$lr"
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

/usr/bin/python3 - "$out_dir" "$workloads" <<'PY'
import glob, json, os, subprocess, sys, datetime
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
plots = []
for w in workloads:
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "runs", f"{w}-*.jsonl"))):
        name = os.path.basename(path)[:-6]
        _, opt, lr = name.split("-", 2)
        tps, rows = load(path)
        if not rows:
            continue
        runs[(opt, lr)] = (tps, rows)
        sweep.append(f"{name},{w},{opt},{lr},{rows[-1][2]:.4f},{rows[-1][1]:.1f}")
    best = {}
    for (opt, lr), (tps, rows) in runs.items():
        if opt not in best or rows[-1][2] < runs[(opt, best[opt])][1][-1][2]:
            best[opt] = lr
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
        for label, rows, tps in ((f"AdamW lr {best['adamw']}", a, a_tps), (f"Muon lr {best['muon']}", m, m_tps)):
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
