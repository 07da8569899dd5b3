#!/usr/bin/env python3
"""An independent Hugging Face GPT-2 reader and writer for the format tests, written from the
safetensors layout (8-byte header length, JSON header, raw little-endian data) and transformers'
GPT-2 conventions (Conv1D weights stored (in, out), y = x @ W + b; tanh GELU; LayerNorm eps 1e-5;
lm_head tied to wte). NumPy only; nothing of gpt2-mpi is imported.

  hf_gpt2_reference.py logits DIR TOKENS OUT   logits (T, vocab) float32 of the int32 tokens
  hf_gpt2_reference.py tokenize DIR TEXT OUT   int32 tokens of the text file by DIR's vocab.json
                                               and merges.txt, as transformers' GPT2Tokenizer
  hf_gpt2_reference.py write LLMC_FILE DIR     DIR as the Hub stores GPT-2: no "transformer."
                                               prefix, mask buffers, lm_head, two shards + index
"""
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        dtype = info["dtype"]
        if dtype == "F32":
            array = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            array = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: {name} has dtype {dtype}")
        tensors[name] = array.reshape(info["shape"])
    return tensors


def read_model(directory):
    config = json.load(open(os.path.join(directory, "config.json")))
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for file in files:
        for name, array in read_safetensors(os.path.join(directory, file)).items():
            tensors[name.removeprefix("transformer.")] = array.astype(np.float64)
    return config, tensors


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def logits(directory, tokens, delta=lambda module, x: 0.0):
    """delta(module, x): what an adapter adds to the output of Conv1D `module` ("h.0.attn.c_attn")."""
    config, p = read_model(directory)
    C, H = config["n_embd"], config["n_head"]
    T = len(tokens)
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(config["n_layer"]):
        q = lambda name: p[f"h.{layer}.{name}"]
        conv1d = lambda name, x: x @ q(name + ".weight") + q(name + ".bias") + delta(f"h.{layer}.{name}", x)
        h = layer_norm(x, q("ln_1.weight"), q("ln_1.bias"))
        qkv = conv1d("attn.c_attn", h)
        heads = [qkv[:, i * C : (i + 1) * C].reshape(T, H, C // H).transpose(1, 0, 2) for i in range(3)]
        scores = heads[0] @ heads[1].transpose(0, 2, 1) / np.sqrt(C // H) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attended = (scores @ heads[2]).transpose(1, 0, 2).reshape(T, C)
        x = x + conv1d("attn.c_proj", attended)
        h = layer_norm(x, q("ln_2.weight"), q("ln_2.bias"))
        x = x + conv1d("mlp.c_proj", gelu_new(conv1d("mlp.c_fc", h)))
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    head = p.get("lm_head.weight", p["wte.weight"])
    return (x @ head.T).astype(np.float32)


def bytes_to_unicode():
    """GPT-2's printable spelling of each byte (transformers' bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    spelled, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


def bpe(word, ranks):
    """transformers' GPT2Tokenizer.bpe: merge the lowest-ranked adjacent pair until none is left."""
    word = list(word)
    while len(word) > 1:
        pairs = [(ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(word, word[1:]))]
        rank, i = min(pairs)
        if rank == float("inf"):
            break
        first, second = word[i], word[i + 1]
        merged, j = [], 0
        while j < len(word):
            if j + 1 < len(word) and word[j] == first and word[j + 1] == second:
                merged.append(first + second)
                j += 2
            else:
                merged.append(word[j])
                j += 1
        word = merged
    return word


def tokenize(directory, text):
    vocab = json.load(open(os.path.join(directory, "vocab.json"), encoding="utf-8"))
    lines = open(os.path.join(directory, "merges.txt"), encoding="utf-8").read().split("\n")[1:-1]
    ranks = {tuple(line.split()): rank for rank, line in enumerate(lines)}
    spelled = bytes_to_unicode()
    if ranks:
        # GPT-2's pre-tokenizer needs Unicode classes (the regex module), which merges make matter.
        import regex

        words = regex.findall(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""", text)
    else:
        # Without merges every byte is a token whatever the pre-tokenizer splits: one word.
        words = [text]
    ids = []
    for word in words:
        for token in bpe("".join(spelled[b] for b in word.encode("utf-8")), ranks):
            ids.append(vocab[token])  # KeyError: a byte the vocabulary has no token for
    return np.array(ids, dtype="<i4")


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_hub_layout(llmc_file, directory):
    raw = open(llmc_file, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240326 and header[1] == 3, "an llm.c fp32 model file"
    maxT, V, L, H, C, Vp = (int(v) for v in header[2:8])
    params = np.frombuffer(raw[1024:], dtype="<f4")
    sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
             L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C, C, C]
    chunks, at = [], 0
    for size in sizes:
        chunks.append(params[at : at + size])
        at += size
    wte, wpe, ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb = chunks
    tensors = {"wte.weight": wte.reshape(Vp, C)[:V], "wpe.weight": wpe.reshape(maxT, C)}
    for l in range(L):
        t = f"h.{l}."
        tensors[t + "ln_1.weight"] = ln1w.reshape(L, C)[l]
        tensors[t + "ln_1.bias"] = ln1b.reshape(L, C)[l]
        tensors[t + "attn.bias"] = np.tril(np.ones((maxT, maxT), dtype=np.float32)).reshape(1, 1, maxT, maxT)
        tensors[t + "attn.c_attn.weight"] = qkvw.reshape(L, 3 * C, C)[l].T  # Conv1D: (in, out)
        tensors[t + "attn.c_attn.bias"] = qkvb.reshape(L, 3 * C)[l]
        tensors[t + "attn.c_proj.weight"] = projw.reshape(L, C, C)[l].T
        tensors[t + "attn.c_proj.bias"] = projb.reshape(L, C)[l]
        tensors[t + "ln_2.weight"] = ln2w.reshape(L, C)[l]
        tensors[t + "ln_2.bias"] = ln2b.reshape(L, C)[l]
        tensors[t + "mlp.c_fc.weight"] = fcw.reshape(L, 4 * C, C)[l].T
        tensors[t + "mlp.c_fc.bias"] = fcb.reshape(L, 4 * C)[l]
        tensors[t + "mlp.c_proj.weight"] = fcprojw.reshape(L, C, 4 * C)[l].T
        tensors[t + "mlp.c_proj.bias"] = fcprojb.reshape(L, C)[l]
    tensors["ln_f.weight"] = lnfw
    tensors["ln_f.bias"] = lnfb
    tensors["lm_head.weight"] = tensors["wte.weight"]
    os.makedirs(directory, exist_ok=True)
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for file, members in shards.items():
        write_safetensors(os.path.join(directory, file), {n: tensors[n] for n in members})
        weight_map.update({n: file for n in members})
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(directory, "model.safetensors.index.json"), "w"))
    json.dump({"model_type": "gpt2", "n_embd": C, "n_head": H, "n_layer": L, "n_positions": maxT, "n_ctx": maxT,
               "vocab_size": V, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
               "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
              open(os.path.join(directory, "config.json"), "w"))


if __name__ == "__main__":
    if sys.argv[1] == "logits":
        tokens = np.fromfile(sys.argv[3], dtype="<i4")
        logits(sys.argv[2], tokens).tofile(sys.argv[4])
    elif sys.argv[1] == "tokenize":
        text = open(sys.argv[3], encoding="utf-8", newline="").read()
        tokenize(sys.argv[2], text).tofile(sys.argv[4])
    elif sys.argv[1] == "write":
        write_hub_layout(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
