#!/usr/bin/python3
"""Write tests/data/gpt2_reference.bin, an independent PyTorch reference for the C++ GPT-2.

The model is GPT-2 as defined by OpenAI / nanoGPT (pre-LN blocks, tanh-GELU, tied wte/lm_head),
written here from scratch in plain torch ops so that every intermediate activation can be
recorded. A tiny random configuration is used (V=101 padded to Vp=128, maxT=16, L=2, NH=4, C=64,
B=3, T=16) and the file records: the config, the flat parameter vector in llm.c order, a batch of
inputs/targets, the logits, the loss, the flat gradient, per-layer activations, and 5 steps of
AdamW with gradient clipping on the same batch.

It also writes tests/data/gpt2_masked_reference.bin: the same model and batch with a loss mask
(targets set to -100, PyTorch's default ignore_index, where the loss does not train: a prompt, a
whole sequence, every other position), the mean loss over the trained targets and the gradient,
as F.cross_entropy(ignore_index=-100) gives them (what train_gpt2 does with prepare_data's masks).

And tests/data/gpt2_muon_reference.bin: the same model and batch trained 3 steps by Muon (Keller
Jordan's muon_update as github.com/KellerJordan/Muon writes it, in fp32: momentum 0.95 with
Nesterov, five quintic Newton-Schulz iterations with (3.4445, -4.7750, 2.0315) on the
Frobenius-normalized update, transposed when it has more rows than columns, scaled by
sqrt(max(1, rows / cols)), decoupled weight decay lr * wd) on Q, K, V (apart), the attention
projection, fc and its projection of every layer, and torch's AdamW on the rest, after clipping
to norm 1: the weights after the first and the last step, the losses and the norms.

And tests/data/gpt2_lora_reference.bin (the frozen model with a LoRA adapter of rank 4 on the four
projections, PEFT's formula: the loss, lnf and the adapter's gradient), and
tests/data/gpt2_dropout_reference.bin: the same model and batch trained with
dropout (rate 0.25 at GPT-2's four sites), its masks drawn by a NumPy transcription of the
counter in src/ops/dropout.hpp (so the C++ side can check its masks and then its gradients), the
loss and the gradient.

Regenerate (deterministic: two runs give identical bytes):

    /usr/bin/python3 dev/make_reference.py            # writes the three files in tests/data
    /usr/bin/python3 dev/make_reference.py -o out.bin # the first somewhere else

File format (little-endian): 8-byte magic "GPT2REF1", uint32 record count, then per record:
uint32 name length, name bytes (ASCII, no NUL), uint32 dtype (0 = float32, 1 = int32),
uint32 ndim, int64 dims[ndim], raw data (prod(dims) elements, C order). Scalars have ndim 0.

And tests/data/block_kernels_reference.bin: the layers of the families after GPT-2 on random
inputs, computed in float64 by plain torch ops and autograd (RMSNorm with and without a gain,
Llama's rotary positions on a grouped-query qkv row as Hugging Face's apply_rotary_pos_emb writes
them, SwiGLU, ReLU^2): outputs and input (and gain) gradients for a random output gradient.
And tests/data/llama_reference.bin: two models of the families after GPT-2 written from their
definitions in float64 (Hugging Face's LlamaForCausalLM: RMSNorm with gains, rotary positions with
rotate_half, grouped-query attention by repeating each key/value head for its group, SwiGLU, no
biases, an untied head; a variant with ReLU^2, RMSNorm without gains and a tied head; and
modded-nanogpt's block of 2024-11-03 with QK-norm and the embeddings' norm), each with its
parameters in our flat layout, a batch, the loss and the gradient.
And tests/data/hf_llama_standin/ with hf_llama_standin_logits.bin: a stand-in for a downloaded
Llama-family Hugging Face directory (config.json, BF16 model.safetensors with Hugging Face's names)
and the logits LlamaForCausalLM's definition gives for a batch, in float64.
"""

import argparse
import json
import math
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# ---- configuration ---------------------------------------------------------------------------
MAX_T, V, VP, L, NH, C = 16, 101, 128, 2, 4, 64
B, T = 3, 16
SEED = 1337
LN_EPS = 1e-5

# AdamW + clipping. max_grad_norm must be below the step-1 pre-clip norm (asserted below) so that
# the clipping path is actually exercised; with these weights the pre-clip norms are ~2, so the
# usual 1.0 clips on every step.
LR, BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1
MAX_GRAD_NORM = 1.0
ADAM_STEPS = 5

