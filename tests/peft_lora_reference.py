#!/usr/bin/env python3
"""PEFT's LoRA on GPT-2 applied by NumPy as PEFT documents it, for the adapter export tests: the base
model through tests/hf_gpt2_reference.py (a Hugging Face GPT-2 directory), the adapter from a PEFT
directory (adapter_config.json: r, lora_alpha, target_modules matched against module names by
suffix; adapter_model.safetensors: base_model.model.<module>.lora_A.weight (r, in) and
.lora_B.weight (out, r)). Each adapted Conv1D computes
    h = x W + b + (lora_alpha / r) * (x A^T) B^T
with W stored (in, out). Nothing of gpt2-mpi is imported.

  peft_lora_reference.py logits BASE_DIR PEFT_DIR TOKENS OUT   logits (T, vocab) float32
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2_reference as hf  # noqa: E402


def lora_delta(peft_dir):
    config = json.load(open(os.path.join(peft_dir, "adapter_config.json")))
    if config.get("peft_type", "LORA") != "LORA" or config.get("bias", "none") != "none":
        raise ValueError(f"{peft_dir}: not a plain LoRA adapter")
    scaling = config["lora_alpha"] / config["r"]
    targets = config["target_modules"]
    tensors = {name: array.astype(np.float64)
               for name, array in hf.read_safetensors(os.path.join(peft_dir, "adapter_model.safetensors")).items()}
    used = set()

    def delta(module, x):
        full = "transformer." + module
        if not any(full == t or full.endswith("." + t) for t in targets):
            return 0.0
        prefix = "base_model.model." + full
        a, b = tensors[prefix + ".lora_A.weight"], tensors[prefix + ".lora_B.weight"]
        used.update({prefix + ".lora_A.weight", prefix + ".lora_B.weight"})
        return scaling * ((x @ a.T) @ b.T)

    return delta, tensors, used


if __name__ == "__main__":
    if sys.argv[1] != "logits":
        sys.exit(__doc__)
    delta, tensors, used = lora_delta(sys.argv[3])
    tokens = np.fromfile(sys.argv[4], dtype="<i4")
    out = hf.logits(sys.argv[2], tokens, delta)
    if used != set(tensors):
        sys.exit(f"{sys.argv[3]}: tensors no module used: {sorted(set(tensors) - used)}")
    out.tofile(sys.argv[5])
