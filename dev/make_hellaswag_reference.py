#!/usr/bin/python3
"""Write the PyTorch reference for HellaSwag-style scoring: tests/data/hellaswag_reference.bin
(examples in llm.c's evaluation-file format, written here independently of the C++ writer) and
tests/data/hellaswag_reference_expected.bin (GPT2REF1: the model's flat parameters, each ending's
mean loss after its context, the predictions, the labels and acc_norm).

The model is make_reference.py's tiny random GPT-2 (maxT=16, V=101), scored as llm.c's
dev/data/hellaswag.py does: the loss of every ending token given everything before it, averaged
over the ending, the lowest mean wins. One example is too long for T=16 and must be left out.

    /usr/bin/python3 dev/make_hellaswag_reference.py
"""

import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_reference as ref  # noqa: E402

SEED = 4242


def write_eval_file(path, examples):
    """llm.c's format: int32 header[256], then per example a uint16 stream."""
    stream = []
    longest = 0
    for index, (context, endings, label) in enumerate(examples):
        ex = [65535, 0, index, label, len(endings), len(context), *context]
        for ending in endings:
            ex += [len(ending), *ending]
        ex[1] = 2 * len(ex)
        longest = max(longest, ex[1])
        stream += ex
    header = np.zeros(256, dtype="<i4")
    header[:4] = [20240522, 1, len(examples), longest]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(stream, dtype="<u2").tobytes())


def main():
    data = Path(__file__).resolve().parent.parent / "tests" / "data"
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    params = ref.init_params()
    rng = np.random.default_rng(SEED)
    examples = []
    for i in range(7):
        if i == 5:  # 12 + 6 - 1 = 17 input positions: does not fit T = 16
            lengths = (12, [6, 2, 3, 1])
        else:
            context_length = int(rng.integers(2, 10))
            lengths = (context_length, [int(rng.integers(1, 17 - context_length + 1)) for _ in range(4)])
        context = [int(t) for t in rng.integers(0, ref.V, lengths[0])]
        endings = [[int(t) for t in rng.integers(0, ref.V, n)] for n in lengths[1]]
        examples.append([context, endings, 0])

    # Score first, then label: every other scored example is answered right, so both outcomes
    # are counted.
    means, predictions, labels = [], [], []
    with torch.no_grad():
        for example in examples:
            context, endings, _ = example
            if any(len(context) + len(e) - 1 > ref.MAX_T for e in endings):
                continue
            row = []
            for ending in endings:
                tokens = torch.tensor([context + ending])
                logits, _ = ref.forward(params, tokens[:, :-1], tokens[:, 1:])
                losses = F.cross_entropy(logits[0], tokens[0, 1:], reduction="none")
                row.append(losses[len(context) - 1:].mean().item())
            prediction = int(np.argmin(row))
            example[2] = prediction if len(means) % 2 == 0 else (prediction + 1) % 4
            means.append(row)
            predictions.append(prediction)
            labels.append(example[2])
    write_eval_file(data / "hellaswag_reference.bin", examples)
    acc = float(np.mean(np.array(predictions) == np.array(labels)))
    ref.write_fixture(data / "hellaswag_reference_expected.bin", [
        ("params", ref.flatten(params).numpy().astype(np.float32)),
        ("mean_losses", np.array(means, dtype=np.float32)),
        ("predictions", np.array(predictions, dtype=np.int32)),
        ("labels", np.array(labels, dtype=np.int32)),
        ("acc_norm", np.array(acc, dtype=np.float32)),
    ])
    print(f"{len(means)} examples scored, acc_norm {acc:.4f}, predictions {predictions}, labels {labels}")


if __name__ == "__main__":
    main()
