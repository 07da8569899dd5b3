#!/usr/bin/python3
"""Our --precision bf16 against PyTorch's autocast on the same weights and tokens.

From one checkpoint of ours (the weights of a trained model give realistic activations), on token
shards written by build/prepare_data: the validation loss over the first --val-tokens of the
validation shards (the windows train_gpt2 --val-every evaluates) and the first training step's
loss and gradient norm (train_gpt2 --no-shuffle takes windows 0 .. B-1 of the training shards),
computed four ways: ours in fp32 and bf16 (train_gpt2 --max-steps 1, figures from its
--metrics-file), PyTorch in fp32 and under torch.autocast("cpu", dtype=torch.bfloat16) (a GPT-2
written out below on the weights convert_model exports as llm.c's model file). It prints each
figure and the relative differences; ours in bf16 against autocast is the parity asked of bf16.

  dev/bf16_parity.py --checkpoint out-d6/model_000150.bin --shards data/shards \\
      [--seq-len 256] [--batch-size 8] [--val-tokens 8192] [--build build]

A checkpoint of the Llama family (--model llama-tiny, the speedrun's block has no Hugging Face
form) is exported as LlamaForCausalLM (convert_model --to hf) and computed as Hugging Face's
definition does it (RMSNorm in float32, rotary by halves, grouped-query heads, SwiGLU).

A measurement, not a test (CI has no PyTorch): docs/performance.md quotes its output.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def read_llmc_model(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240326 or header[1] != 3:
        sys.exit(f"{path}: not an fp32 llm.c model file (magic {header[0]}, version {header[1]})")
    max_t, vocab, layers, heads, channels, padded = (int(x) for x in header[2:8])
    data = np.fromfile(path, dtype=np.float32, offset=256 * 4)
    C, L = channels, layers
    shapes = [("wte", (padded, C)), ("wpe", (max_t, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
              ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
              ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    params, at = {}, 0
    for name, shape in shapes:
        count = int(np.prod(shape))
        params[name] = torch.from_numpy(data[at:at + count].reshape(shape).copy())
        at += count
    if at != data.size:
        sys.exit(f"{path}: {data.size} floats, the header's shapes take {at}")
    return params, dict(max_t=max_t, vocab=vocab, layers=L, heads=heads, channels=C)


def read_hf_llama(directory):
    """LlamaForCausalLM's config.json and its F32 model.safetensors (as convert_model writes)."""
    cfg = json.loads((directory / "config.json").read_text())
    raw = (directory / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    params = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{directory}: tensor {name} is {info['dtype']}, not F32")
        begin, end = info["data_offsets"]
        data = np.frombuffer(raw[8 + size + begin:8 + size + end], dtype=np.float32)
        params[name] = torch.from_numpy(data.reshape(info["shape"]).copy())
    return params, cfg


def read_shards(pattern):
    tokens = []
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype=np.int32, count=256)
        tokens.append(np.fromfile(path, dtype=np.uint16, offset=256 * 4, count=int(header[2])))
    if not tokens:
        sys.exit(f"no shards match {pattern}")
    return np.concatenate(tokens).astype(np.int64)


def windows(tokens, first, count, T):
    """Windows first .. first+count-1 of T inputs, each with its next token as the last target."""
    rows = [tokens[w * T:w * T + T + 1] for w in range(first, first + count)]
    batch = torch.from_numpy(np.stack(rows))
    return batch[:, :-1], batch[:, 1:]