# Parameter tensors in llm.c order: (name, shape, kind). kind selects the random init:
# "w" = normal(0, 0.02) (Linear weights, embeddings, Linear biases), "lnw" = 1 + normal(0, 0.1),
# "lnb" = normal(0, 0.1). Non-trivial biases / LayerNorm params make sure those paths matter.
PARAM_SPECS = [
    ("wte", (VP, C), "w"),
    ("wpe", (MAX_T, C), "w"),
    ("ln1w", (L, C), "lnw"),
    ("ln1b", (L, C), "lnb"),
    ("qkvw", (L, 3 * C, C), "w"),
    ("qkvb", (L, 3 * C), "w"),
    ("attprojw", (L, C, C), "w"),
    ("attprojb", (L, C), "w"),
    ("ln2w", (L, C), "lnw"),
    ("ln2b", (L, C), "lnb"),
    ("fcw", (L, 4 * C, C), "w"),
    ("fcb", (L, 4 * C), "w"),
    ("fcprojw", (L, C, 4 * C), "w"),
    ("fcprojb", (L, C), "w"),
    ("lnfw", (C,), "lnw"),
    ("lnfb", (C,), "lnb"),
]
# Only the 2-D matrices are weight-decayed (biases and LayerNorm parameters are not).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def init_params():
    """Random parameters, drawn in layout order from the global (seeded) generator."""
    params = {}
    for name, shape, kind in PARAM_SPECS:
        if kind == "w":
            t = torch.randn(shape) * 0.02
        elif kind == "lnw":
            t = 1.0 + torch.randn(shape) * 0.1
        else:
            t = torch.randn(shape) * 0.1
        params[name] = t
    # Padding rows of the vocabulary never correspond to a token: keep them exactly zero.
    params["wte"][V:].zero_()
    return {n: t.requires_grad_(True) for n, t in params.items()}


def flatten(tensors):
    """Concatenate per-parameter tensors (dict in PARAM_SPECS order) into one flat vector."""
    return torch.cat([tensors[name].detach().reshape(-1) for name, _, _ in PARAM_SPECS])


# ---- dropout: the counter of src/ops/dropout.hpp, transcribed -----------------------------------
DROPOUT_RATE = 0.25  # exact in float32
DROPOUT_SEED, DROPOUT_STEP, DROPOUT_FIRST_SEQUENCE = 1337, 7, 5
SITES = {"embeddings": 0, "attention": 1, "attention_output": 2, "mlp_output": 3}
MASK64 = (1 << 64) - 1


def mix64(x):
    """MurmurHash3's 64-bit finalizer (the keys), on a Python int."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    return x ^ (x >> 33)


def mix32(x):
    """MurmurHash3's 32-bit finalizer (each element's draw), on a NumPy uint32 array."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        return x ^ (x >> np.uint32(16))


def keep_mask(layer, site, count):
    """(B, count) 0/1 float32: element e of the batch's sequence b kept or not."""
    site_key = mix64((mix64((mix64(DROPOUT_SEED) + DROPOUT_STEP) & MASK64) + layer * 4 + SITES[site])
                     & MASK64)
    threshold = math.floor(DROPOUT_RATE * 2**32)
    rows = []
    for b in range(B):
        seq = DROPOUT_FIRST_SEQUENCE + b
        seq_key = mix64((site_key + seq * 0xD1B54A32D192ED03) & MASK64)
        low, high = np.uint32(seq_key & 0xFFFFFFFF), np.uint32(seq_key >> 32)
        with np.errstate(over="ignore"):
            bits = mix32(mix32(np.arange(count, dtype=np.uint32) + low) ^ high)
        rows.append((bits >= np.uint32(threshold)).astype(np.float32))
    return np.stack(rows)


def dropout_masks():
    """Every site's masks, shaped as the tensors they multiply."""
    masks = {"embeddings": torch.from_numpy(keep_mask(0, "embeddings", T * C).reshape(B, T, C))}
    for site, shape in [("attention", (B, NH, T, T)), ("attention_output", (B, T, C)),
                        ("mlp_output", (B, T, C))]:
        count = int(np.prod(shape[1:]))
        masks[site] = torch.stack([torch.from_numpy(keep_mask(l, site, count).reshape(shape))
                                   for l in range(L)])
    return masks


def forward(p, idx, targets, acts=None, masks=None, lora=None):
    """GPT-2 forward pass. Returns (logits[B,T,V], loss). Fills `acts` (dict of lists) if given.
    With `masks` (dropout_masks()), drops where GPT-2 does, kept values scaled by 1/(1-rate).
    With `lora` ({target: (A[l], B[l])}), each adapted product adds PEFT's term
    LORA_SCALE * linear(linear(h, A), B)."""
    b, t = idx.shape

    def linear(h, weight, bias, l, target):
        out = F.linear(h, weight, bias)
        if lora is not None and target in lora:
            a_mat, b_mat = lora[target]
            out = out + LORA_SCALE * F.linear(F.linear(h, a_mat[l]), b_mat[l])
        return out
    hs = C // NH
    scale = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(1.0 - DROPOUT_RATE,
                                                                   dtype=torch.float32)

    def drop(value, mask):
        return value if masks is None else value * (mask * scale)

    def rec(name, value):
        if acts is not None:
            acts.setdefault(name, []).append(value.detach().clone())

    x = p["wte"][idx] + p["wpe"][torch.arange(t)]  # (B,T,C)
    x = drop(x, None if masks is None else masks["embeddings"])
    if acts is not None:
        acts["encoded"] = x.detach().clone()
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for l in range(L):
        # --- attention sub-block ---
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], LN_EPS)
        rec("ln1", h)
        qkv = linear(h, p["qkvw"][l], p["qkvb"][l], l, "c_attn")  # (B,T,3C), columns ordered q | k | v
        rec("qkv", qkv)
        q, k, v = qkv.split(C, dim=2)
        # (B,T,C) -> (B,NH,T,hs): head h owns channels [h*hs, (h+1)*hs) of q, k and v.
        q, k, v = (z.view(b, t, NH, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        att = drop(att, None if masks is None else masks["attention"][l])
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, C)  # heads re-concatenated
        rec("atty", y)
        y = linear(y, p["attprojw"][l], p["attprojb"][l], l, "attn.c_proj")
        rec("attproj", y)
        x = x + drop(y, None if masks is None else masks["attention_output"][l])
        rec("residual2", x)
        # --- MLP sub-block ---
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], LN_EPS)
        rec("ln2", h)
        h = linear(h, p["fcw"][l], p["fcb"][l], l, "c_fc")
        rec("fch", h)
        h = F.gelu(h, approximate="tanh")
        rec("fch_gelu", h)
        h = linear(h, p["fcprojw"][l], p["fcprojb"][l], l, "mlp.c_proj")
        rec("fcproj", h)
        x = x + drop(h, None if masks is None else masks["mlp_output"][l])
        rec("residual3", x)
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], LN_EPS)
    if acts is not None:
        acts["lnf"] = x.detach().clone()
    # Tied lm_head over the padded vocabulary, then drop the padding columns before the loss so
    # that the padded rows of wte receive exactly zero gradient.
    logits = (x @ p["wte"].t())[..., :V]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss


