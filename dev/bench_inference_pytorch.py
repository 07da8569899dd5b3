#!/usr/bin/python3
"""PyTorch side of dev/bench_inference.sh: incremental (KV-cache) greedy generation with a GPT-2
read from an llm.c model file, timed the same way as build/inference.

  --write-random PATH   write a random GPT-2 124M-shaped llm.c model file and exit
  --model PATH          time generation: for each --variants V and --contexts N, prefill N prompt
                        tokens, then generate --new-tokens greedily; one JSON line per run
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MAGIC, VERSION = 20240326, 3


def param_shapes(maxT, V, Vp, L, NH, C):
    """The 16 tensors of an llm.c model file, in file order."""
    del V, NH
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]


def write_random(path, maxT, V, Vp, L, NH, C, seed):
    """GPT-2-like random weights: N(0, 0.02) matrices, small random biases and LayerNorm gains
    near 1 (so no tensor is trivially constant)."""
    gen = torch.Generator().manual_seed(seed)
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [MAGIC, VERSION, maxT, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, shape in param_shapes(maxT, V, Vp, L, NH, C):
            if name.endswith("w") and name.startswith("ln"):
                t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
            elif name.endswith("b"):
                t = 0.02 * torch.randn(shape, generator=gen)
            else:
                t = 0.02 * torch.randn(shape, generator=gen)
                if name == "wte":
                    t[V:] = 0.0  # padded rows are never predicted
            f.write(t.to(torch.float32).numpy().tobytes())


class Gpt2:
    """GPT-2 inference with a preallocated KV cache, (L, NH, maxT, hs) as in Hugging Face's
    use_cache. variant "tuned" runs one-row products as torch.addmv and one-query attention as
    two bmm over the cache (PyTorch's fast paths on CPU); "hf" uses F.linear and matmul for every
    shape, as transformers' GPT-2 does."""

    def __init__(self, path, variant):
        raw = np.fromfile(path, dtype=np.uint8)
        header = raw[:1024].view(np.int32)
        if header[0] != MAGIC or header[1] != VERSION:
            sys.exit(f"{path}: not an fp32 llm.c model file")
        self.maxT, self.V, self.L, self.NH, self.C, self.Vp = (int(x) for x in header[2:8])
        floats = torch.from_numpy(raw[1024:].view(np.float32))
        self.p = {}
        at = 0
        for name, shape in param_shapes(self.maxT, self.V, self.Vp, self.L, self.NH, self.C):
            n = math.prod(shape)
            self.p[name] = floats[at:at + n].view(shape)
            at += n
        if at != floats.numel():
            sys.exit(f"{path}: {floats.numel()} floats, the header implies {at}")
        self.tuned = variant == "tuned"
        hs = self.C // self.NH
        self.k = torch.zeros(self.L, self.NH, self.maxT, hs)
        self.v = torch.zeros(self.L, self.NH, self.maxT, hs)

    def linear(self, x, w, b):
        if self.tuned and x.shape[0] == 1:
            return torch.addmv(b, w, x[0]).unsqueeze(0)
        return F.linear(x, w, b)

    def attention(self, l, q, k, v, pos0):
        n, C, NH = q.shape[0], self.C, self.NH
        hs = C // NH
        end = pos0 + n
        heads = lambda t: t.view(n, NH, hs).transpose(0, 1)  # (NH, n, hs)
        self.k[l, :, pos0:end] = heads(k)
        self.v[l, :, pos0:end] = heads(v)
        keys, values = self.k[l, :, :end], self.v[l, :, :end]  # (NH, end, hs)
        scale = 1.0 / math.sqrt(hs)
        if self.tuned and n == 1:
            scores = torch.bmm(keys, q.view(NH, hs, 1)) * scale  # (NH, end, 1)
            return torch.bmm(values.transpose(1, 2), scores.softmax(dim=1)).view(1, C)
        att = (heads(q) @ keys.transpose(1, 2)) * scale
        if n > 1:
            rows = torch.arange(pos0, end).unsqueeze(1)
            att = att.masked_fill(torch.arange(end).unsqueeze(0) > rows, float("-inf"))
        return (att.softmax(dim=-1) @ values).transpose(0, 1).reshape(n, C)

    def forward(self, tokens, pos0):
        """Encodes `tokens` at positions pos0.. on top of the cache; logits after the last one."""
        p, C = self.p, self.C
        n = tokens.numel()
        x = p["wte"][tokens] + p["wpe"][pos0:pos0 + n]
        for l in range(self.L):
            h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
            q, k, v = self.linear(h, p["qkvw"][l], p["qkvb"][l]).split(C, dim=1)
            y = self.attention(l, q, k, v, pos0)
            x = x + self.linear(y, p["attprojw"][l], p["attprojb"][l])
            h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
            h = F.gelu(self.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
            x = x + self.linear(h, p["fcprojw"][l], p["fcprojb"][l])
        last = F.layer_norm(x[-1:], (C,), p["lnfw"], p["lnfb"], 1e-5)
        if self.tuned:
            return torch.mv(p["wte"][: self.V], last[0])
        return (last @ p["wte"][: self.V].T)[0]


def generate(model, prompt, count):
    """Greedy: prefill, then one single-position forward per token (as build/inference)."""
    t0 = time.perf_counter()
    logits = model.forward(prompt, 0)
    t1 = time.perf_counter()
    out = []
    pos = prompt.numel()
    for i in range(count):
        token = int(torch.argmax(logits))
        out.append(token)
        if i + 1 < count:
            logits = model.forward(torch.tensor([token]), pos)
            pos += 1
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--write-random")
    ap.add_argument("--model")
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-token", type=int, default=262, help="token repeated as the prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["tuned", "hf"], choices=["tuned", "hf"])
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.write_random:
        write_random(args.write_random, 1024, 50257, 50304, 12, 12, 768, args.seed)
        return
    for variant in args.variants:
        model = Gpt2(args.model, variant)
        with torch.inference_mode():
            model.forward(torch.tensor([args.prompt_token] * 8), 0)  # warm-up
            for ctx in args.contexts:
                prompt = torch.tensor([args.prompt_token] * ctx)
                tokens, prefill_s, gen_s = generate(model, prompt, args.new_tokens)
                print(json.dumps({
                    "variant": variant, "context": ctx, "generated_tokens": len(tokens),
                    "prefill_ms": prefill_s * 1e3, "generate_ms": gen_s * 1e3,
                    "tokens_per_s": len(tokens) / gen_s, "ms_per_token": gen_s * 1e3 / len(tokens),
                    "tokens": tokens, "threads": torch.get_num_threads()}), flush=True)

if __name__ == "__main__":
    main()
