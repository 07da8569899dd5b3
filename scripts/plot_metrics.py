#!/usr/bin/python3
"""Plot a train_gpt2 --metrics-file (one JSON object per line) as a PNG: train and validation
loss against step, and throughput in tokens/s.

    /usr/bin/python3 scripts/plot_metrics.py out/metrics.jsonl -o out/metrics.png
    /usr/bin/python3 scripts/plot_metrics.py out/metrics.jsonl --last-segment # since the last start
    /usr/bin/python3 scripts/plot_metrics.py out/metrics.jsonl --all-runs     # every run
    /usr/bin/python3 scripts/plot_metrics.py out/metrics.jsonl --summary      # no plot: the runs

Every start of train_gpt2 appends a {"type": "run", ...} record before its steps, so one file can
hold a run and its resumptions (or unrelated runs). By default the last run's whole training curve
is plotted: its own records and those of the starts it resumed (the same "run_id"; in files
without ids, each "resumed" start continues the one before it), each start's records cut where the
next one resumed, so that steps done again after a crash appear once.
Plotting needs Debian's python3-matplotlib (GPT2_WITH_PYTHON=1 scripts/setup.sh installs it).
"""
import argparse
import json
import math
import sys


def fail(message):
    print(f"plot_metrics: {message}", file=sys.stderr)
    sys.exit(1)


def read_runs(path):
    """The file's runs, oldest first: each a dict with its "run" record (or None for records
    before any run record, as older train_gpt2 versions wrote) and its train and val records."""
    runs = [{"run": None, "train": [], "val": []}]
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(enumerate(f, 1))
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")
    except UnicodeDecodeError:
        fail(f"{path}: not a text file (expected JSON Lines from train_gpt2 --metrics-file)")
    for number, line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{path}:{number}: not a JSON object ({e.msg}); expected JSON Lines from "
                 "train_gpt2 --metrics-file")
        if not isinstance(record, dict):
            fail(f"{path}:{number}: not a JSON object; expected JSON Lines from "
                 "train_gpt2 --metrics-file")
        kind = record.get("type")
        if kind == "run":
            runs.append({"run": record, "train": [], "val": []})
        elif kind in ("train", "val"):
            if "step" not in record:
                fail(f"{path}:{number}: a {kind} record without a step")
            runs[-1][kind].append(record)
    runs = [r for r in runs if r["run"] is not None or r["train"] or r["val"]]
    if not any(r["train"] or r["val"] for r in runs):
        fail(f"{path}: no train or val records")
    return runs


def describe(index, run):
    steps = [r["step"] for r in run["train"]]
    span = f"steps {min(steps)}-{max(steps)}" if steps else "no steps"
    start = run["run"]
    when = f", started {start.get('time')} at step {start.get('start_step')}" if start else ""
    resumed = " (resumed)" if start and start.get("resumed") else ""
    return f"run {index}: {span}, {len(run['val'])} validations{when}{resumed}"


def lineage(runs):
    """The last run and the runs it resumed, oldest first (of (index, run) pairs). With run ids
    (train_gpt2 writes the lineage's "run_id"), every earlier start of the same id, skipping
    unrelated runs in between; without them, each resumed start continues the one before it. A
    fresh start (not resumed) begins the lineage."""
    chain = [runs[-1]]
    for earlier in reversed(runs[:-1]):
        first = chain[0][1]["run"]
        if first is None or not first.get("resumed"):
            break
        first_id, earlier_id = first.get("run_id"), (earlier[1]["run"] or {}).get("run_id")
        if first_id is None or earlier_id is None or first_id == earlier_id:
            chain.insert(0, earlier)
    return chain


def join(chain):
    """One curve from the starts of a lineage: each start's records up to the step the next one
    resumed from (steps done again after a crash count once, from the start that went on)."""
    joined = {"run": chain[-1][1]["run"], "train": [], "val": [], "resumed_at": []}
    for position, (_, run) in enumerate(chain):
        following = chain[position + 1][1]["run"] if position + 1 < len(chain) else None
        until = following.get("start_step") if following else None
        if until is not None:
            joined["resumed_at"].append(until)
        for kind in ("train", "val"):
            joined[kind] += [r for r in run[kind] if until is None or r["step"] <= until]
    return joined


def finite(x):
    return x is not None and math.isfinite(x)


def plot(runs, title, output):
    try:
        import matplotlib
    except ImportError:
        fail("plotting needs matplotlib: apt-get install python3-matplotlib (or "
             "GPT2_WITH_PYTHON=1 scripts/setup.sh); --summary works without it")

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for index, run in runs:
        label = f" (run {index})" if len(runs) > 1 else ""
        train = [r for r in run["train"] if finite(r.get("loss"))]
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train],
                     label="train loss" + label, linewidth=1, alpha=0.8)
        if run["val"]:
            loss_ax.plot([r["step"] for r in run["val"]], [r["val_loss"] for r in run["val"]],
                         "o-", label="val loss" + label, linewidth=2)
        speed_ax.plot([r["step"] for r in run["train"]],
                      [r.get("tokens_per_s", 0) for r in run["train"]], linewidth=1,
                      label="tokens/s" + label)
        for number, step in enumerate(run.get("resumed_at", [])):
            for ax in (loss_ax, speed_ax):
                ax.axvline(step, color="gray", linestyle=":", linewidth=1,
                           label="resumed" if number == 0 and ax is loss_ax else None)
    loss_ax.set_ylabel("loss (nats/token)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend()
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    speed_ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the --metrics-file of a run")
    parser.add_argument("-o", "--output", default="metrics.png", help="PNG to write")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all-runs", action="store_true",
                       help="plot every run in the file, each on its own")
    which.add_argument("--last-segment", action="store_true",
                       help="plot only the last start's records (default: the whole training "
                       "curve of the last run, with the starts it resumed)")
    parser.add_argument("--summary", action="store_true",
                        help="print the runs in the file and what would be plotted")
    args = parser.parse_args()
    runs = list(enumerate(read_runs(args.metrics), 1))
    if args.all_runs:
        chosen, curves = runs, runs
    elif args.last_segment:
        chosen, curves = runs[-1:], runs[-1:]
    else:
        chosen = lineage(runs)
        curves = [(chosen[-1][0], join(chosen))]
    if args.summary:
        for index, run in runs:
            print(describe(index, run))
        print("plotted: " + ", ".join(f"run {index}" for index, _ in chosen))
        for _, curve in curves:
            steps = [r["step"] for r in curve["train"]]
            span = f"steps {min(steps)}-{max(steps)}" if steps else "no steps"
            print(f"curve: {span}, {len(curve['train'])} train records, "
                  f"{len(curve['val'])} validations")
        return
    plot(curves, args.metrics, args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