# ---- LoRA: PEFT's formula on the four projections ----------------------------------------------
LORA_RANK, LORA_ALPHA = 4, 8.0
LORA_SCALE = LORA_ALPHA / LORA_RANK
# (PEFT name, in_features, out_features) in the C++ adapter layout's order (src/model/lora.hpp).
LORA_TARGETS = [("c_attn", C, 3 * C), ("attn.c_proj", C, C), ("c_fc", C, 4 * C),
                ("mlp.c_proj", 4 * C, C)]


def write_lora_fixture(path):
    """The base model frozen, an adapter of rank 4 on all four projections: the loss, the final
    LayerNorm's output and the adapter's gradient. A is drawn as PEFT draws it (kaiming_uniform_
    with a=sqrt(5): uniform in +-1/sqrt(in)); B is random too (PEFT starts it at zero, which would
    leave A's gradient zero and the check blind)."""
    torch.manual_seed(SEED + 2)
    params = {n: t.detach() for n, t in init_params().items()}
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    lora, flat = {}, []
    for name, fan_in, fan_out in LORA_TARGETS:
        bound = 1.0 / math.sqrt(fan_in)
        a_mat = ((torch.rand(L, LORA_RANK, fan_in) * 2 - 1) * bound).requires_grad_(True)
        b_mat = (torch.randn(L, fan_out, LORA_RANK) * 0.1).requires_grad_(True)
        lora[name] = (a_mat, b_mat)
    acts = {}
    _, loss = forward(params, idx, targets, acts, lora=lora)
    loss.backward()

    def layout(pick):  # layer by layer, target by target, A then B
        return torch.cat([pick(lora[name][k])[l].reshape(-1) for l in range(L)
                          for name, _, _ in LORA_TARGETS for k in (0, 1)])

    def f32(t):
        return np.asarray(t.detach().numpy(), dtype=np.float32)

    records = [
        ("config", np.array([MAX_T, V, VP, L, NH, C, B, T], dtype=np.int32)),
        ("lora.config", np.array([LORA_RANK, LORA_ALPHA], dtype=np.float32)),
        ("params", f32(flatten(params))),
        ("lora", f32(layout(lambda t: t))),
        ("inputs", idx.numpy().astype(np.int32)),
        ("targets", targets.numpy().astype(np.int32)),
        ("loss", np.array(loss.item(), dtype=np.float32)),
        ("lnf", f32(acts["lnf"])),
        ("lora.grads", f32(layout(lambda t: t.grad))),
    ]
    write_fixture(path, records)
    print(f"wrote {path} ({path.stat().st_size} bytes): loss {loss.item():.7f}")


MUON_LR, MUON_MOMENTUM, MUON_WEIGHT_DECAY, MUON_STEPS = 0.02, 0.95, 0.1, 3


