#!/usr/bin/python3
"""Plot a train_gpt2 --metrics-file (one JSON object per line) as a PNG: train and validation
loss against step, and throughput in tokens/s.

    /usr/bin/python3 scripts/plot_metrics.py out/metrics.jsonl -o out/metrics.png

Needs Debian's python3-matplotlib (GPT2_WITH_PYTHON=1 scripts/setup.sh installs it).
"""
import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt


def read_metrics(path):
    train, val = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e})")
            if record.get("type") == "train":
                train.append(record)
            elif record.get("type") == "val":
                val.append(record)
    if not train and not val:
        sys.exit(f"{path}: no train or val records")
    return train, val


def finite(x):
    return x is not None and math.isfinite(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="the --metrics-file of a run")
    parser.add_argument("-o", "--output", default="metrics.png", help="PNG to write")
    args = parser.parse_args()
    train, val = read_metrics(args.metrics)

    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    steps = [r["step"] for r in train if finite(r.get("loss"))]
    loss_ax.plot(steps, [r["loss"] for r in train if finite(r.get("loss"))],
                 label="train loss", linewidth=1, alpha=0.8)
    if val:
        loss_ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-",
                     label="val loss", linewidth=2)
    loss_ax.set_ylabel("loss (nats/token)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend()
    speed_ax.plot([r["step"] for r in train], [r["tokens_per_s"] for r in train], linewidth=1)
    speed_ax.set_ylabel("tokens/s")
    speed_ax.set_xlabel("step")
    speed_ax.grid(alpha=0.3)
    fig.suptitle(args.metrics)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
