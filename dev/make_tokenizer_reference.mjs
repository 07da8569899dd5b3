#!/usr/bin/env node
// Writes GPT-2 token ids of a UTF-8 text file, computed by js-tiktoken (an implementation
// independent of ours), as little-endian uint16: the expected ids for tests/test_gpt2_tokenizer.cpp.
//
//   node dev/make_tokenizer_reference.mjs INPUT.txt OUTPUT.u16 [--ordinary]
//
// js-tiktoken is not a dependency of the repository: it is loaded from $TOKREF_DIR (default
// /tmp/tokref) and installed there with npm when missing. <|endoftext|> in the text is encoded as
// the special token 50256 (encode(text, "all"), our --eot-in-text token), or with --ordinary as
// ordinary text (tiktoken's encode_ordinary, llm.c's convention, our --eot-in-text text).
// JavaScript strings cannot hold invalid UTF-8, so the input must be valid UTF-8.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const JS_TIKTOKEN_VERSION = "1.0.21";

function loadJsTiktoken() {
  const dir = process.env.TOKREF_DIR || "/tmp/tokref";
  if (!existsSync(join(dir, "node_modules", "js-tiktoken"))) {
    mkdirSync(dir, { recursive: true });
    execFileSync(
      "npm",
      ["install", "--prefix", dir, "--no-audit", "--no-fund", `js-tiktoken@${JS_TIKTOKEN_VERSION}`],
      { stdio: ["ignore", "ignore", "inherit"] },
    );
  }
  return createRequire(join(dir, "package.json"))("js-tiktoken");
}

const [input, output, mode] = process.argv.slice(2);
if (!input || !output || (mode !== undefined && mode !== "--ordinary")) {
  console.error("usage: node dev/make_tokenizer_reference.mjs INPUT.txt OUTPUT.u16 [--ordinary]");
  process.exit(2);
}
const bytes = readFileSync(input);
const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
const { getEncoding } = loadJsTiktoken();
const encoding = getEncoding("gpt2");
const ids = mode === "--ordinary" ? encoding.encode(text, [], []) : encoding.encode(text, "all");
if (encoding.decode(ids) !== text) {
  console.error(`${input}: js-tiktoken does not round-trip this text`);
  process.exit(1);
}
const out = Buffer.alloc(2 * ids.length);
ids.forEach((id, i) => out.writeUInt16LE(id, 2 * i));
writeFileSync(output, out);
console.error(`${input}: ${ids.length} GPT-2 tokens -> ${output}`);
