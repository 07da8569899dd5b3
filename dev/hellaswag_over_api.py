#!/usr/bin/python3
"""HellaSwag (or any llm.c multiple-choice file) scored through build/serve's OpenAI API, as
lm-evaluation-harness's local-completions model scores loglikelihood tasks: each ending's tokens
after the context, sent as token ids with echo, max_tokens 0 and logprobs, their mean negative
log-probability compared; acc_norm is the share of examples whose lowest mean is the label (the
first of equal means wins, as train_gpt2 --hellaswag counts). Examples the server refuses as longer
than its context are left out and counted.

  dev/hellaswag_over_api.py [--url http://127.0.0.1:8080] [--api-key KEY] FILE
"""
import argparse
import json
import struct
import sys
import urllib.error
import urllib.request

MAGIC = 20240522


def read_examples(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack_from("<256i", data, 0)
    if header[0] != MAGIC:
        sys.exit(f"{path}: not an llm.c multiple-choice file (magic {header[0]})")
    count = header[2]
    words = struct.unpack_from(f"<{(len(data) - 1024) // 2}H", data, 1024)
    at, examples = 0, []
    for _ in range(count):
        if words[at] != 65535:
            sys.exit(f"{path}: example {len(examples)} does not start with the delimiter")
        label, endings = words[at + 3], words[at + 4]
        at += 5
        n = words[at]
        context = list(words[at + 1:at + 1 + n])
        at += 1 + n
        options = []
        for _ in range(endings):
            n = words[at]
            options.append(list(words[at + 1:at + 1 + n]))
            at += 1 + n
        examples.append((label, context, options))
    return examples


def mean_loss(url, key, context, ending):
    body = json.dumps({"prompt": context + ending, "max_tokens": 0, "echo": True,
                       "logprobs": 0, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            logprobs = json.load(response)["choices"][0]["logprobs"]["token_logprobs"]
    except urllib.error.HTTPError as error:
        if error.code == 400:
            return None  # longer than the server's context
        raise
    begin = max(len(context), 1)
    scored = logprobs[begin:len(context) + len(ending)]
    return -sum(scored) / len(scored) if scored else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default="")
    args = parser.parse_args()
    correct = scored = too_long = 0
    for label, context, endings in read_examples(args.file):
        losses = [mean_loss(args.url, args.api_key, context, e) for e in endings]
        if any(loss is None for loss in losses):
            too_long += 1
            continue
        scored += 1
        correct += int(losses.index(min(losses)) == label)
    accuracy = correct / scored if scored else 0.0
    print(f"hellaswag acc_norm {accuracy:.4f} ({correct}/{scored}"
          + (f", {too_long} longer than the server's context left out" if too_long else "") + ")")


if __name__ == "__main__":
    main()