def newton_schulz5(g, steps=5):
    """Muon's zeropower_via_newtonschulz5, in fp32 (the published one runs in bf16)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.clone()
    if g.size(-2) > g.size(-1):
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


def muon_pieces(params):
    """The matrices Muon orthogonalizes, as views: per layer Q, K, V, attproj, fc, fcproj."""
    pieces = []
    for l in range(L):
        for part in range(3):
            pieces.append(("qkvw", l, slice(part * C, (part + 1) * C)))
        pieces += [("attprojw", l, slice(None)), ("fcw", l, slice(None)),
                   ("fcprojw", l, slice(None))]
    return pieces


def write_muon_fixture(path):
    """Three clipped Muon steps (AdamW for the embeddings, LayerNorms and biases)."""
    torch.manual_seed(SEED)
    params = init_params()
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    names = [n for n, _, _ in PARAM_SPECS]
    muon_names = {"qkvw", "attprojw", "fcw", "fcprojw"}
    adamw = torch.optim.AdamW(
        [
            {"params": [params[n] for n in names if n in DECAYED and n not in muon_names],
             "weight_decay": WEIGHT_DECAY},
            {"params": [params[n] for n in names if n not in DECAYED], "weight_decay": 0.0},
        ],
        lr=LR, betas=(BETA1, BETA2), eps=ADAM_EPS, foreach=False)
    momentum = {n: torch.zeros_like(params[n]) for n in muon_names}
    losses, norms, after = [], [], []
    for step in range(MUON_STEPS):
        adamw.zero_grad(set_to_none=True)
        for n in muon_names:
            params[n].grad = None
        _, step_loss = forward(params, idx, targets)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], MAX_GRAD_NORM)
        losses.append(step_loss.item())
        norms.append(norm.item())
        adamw.step()
        with torch.no_grad():
            for name, l, rows in muon_pieces(params):
                grad = params[name].grad[l][rows]
                buf = momentum[name][l][rows]
                buf.lerp_(grad, 1 - MUON_MOMENTUM)
                update = grad.clone().lerp_(buf, MUON_MOMENTUM)  # Nesterov
                update = newton_schulz5(update)
                update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
                weight = params[name][l][rows]
                weight.mul_(1 - MUON_LR * MUON_WEIGHT_DECAY)
                weight.add_(update, alpha=-MUON_LR)
        if step == 0 or step == MUON_STEPS - 1:
            after.append(flatten(params))

    def f32(t):
        return np.asarray(t.detach().numpy(), dtype=np.float32)

    write_fixture(path, [
        ("muon.hparams", np.array([MUON_LR, MUON_MOMENTUM, MUON_WEIGHT_DECAY], dtype=np.float32)),
        ("muon.losses", np.array(losses, dtype=np.float32)),
        ("muon.grad_norms", np.array(norms, dtype=np.float32)),
        ("muon.params_after_first", f32(after[0])),
        ("muon.params_after_last", f32(after[1])),
    ])


def write_block_kernels_fixture(path):
    """RMSNorm, rotary positions, SwiGLU and ReLU^2 in float64, with their gradients."""
    g = torch.Generator().manual_seed(20261128)
    d = torch.float64

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=d)

    def f32(t):
        return t.detach().to(torch.float32).numpy()

    records = []
    # RMSNorm over rows of C (eps 1e-5), with a gain and without.
    N, C, eps = 10, 24, 1e-5
    x, w, dout = rand(N, C).requires_grad_(), (1 + 0.1 * rand(C)).requires_grad_(), rand(N, C)
    x32, w32 = torch.tensor(f32(x), dtype=d, requires_grad=True), torch.tensor(f32(w), dtype=d, requires_grad=True)
    for name, gain in (("rms", w32), ("rms_nogain", None)):
        x32.grad = None
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        if gain is not None:
            gain.grad = None
            out = out * gain
        out.backward(dout)
        records += [(f"{name}.out", f32(out)), (f"{name}.dinp", f32(x32.grad))]
        if gain is not None:
            records.append((f"{name}.dweight", f32(gain.grad)))
    records += [("rms.inp", f32(x32)), ("rms.weight", f32(w32)), ("rms.dout", f32(dout))]

    # Rotary: B=2 sequences of T=5 at positions 3..7, 4 query heads and 2 key/value heads of 8.
    B, T, NH, KVH, hs, theta, first = 2, 5, 4, 2, 8, 10000.0, 3
    W = NH * hs + 2 * KVH * hs
    qkv = torch.tensor(f32(rand(B * T, W)), dtype=d, requires_grad=True)
    dqkv = rand(B * T, W)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=d) / hs))
    freqs = torch.outer(torch.arange(first, first + T, dtype=d), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(t):
        return torch.cat((-t[..., hs // 2:], t[..., : hs // 2]), dim=-1)

    rows = qkv.view(B, T, W)
    q = rows[..., : NH * hs].reshape(B, T, NH, hs)
    k = rows[..., NH * hs : NH * hs + KVH * hs].reshape(B, T, KVH, hs)
    v = rows[..., NH * hs + KVH * hs :]
    c, s_ = cos[None, :, None, :], sin[None, :, None, :]
    q_rot = q * c + rotate_half(q) * s_
    k_rot = k * c + rotate_half(k) * s_
    out = torch.cat((q_rot.reshape(B, T, -1), k_rot.reshape(B, T, -1), v), dim=-1).reshape(B * T, W)
    out.backward(dqkv)
    records += [
        ("rope.dims", np.array([B, T, NH, KVH, hs, first], dtype=np.int32)),
        ("rope.theta", np.array([theta], dtype=np.float32)),
        ("rope.qkv", f32(qkv)), ("rope.dout", f32(dqkv)),
        ("rope.out", f32(out)), ("rope.dinp", f32(qkv.grad)),
    ]

    # SwiGLU over rows of the gate then the up-projection (H = 12), and ReLU^2.
    H = 12
    gu = torch.tensor(f32(3 * rand(N, 2 * H)), dtype=d, requires_grad=True)
    dout = rand(N, H)
    out = torch.nn.functional.silu(gu[:, :H]) * gu[:, H:]
    out.backward(dout)
    records += [("swiglu.inp", f32(gu)), ("swiglu.dout", f32(dout)),
                ("swiglu.out", f32(out)), ("swiglu.dinp", f32(gu.grad))]
    r = torch.tensor(f32(rand(N * H)), dtype=d, requires_grad=True)
    dout = rand(N * H)
    out = torch.relu(r).square()
    out.backward(dout)
    records += [("relu2.inp", f32(r)), ("relu2.dout", f32(dout)),
                ("relu2.out", f32(out)), ("relu2.dinp", f32(r.grad))]
    write_fixture(path, records)


def write_llama_fixture(path):
    """Llama-family models (and a ReLU^2 variant) in float64: loss and gradient in our layout."""
    d = torch.float64
    g = torch.Generator().manual_seed(4242)
    Vr, Vpr, Tr, Br, Lr, NHr, Cr = 101, 128, 16, 3, 2, 4, 64
    hs = Cr // NHr
    records = []
    models = [
        # name, kv heads, hidden, mlp, gains, tied, theta, QK-norm and embeddings' norm, eps
        ("llama", 2, 96, "swiglu", True, False, 10000.0, False, 1e-5),
        ("relu2", 4, 128, "relu2", False, True, 500.0, False, 1e-5),
        # modded-nanogpt's block of 2024-11-03 (F.rms_norm's eps: float32's epsilon), here with
        # two key/value heads for four queries so that q's and k's norms count heads apart.
        ("speedrun", 2, 128, "relu2", False, False, 10000.0, True, float(np.finfo(np.float32).eps)),
    ]
    for name, KVH, H, mlp, gains, tied, theta, qk_norm, eps in models:
        KV = KVH * hs
        FW = 2 * H if mlp == "swiglu" else H

        def rand(*shape, std=0.02):
            return torch.randn(*shape, generator=g, dtype=d) * std

        # Our layout's order (src/model/model.cpp's tensor_table).
        specs = [("wte", (Vpr, Cr))]
        if gains:
            specs.append(("ln1w", (Lr, Cr)))
        specs += [("qkvw", (Lr, Cr + 2 * KV, Cr)), ("attprojw", (Lr, Cr, Cr))]
        if gains:
            specs.append(("ln2w", (Lr, Cr)))
        specs += [("fcw", (Lr, FW, Cr)), ("fcprojw", (Lr, Cr, H))]
        if gains:
            specs.append(("lnfw", (Cr,)))
        if not tied:
            specs.append(("lmheadw", (Vpr, Cr)))
        p = {}
        for pname, shape in specs:
            p[pname] = (1.0 + rand(*shape, std=0.1)) if pname.startswith("ln") else rand(*shape)
        p["wte"][Vr:] = 0
        if not tied:
            p["lmheadw"][Vr:] = 0
        for t in p.values():
            t.requires_grad_(True)
        idx = torch.randint(0, Vr, (Br, Tr), generator=g)
        targets = torch.randint(0, Vr, (Br, Tr), generator=g)

        def rms(x, w):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return y * w if w is not None else y

        inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=d) / hs))
        emb = torch.outer(torch.arange(Tr, dtype=d), inv_freq)
        emb = torch.cat((emb, emb), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]

        def rotate_half(t):
            return torch.cat((-t[..., hs // 2:], t[..., : hs // 2]), dim=-1)

        def model_loss(lora=None):
            """The loss; with `lora` ({target: (A (L, r, in), B (L, out, r))}), PEFT's term
            scale * B(A(h)) added to each adapted projection's output (q, k and v are the rows of
            qkv, gate and up those of f)."""
            def adapted(h, l, names):
                return torch.cat([LORA_SCALE * (h @ lora[t][0][l].T) @ lora[t][1][l].T
                                  for t in names], dim=-1)

            x = p["wte"][idx]
            if qk_norm:  # the speedrun's norm of the embeddings
                x = rms(x, None)
            causal = torch.triu(torch.ones(Tr, Tr, dtype=torch.bool), 1)
            for l in range(Lr):
                h = rms(x, p["ln1w"][l] if gains else None)
                qkv = h @ p["qkvw"][l].T
                if lora is not None:
                    qkv = qkv + adapted(h, l, ("q_proj", "k_proj", "v_proj"))
                q = qkv[..., :Cr].view(Br, Tr, NHr, hs).transpose(1, 2)
                k = qkv[..., Cr:Cr + KV].view(Br, Tr, KVH, hs).transpose(1, 2)
                v = qkv[..., Cr + KV:].view(Br, Tr, KVH, hs).transpose(1, 2)
                if qk_norm:  # per head, before rotary
                    q, k = rms(q, None), rms(k, None)
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                k = k.repeat_interleave(NHr // KVH, dim=1)
                v = v.repeat_interleave(NHr // KVH, dim=1)
                att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
                att = att.masked_fill(causal, float("-inf")).softmax(-1)
                y = (att @ v).transpose(1, 2).reshape(Br, Tr, Cr)
                out = y @ p["attprojw"][l].T
                if lora is not None:
                    out = out + adapted(y, l, ("o_proj",))
                x = x + out
                h = rms(x, p["ln2w"][l] if gains else None)
                f = h @ p["fcw"][l].T
                if lora is not None:
                    f = f + adapted(h, l, ("gate_proj", "up_proj") if mlp == "swiglu" else
                                    ("up_proj",))
                a = F.silu(f[..., :H]) * f[..., H:] if mlp == "swiglu" else torch.relu(f).square()
                out = a @ p["fcprojw"][l].T
                if lora is not None:
                    out = out + adapted(a, l, ("down_proj",))
                x = x + out
            h = rms(x, p["lnfw"] if gains else None)
            logits = h @ (p["wte"] if tied else p["lmheadw"]).T
            return logits, F.cross_entropy(logits[..., :Vr].reshape(-1, Vr), targets.reshape(-1))

        logits, loss = model_loss()
        loss.backward()
        flat = torch.cat([p[n].detach().reshape(-1) for n, _ in specs])
        grads = torch.cat([p[n].grad.reshape(-1) for n, _ in specs])
        records += [
            (f"{name}.config", np.array([Tr, Vr, Vpr, Lr, NHr, Cr, KVH, H, Br, Tr], dtype=np.int32)),
            (f"{name}.theta", np.array([theta, eps], dtype=np.float32)),
            (f"{name}.params", flat.to(torch.float32).numpy()),
            (f"{name}.inputs", idx.to(torch.int32).numpy()),
            (f"{name}.targets", targets.to(torch.int32).numpy()),
            (f"{name}.logits", logits.detach()[..., :Vr].to(torch.float32).numpy()),
            (f"{name}.loss", np.array([loss.item()], dtype=np.float32)),
            (f"{name}.grads", grads.to(torch.float32).numpy()),
        ]
        if name in ("llama", "relu2"):
            records += llama_lora_records(name, model_loss, Cr, KV, H, mlp == "swiglu", Lr)
    write_fixture(path, records)


def llama_lora_records(name, model_loss, Cr, KV, H, gated, Lr):
    """An adapter of rank 4 on every projection PEFT's Llama names give (q_proj ... down_proj;
    no gate_proj without a gated MLP), the base frozen: the adapter in our layout (layer by layer,
    target by target in src/model/lora.hpp's order, A then B), the loss and the adapter's
    gradient. A as PEFT draws it, B random (PEFT's zero B would leave A's gradient zero). Drawn
    from a generator of its own, so the records before these keep their bytes."""
    d = torch.float64
    g = torch.Generator().manual_seed(4343 if gated else 4344)
    targets = [("q_proj", Cr, Cr), ("k_proj", Cr, KV), ("v_proj", Cr, KV), ("o_proj", Cr, Cr)]
    targets += [("gate_proj", Cr, H)] if gated else []
    targets += [("up_proj", Cr, H), ("down_proj", H, Cr)]
    lora = {}
    for target, fan_in, fan_out in targets:
        bound = 1.0 / math.sqrt(fan_in)
        a_mat = (torch.rand(Lr, LORA_RANK, fan_in, generator=g, dtype=d) * 2 - 1) * bound
        b_mat = torch.randn(Lr, fan_out, LORA_RANK, generator=g, dtype=d) * 0.1
        lora[target] = (a_mat.requires_grad_(True), b_mat.requires_grad_(True))
    _, loss = model_loss(lora)
    loss.backward()

    def layout(pick):
        return torch.cat([pick(lora[t][k])[l].reshape(-1) for l in range(Lr)
                          for t, _, _ in targets for k in (0, 1)])

    return [
        (f"{name}.lora.config", np.array([LORA_RANK, LORA_ALPHA], dtype=np.float32)),
        (f"{name}.lora", layout(lambda t: t.detach()).to(torch.float32).numpy()),
        (f"{name}.lora.loss", np.array([loss.item()], dtype=np.float32)),
        (f"{name}.lora.grads", layout(lambda t: t.grad).to(torch.float32).numpy()),
    ]


def bf16_round(a):
    """float64 -> the nearest bfloat16 (ties to even), as float64 and as raw uint16."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return (rounded.astype(np.uint32) << 16).view(np.float32).astype(np.float64), rounded


def write_safetensors(path, tensors):
    """[(name, uint16 BF16 array)] as a safetensors file, written by hand (no safetensors here)."""
    header, offset = {}, 0
    for name, raw in tensors:
        header[name] = {"dtype": "BF16", "shape": list(raw.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, raw in tensors:
            f.write(raw.astype("<u2").tobytes(order="C"))


def bytes_to_unicode():
    """GPT-2's printable spelling of each byte (vocab.json's and merges.txt's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    spelled = {b: chr(b) for b in keep}
    spelled.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return spelled


def small_byte_level_bpe(text, merges_wanted):
    """A byte-level BPE as SmolLM2 ships one: <|endoftext|> at id 0, the 256 bytes, then merges
    learned greedily from `text` (GPT-2-like pre-tokenization, ties to the smallest pair)."""
    import re
    spell = bytes_to_unicode()
    words = {}
    for w in re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", text):
        key = tuple(spell[b] for b in w.encode())
        words[key] = words.get(key, 0) + 1
    vocab = ["<|endoftext|>"] + [spell[b] for b in range(256)]
    merges = []
    for _ in range(merges_wanted):
        pairs = {}
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(f"{a} {b}")
        vocab.append(a + b)
        merged = {}
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return vocab, merges


def write_hf_llama_standin(directory, fixture):
    """A stand-in for a downloaded Llama-family Hugging Face directory (SmolLM2's layout: config.json
    of LlamaForCausalLM, BF16 model.safetensors with Hugging Face's tensor names, tied embeddings,
    grouped-query attention), random and tiny; and the logits LlamaForCausalLM's forward gives for a
    batch, written from its definition in float64 over the BF16 weights."""
    g = torch.Generator().manual_seed(6060)
    corpus = (Path(__file__).resolve().parent.parent / "data" / "tinyshakespeare.txt").read_text()
    vocab, merges = small_byte_level_bpe(corpus[:200000], 43)
    V, C, L, NH, KVH, H, T, theta, eps = len(vocab), 64, 2, 4, 2, 160, 12, 100000.0, 1e-5
    hs, KV = C // NH, KVH * C // NH
    names = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        q = f"model.layers.{l}."
        names += [(q + "input_layernorm.weight", (C,)), (q + "self_attn.q_proj.weight", (C, C)),
                  (q + "self_attn.k_proj.weight", (KV, C)), (q + "self_attn.v_proj.weight", (KV, C)),
                  (q + "self_attn.o_proj.weight", (C, C)),
                  (q + "post_attention_layernorm.weight", (C,)),
                  (q + "mlp.gate_proj.weight", (H, C)), (q + "mlp.up_proj.weight", (H, C)),
                  (q + "mlp.down_proj.weight", (C, H))]
    names.append(("model.norm.weight", (C,)))
    w, raw = {}, []
    for name, shape in names:
        norm = name.endswith("norm.weight")
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * (0.1 if norm else 0.12)
        value, bits = bf16_round((1.0 + t if norm else t).numpy())
        w[name] = torch.from_numpy(value)
        raw.append((name, bits))
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / "model.safetensors", raw)
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False,
              "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu",
              "hidden_size": C, "initializer_range": 0.02, "intermediate_size": H,
              "max_position_embeddings": 64, "model_type": "llama", "num_attention_heads": NH,
              "num_hidden_layers": L, "num_key_value_heads": KVH, "pretraining_tp": 1,
              "rms_norm_eps": eps, "rope_scaling": None, "rope_theta": theta,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
              "vocab_size": V}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # The tokenizer as SmolLM2's directory has it: vocab.json + merges.txt, and tokenizer.json
    # whose pre-tokenizer splits digits one by one before the byte-level regex.
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    tokenizer = {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(vocab)}, "merges": merges},
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    idx = torch.randint(0, V, (1, T), generator=g)

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    emb = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((emb, emb), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]

    def rotate_half(t):
        return torch.cat((-t[..., hs // 2:], t[..., : hs // 2]), dim=-1)

    x = w["model.embed_tokens.weight"][idx]
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        q_ = f"model.layers.{l}."
        h = rms(x, w[q_ + "input_layernorm.weight"])
        q = (h @ w[q_ + "self_attn.q_proj.weight"].T).view(1, T, NH, hs).transpose(1, 2)
        k = (h @ w[q_ + "self_attn.k_proj.weight"].T).view(1, T, KVH, hs).transpose(1, 2)
        v = (h @ w[q_ + "self_attn.v_proj.weight"].T).view(1, T, KVH, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(causal, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(1, T, C)
        x = x + y @ w[q_ + "self_attn.o_proj.weight"].T
        h = rms(x, w[q_ + "post_attention_layernorm.weight"])
        gate, up = h @ w[q_ + "mlp.gate_proj.weight"].T, h @ w[q_ + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[q_ + "mlp.down_proj.weight"].T
    logits = rms(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T
    write_fixture(fixture, [("inputs", idx[0].to(torch.int32).numpy()),
                            ("logits", logits[0].to(torch.float32).numpy())])


def write_fixture(path, records):
    """Serialize [(name, np.ndarray)] in the GPT2REF1 format."""
    dtypes = {np.dtype(np.float32): 0, np.dtype(np.int32): 1}
    with open(path, "wb") as f:
        f.write(b"GPT2REF1")
        f.write(struct.pack("<I", len(records)))
        for name, arr in records:
            # Not np.ascontiguousarray: it turns 0-d scalars into shape (1,).
            arr = np.asarray(arr)
            raw_name = name.encode("ascii")
            f.write(struct.pack("<I", len(raw_name)))
            f.write(raw_name)
            f.write(struct.pack("<II", dtypes[arr.dtype], arr.ndim))
            f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C"))


def write_dropout_fixture(path):
    """The same model and batch with dropout: masks, loss and gradient."""
    torch.manual_seed(SEED)
    params = init_params()
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    params0 = flatten(params)
    masks = dropout_masks()
    _, loss = forward(params, idx, targets, masks=masks)
    loss.backward()
    grads = flatten({n: t.grad for n, t in params.items()})

    def f32(t):
        return np.asarray(t.detach().numpy(), dtype=np.float32)

    records = [
        ("config", np.array([MAX_T, V, VP, L, NH, C, B, T], dtype=np.int32)),
        ("dropout.rate", np.array(DROPOUT_RATE, dtype=np.float32)),
        ("dropout.key", np.array([DROPOUT_SEED, DROPOUT_STEP, DROPOUT_FIRST_SEQUENCE],
                                 dtype=np.int32)),
        ("params", f32(params0)),
        ("inputs", idx.numpy().astype(np.int32)),
        ("targets", targets.numpy().astype(np.int32)),
    ]
    records += [("mask." + site, f32(masks[site])) for site in SITES]
    records += [("loss", np.array(loss.item(), dtype=np.float32)), ("grads", f32(grads))]
    write_fixture(path, records)
    kept = {site: float(masks[site].mean()) for site in SITES}
    print(f"wrote {path} ({path.stat().st_size} bytes): loss {loss.item():.7f}, kept {kept}")


def write_masked_fixture(path):
    """The same model and batch with a loss mask: PyTorch's ignore_index, loss and gradient."""
    torch.manual_seed(SEED)
    params = init_params()
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    params0 = flatten(params)
    masked = targets.clone()
    masked[0, : T // 2] = -100  # sequence 0: a prompt, then the response
    masked[1, :] = -100  # sequence 1: nothing trained (contributes nothing)
    masked[2, 1::2] = -100  # sequence 2: every other target
    _, loss = forward(params, idx, masked)  # F.cross_entropy's default ignore_index is -100
    loss.backward()
    grads = flatten({n: t.grad for n, t in params.items()})
    trained = int((masked != -100).sum())

    def f32(t):
        return np.asarray(t.detach().numpy(), dtype=np.float32)

    records = [
        ("config", np.array([MAX_T, V, VP, L, NH, C, B, T], dtype=np.int32)),
        ("params", f32(params0)),
        ("inputs", idx.numpy().astype(np.int32)),
        ("targets", masked.numpy().astype(np.int32)),
        ("trained", np.array(trained, dtype=np.int32)),
        ("loss", np.array(loss.item(), dtype=np.float32)),
        ("grads", f32(grads)),
    ]
    write_fixture(path, records)
    print(f"wrote {path} ({path.stat().st_size} bytes): loss {loss.item():.7f} over {trained} "
          f"trained targets")


def main():
    default_out = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpt2_reference.bin"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=default_out)
    args = parser.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # deterministic reductions
    torch.use_deterministic_algorithms(True)

    params = init_params()
    idx = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    params0 = flatten(params)

    # ---- forward + backward at the initial parameters, with activations ----
    acts = {}
    logits, loss = forward(params, idx, targets, acts)
    loss.backward()
    grads0 = flatten({n: t.grad for n, t in params.items()})
    assert torch.all(grads0[V * C : VP * C] == 0), "padded wte rows must get zero gradient"
    for n in params:
        params[n].grad = None

    # ---- AdamW with clipping on the same batch ----
    names = [n for n, _, _ in PARAM_SPECS]
    optimizer = torch.optim.AdamW(
        [
            {"params": [params[n] for n in names if n in DECAYED], "weight_decay": WEIGHT_DECAY},
            {"params": [params[n] for n in names if n not in DECAYED], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(BETA1, BETA2),
        eps=ADAM_EPS,
        foreach=False,
    )
    losses, norms = [], []
    for step in range(ADAM_STEPS):
        optimizer.zero_grad(set_to_none=True)
        _, step_loss = forward(params, idx, targets)
        step_loss.backward()
        # clip_grad_norm_ returns the pre-clip total L2 norm and scales by
        # min(1, max_norm / (norm + 1e-6)).
        norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], MAX_GRAD_NORM)
        losses.append(step_loss.item())
        norms.append(norm.item())
        optimizer.step()
    assert norms[0] > MAX_GRAD_NORM, "max_grad_norm must be low enough that step 1 clips"
    assert losses[0] == loss.item()
    params_after = flatten(params)
    assert torch.all(params_after[V * C : VP * C] == 0), "padded wte rows must stay zero"

    def f32(t):
        return np.asarray(t.detach().numpy(), dtype=np.float32)

    def stacked(name):  # per-layer list -> (L,B,T,X)
        return f32(torch.stack(acts[name]))

    records = [
        ("config", np.array([MAX_T, V, VP, L, NH, C, B, T], dtype=np.int32)),
        ("params", f32(params0)),
        ("inputs", idx.numpy().astype(np.int32)),
        ("targets", targets.numpy().astype(np.int32)),
        ("logits", f32(logits)),
        ("loss", np.array(loss.item(), dtype=np.float32)),
        ("grads", f32(grads0)),
        ("act.encoded", f32(acts["encoded"])),
    ]
    for name in ["ln1", "qkv", "atty", "attproj", "residual2", "ln2", "fch", "fch_gelu",
                 "fcproj", "residual3"]:
        records.append(("act." + name, stacked(name)))
    records += [
        ("act.lnf", f32(acts["lnf"])),
        ("adamw.hparams",
         np.array([LR, BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, MAX_GRAD_NORM], dtype=np.float32)),
        ("adamw.losses", np.array(losses, dtype=np.float32)),
        ("adamw.grad_norms", np.array(norms, dtype=np.float32)),
        ("adamw.params_after", f32(params_after)),
    ]

    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_fixture(args.output, records)
    write_dropout_fixture(args.output.parent / "gpt2_dropout_reference.bin")
    write_masked_fixture(args.output.parent / "gpt2_masked_reference.bin")
    write_lora_fixture(args.output.parent / "gpt2_lora_reference.bin")
    write_muon_fixture(args.output.parent / "gpt2_muon_reference.bin")
    write_block_kernels_fixture(args.output.parent / "block_kernels_reference.bin")
    write_llama_fixture(args.output.parent / "llama_reference.bin")
    write_hf_llama_standin(args.output.parent / "hf_llama_standin",
                           args.output.parent / "hf_llama_standin_logits.bin")
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes, {len(records)} records)")
    for name, arr in records:
        print(f"  {name:20s} {'int32' if arr.dtype == np.int32 else 'float32'} {list(arr.shape)}")
    print(f"  num_params {params0.numel()}")
    print(f"  loss {loss.item():.7f}")
    print(f"  adamw losses     {[f'{x:.7f}' for x in losses]}")
    print(f"  adamw grad norms {[f'{x:.7f}' for x in norms]}")


if __name__ == "__main__":
    main()
