#!/usr/bin/env python3
"""Times GPT-2 training steps in plain PyTorch (fp32, CPU): the reference for dev/bench.sh.

The model and optimizer mirror build/train_gpt2: token + position embeddings, pre-LayerNorm
blocks (causal self-attention, MLP 4C with tanh GELU), final LayerNorm, LM head tied to wte with
the vocabulary padded to a multiple of 128 (the padded rows are never predicted, so their
logits are not computed); AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-D
weights only) and global gradient-norm clipping at 1.0. Data are random tokens.

A timed step is: forward + loss, backward, clip_grad_norm_, optimizer.step, zero_grad.
After --warmup untimed steps, --steps steps are timed and one line is printed:

  pytorch: median X ms/step | Y tok/s | Z GFLOP/s | peak RSS R | N steps, threads W | OpenBLAS K

K is the OpenBLAS kernel family in use (OPENBLAS_CORETYPE chooses it; OpenBLAS 0.3.21 picks its
AVX2 kernels on AVX-512 CPUs it does not know, such as AMD Zen 4/5). With --autocast bf16 the
forward and loss run under torch.autocast("cpu", dtype=torch.bfloat16), the one-line mixed
precision recipe, and the line ends with "| autocast bf16 on I", I being the oneDNN kernel that
PyTorch's bf16 matmul runs (e.g. brg:avx512_core_amx_bf16).

Usage (Debian's python with torch 1.13):
  /usr/bin/python3 dev/bench_pytorch_train.py --n-layer 6 --n-head 6 --n-embd 384 \
      --vocab 65 --batch-size 16 --seq-len 256 --steps 10 --threads 2
"""

import argparse
import math
import os
import resource
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-layer", type=int, default=12, help="transformer blocks (L)")
    p.add_argument("--n-head", type=int, default=12, help="attention heads")
    p.add_argument("--n-embd", type=int, default=768, help="channels (C)")
    p.add_argument("--vocab", type=int, default=50257, help="real vocabulary size (V)")
    p.add_argument("--pad-vocab", type=int, default=128,
                   help="pad wte rows to a multiple of this (1: no padding); default 128 as ours")
    p.add_argument("--block-size", type=int, default=0,
                   help="position embeddings (max context); 0: --seq-len")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step (B)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (T)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op (and BLAS) threads")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--verbose", action="store_true", help="print every step's time and loss")
    p.add_argument("--autocast", choices=["off", "bf16"], default="off",
                   help="run forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = p.parse_args()
    if a.block_size == 0:
        a.block_size = a.seq_len
    checks = [
        (a.n_layer > 0 and a.n_head > 0 and a.n_embd > 0, "--n-layer/--n-head/--n-embd must be > 0"),
        (a.n_embd % a.n_head == 0, "--n-embd must be divisible by --n-head"),
        (a.vocab > 0 and a.pad_vocab > 0, "--vocab and --pad-vocab must be > 0"),
        (a.batch_size > 0 and a.seq_len > 0, "--batch-size and --seq-len must be > 0"),
        (a.block_size >= a.seq_len, "--block-size must be at least --seq-len"),
        (a.steps > 0 and a.warmup >= 0, "--steps must be > 0 and --warmup >= 0"),
        (a.threads > 0, "--threads must be > 0"),
    ]
    for ok, msg in checks:
        if not ok:
            p.error(msg)
    return a


args = parse_args()
# Thread counts must be fixed before torch (and the OpenBLAS it calls for fp32 GEMM on Debian)
# start their pools. Variables already set by the caller win.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        # torch 1.13 has no fused scaled_dot_product_attention: explicit masked softmax.
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        scores = scores.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, padded_vocab, block_size):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(padded_vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        # GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L), zero
        # biases, padded wte rows zero.
        for name, prm in self.named_parameters():
            if prm.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(prm, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(prm)
        with torch.no_grad():
            self.wte.weight[vocab:].zero_()

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        # Tied LM head. The padded wte rows are never predicted, so only the first V rows are
        # multiplied (0.1% fewer FLOPs than Vp for GPT-2's vocabulary; the FLOP count below still
        # uses Vp, as ours does), which spares a (B*T, Vp) slice copy and its zero-filled gradient.
        logits = F.linear(x, self.wte.weight[: self.vocab])  # (B, T, V)
        return F.cross_entropy(logits.view(-1, self.vocab), targets.reshape(-1))


def human_bytes(n):
    # Same formatting as train_gpt2's report.
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def blas_kernels():
    """The OpenBLAS kernel family torch's GEMMs run on (Debian's torch calls the system BLAS),
    from the library already loaded into this process; "unknown" when it is not OpenBLAS."""
    import ctypes
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "openblas" in line and ".so" in line}
        for lib in sorted(libs):
            fn = ctypes.CDLL(lib).openblas_get_corename
            fn.restype = ctypes.c_char_p
            return fn().decode()
    except (OSError, AttributeError):
        pass
    return "unknown"


def bf16_matmul_kernel():
    """The oneDNN implementation PyTorch runs a bf16 matmul on, from oneDNN's verbose output of
    a child process (the variable must be set before oneDNN loads); "unknown" if none is named."""
    import subprocess
    code = ("import torch; a = torch.randn(256, 256).bfloat16(); "
            "b = torch.randn(256, 256).bfloat16(); torch.matmul(a, b)")
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.split(",")
        if len(fields) > 5 and fields[1] == "exec" and fields[3] in ("matmul", "inner_product"):
            return fields[4]
    return "unknown (no oneDNN matmul seen: PyTorch may not run bf16 through oneDNN here)"


def main():
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    L, NH, C, V, T, B = args.n_layer, args.n_head, args.n_embd, args.vocab, args.seq_len, args.batch_size
    Vp = (V + args.pad_vocab - 1) // args.pad_vocab * args.pad_vocab

    model = GPT(L, NH, C, V, Vp, args.block_size)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    gen = torch.Generator().manual_seed(args.seed)

    # FLOPs per token, the same formula as train_gpt2 (training_flops_per_token):
    #   6 * (12*L*C^2 + Vp*C)  -- forward 2 + backward 4 FLOPs per matmul weight (incl. LM head)
    #   + 12*L*T*C              -- attention scores QK^T and values PV, each 2*T*C per token per
    #                              layer forward (the full TxT product, as computed), x3 for training
    flops_per_token = 6.0 * (12.0 * L * C * C + Vp * C) + 12.0 * L * T * C
    tokens_per_step = B * T

    step_ms = []
    for step in range(args.warmup + args.steps):
        data = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - t0) * 1e3
        if step >= args.warmup:
            step_ms.append(ms)
        if args.verbose:
            print(f"step {step + 1}/{args.warmup + args.steps} | loss {loss.item():.4f} | "
                  f"norm {norm.item():.2f} | {ms:.0f} ms", file=sys.stderr)

    # Median as train_gpt2 takes it: the upper middle element for an even count.
    median_ms = sorted(step_ms)[len(step_ms) // 2]
    tok_s = tokens_per_step / (median_ms / 1e3)
    gflops = flops_per_token * tokens_per_step / (median_ms / 1e3) / 1e9
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # ru_maxrss is KiB
    print(f"pytorch: median {median_ms:.1f} ms/step | {tok_s:.1f} tok/s | {gflops:.1f} GFLOP/s | "
          f"peak RSS {human_bytes(peak_rss)} | {len(step_ms)} steps, threads {args.threads} | "
          f"OpenBLAS {blas_kernels()}"
          + (f" | autocast bf16 on {bf16_matmul_kernel()}" if args.autocast == "bf16" else ""),
          flush=True)


if __name__ == "__main__":
    main()