def gpt2_loss(p, cfg, idx, targets):
    B, T = idx.shape
    C, NH = cfg["channels"], cfg["heads"]
    x = p["wte"][idx] + p["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["layers"]):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
        qkv = F.linear(h, p["qkvw"][l], p["qkvb"][l])
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / (C // NH) ** 0.5)
        att = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
        h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], 1e-5)
    logits = F.linear(x, p["wte"][:cfg["vocab"]])
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def llama_loss(p, cfg, idx, targets):
    """Hugging Face's LlamaForCausalLM forward: RMSNorm computed in float32 (LlamaRMSNorm),
    rotary positions by halves, grouped-query attention, SwiGLU, the head tied or lm_head."""
    B, T = idx.shape
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    KVH, hs, eps = cfg.get("num_key_value_heads", NH), C // NH, cfg["rms_norm_eps"]
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hs, 2).float() / hs))
    angles = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()

    def rms(x, w):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return w * x.to(dtype)

    def rotate(t):
        return t * cos.to(t.dtype) + torch.cat((-t[..., hs // 2:], t[..., :hs // 2]), -1) * \
            sin.to(t.dtype)

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = p["model.embed_tokens.weight"][idx]
    for l in range(cfg["num_hidden_layers"]):
        w = {k.split(f"model.layers.{l}.")[1]: v for k, v in p.items()
             if k.startswith(f"model.layers.{l}.")}
        h = rms(x, w["input_layernorm.weight"])
        q = F.linear(h, w["self_attn.q_proj.weight"]).view(B, T, NH, hs).transpose(1, 2)
        k = F.linear(h, w["self_attn.k_proj.weight"]).view(B, T, KVH, hs).transpose(1, 2)
        v = F.linear(h, w["self_attn.v_proj.weight"]).view(B, T, KVH, hs).transpose(1, 2)
        q, k = rotate(q), rotate(k)
        k, v = k.repeat_interleave(NH // KVH, 1), v.repeat_interleave(NH // KVH, 1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / hs ** 0.5)
        att = F.softmax(scores.masked_fill(~causal, float("-inf")).float(), dim=-1).to(q.dtype)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, w["self_attn.o_proj.weight"])
        h = rms(x, w["post_attention_layernorm.weight"])
        gate, up = F.linear(h, w["mlp.gate_proj.weight"]), F.linear(h, w["mlp.up_proj.weight"])
        x = x + F.linear(F.silu(gate) * up, w["mlp.down_proj.weight"])
    x = rms(x, p["model.norm.weight"])
    logits = F.linear(x, p.get("lm_head.weight", p["model.embed_tokens.weight"]))
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def pytorch_figures(params, cfg, val, train, autocast):
    model_loss = llama_loss if "hidden_size" in cfg else gpt2_loss
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.no_grad():  # one window at a time, summed in window order, as ours does
            val_loss = sum(model_loss(params, cfg, val[0][i:i + 1], val[1][i:i + 1]).item()
                           for i in range(val[0].shape[0])) / val[0].shape[0]
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        loss = model_loss(leaves, cfg, *train)
    loss.backward()
    norm = torch.sqrt(sum((v.grad.double() ** 2).sum() for v in leaves.values())).item()
    return dict(val_loss=val_loss, loss=loss.item(), grad_norm=norm)


def our_figures(args, precision, work):
    metrics = work / f"{precision}.jsonl"
    command = [str(Path(args.build) / "train_gpt2"), "--init-from", args.checkpoint,
               "--train-data", str(Path(args.shards) / "*_train_*.bin"),
               "--val-data", str(Path(args.shards) / "*_val_*.bin"),
               "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
               "--threads", "2", "--max-steps", "1", "--val-every", "1",
               "--val-tokens", str(args.val_tokens), "--no-shuffle", "--precision", precision,
               "--checkpoint-every", "0", "--sample-every", "0",
               "--out-dir", str(work / precision), "--metrics-file", str(metrics)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    val = next(r for r in records if r["type"] == "val" and r["step"] == 0)
    step = next(r for r in records if r["type"] == "train")
    return dict(val_loss=val["val_loss"], loss=step["loss"], grad_norm=step["grad_norm"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--shards", required=True, help="directory of prepare_data's shards")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--val-tokens", type=int, default=8192)
    parser.add_argument("--build", default="build")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="gpt2-bf16-parity-") as tmp:
        work = Path(tmp)
        # GPT-2 as llm.c's model file; the Llama family as LlamaForCausalLM.
        llmc = subprocess.run([str(Path(args.build) / "convert_model"), args.checkpoint,
                               str(work / "model.bin"), "--to", "llmc"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if llmc.returncode == 0:
            params, cfg = read_llmc_model(work / "model.bin")
        else:
            subprocess.run([str(Path(args.build) / "convert_model"), args.checkpoint,
                            str(work / "hf"), "--to", "hf"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            params, cfg = read_hf_llama(work / "hf")
        T = args.seq_len
        val = windows(read_shards(str(Path(args.shards) / "*_val_*.bin")), 0,
                      args.val_tokens // T, T)
        train = windows(read_shards(str(Path(args.shards) / "*_train_*.bin")), 0,
                        args.batch_size, T)  # one rank: its --batch-size is the whole step
        figures = {"ours fp32": our_figures(args, "fp32", work),
                   "ours bf16": our_figures(args, "bf16", work),
                   "PyTorch fp32": pytorch_figures(params, cfg, val, train, False),
                   "PyTorch autocast": pytorch_figures(params, cfg, val, train, True)}
    keys = ["val_loss", "loss", "grad_norm"]
    print(f"{'':18}" + "".join(f"{k:>14}" for k in keys))
    for name, f in figures.items():
        print(f"{name:18}" + "".join(f"{f[k]:14.6f}" for k in keys))
    print("relative differences")
    for a, b in [("ours bf16", "PyTorch autocast"), ("ours bf16", "PyTorch fp32"),
                 ("PyTorch autocast", "PyTorch fp32"), ("ours fp32", "PyTorch fp32")]:
        diffs = "".join(f"{abs(figures[a][k] - figures[b][k]) / abs(figures[b][k]):14.2e}"
                        for k in keys)
        print(f"{a + ' vs ' + b:38}{diffs}")


if __name__ == "__main__":
    main()
