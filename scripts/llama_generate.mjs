// llama_generate.sh's generation in llama.cpp (node-llama-cpp): the script checks the command line
// and finds the package, then runs this with LLAMA_GENERATE_* set (MODULES: the node_modules
// folder; MODEL, LORA (an adapter's GGUF, or empty), PROMPT, MAX_NEW_TOKENS, TEMPERATURE, TOP_K, TOP_P, SEED, THREADS).
// Tokens are decoded from the vocabulary's own spelling (GPT-2's printable bytes for a byte-level
// BPE) rather than by llama.cpp's detokenizer, which also "cleans up" spaces before punctuation
// and so would change the text.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const env = process.env;
const fail = (message) => {
  process.stderr.write(`llama_generate.sh: ${message}\n`);
  process.exit(1);
};
const { getLlama } = await import(
  pathToFileURL(join(env.LLAMA_GENERATE_MODULES, "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
// node-llama-cpp warns on the console about a file it then fails to load: held back, so that a bad
// file is one error line, and shown when the model loads after all.
const warnings = [];
const warn = console.warn;
console.warn = (...args) => warnings.push(args.join(" "));
let model;
try {
  model = await llama.loadModel({ modelPath: env.LLAMA_GENERATE_MODEL });
} catch (error) {
  fail(`${env.LLAMA_GENERATE_MODEL}: llama.cpp cannot load it: ${error.message}`);
}
console.warn = warn;
for (const line of warnings) console.warn(line);

// GPT-2's byte alphabet: each byte as a printable code point (printable Latin-1 as itself).
const byteOf = new Map();
for (let b = 0, extra = 256; b < 256; ++b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  byteOf.set(printable ? b : extra++, b);
}
const byteLevel = model.vocabularyType === "bpe";
const tokenBytes = (token) => {
  if (!byteLevel) return Buffer.from(model.detokenize([token], true), "utf8");
  const text = model._model.getTokenString(token) ?? "";
  const bytes = [];
  for (const ch of text) {
    const b = byteOf.get(ch.codePointAt(0));
    if (b !== undefined) bytes.push(b);
    else bytes.push(...Buffer.from(ch, "utf8"));
  }
  return Buffer.from(bytes);
};

const contextSize = model.trainContextSize;
const promptText = env.LLAMA_GENERATE_PROMPT;
// Like inference: a literal <|endoftext|> is the end-of-text token; no prompt starts from the
// model's bos (for our files, the end-of-text token, or a char model's newline).
let prompt = model.tokenize(promptText, true);
if (prompt.length === 0) {
  // The file's own bos id: node-llama-cpp's tokens.bos is null unless it is a control token.
  const bos = model.fileInfo?.metadata?.tokenizer?.ggml?.bos_token_id ?? model.tokens.bos;
  if (bos == null) fail("the model has no bos token to start from: pass --prompt TEXT");
  prompt = [Number(bos)];
}
if (prompt.length > contextSize) {
  process.stderr.write(`llama_generate.sh: ${prompt.length} prompt tokens, only the last ${contextSize} fit the context\n`);
  prompt = prompt.slice(prompt.length - contextSize);
}
// As inference's --threads 0: one thread for a model under 16M parameters (more threads only wait
// for each other on so little work), else llama.cpp's choice.
const parameters = model._model.getTotalParameters?.() ?? model.size / 2;
const threads = Number(env.LLAMA_GENERATE_THREADS) || (parameters < 16e6 ? 1 : 0);
const lora = env.LLAMA_GENERATE_LORA
  ? { lora: { adapters: [{ filePath: env.LLAMA_GENERATE_LORA, scale: 1 }] } }
  : {};
// llama.cpp says why an adapter does not fit on the console: held back into the one error line.
const held = [];
const [consoleWarn, consoleError] = [console.warn, console.error];
if (env.LLAMA_GENERATE_LORA) console.warn = console.error = (...args) => held.push(args.join(" "));
let context;
try {
  context = await model.createContext({ contextSize, ...(threads > 0 ? { threads } : {}), ...lora });
} catch (error) {
  if (!env.LLAMA_GENERATE_LORA) throw error;
  const why = held.map((line) => line.replace(/^\[node-llama-cpp\]\s*/, "").trim()).join("; ");
  fail(`--lora ${env.LLAMA_GENERATE_LORA}: llama.cpp cannot apply it to ${env.LLAMA_GENERATE_MODEL}: ${why || error.message}`);
}
[console.warn, console.error] = [consoleWarn, consoleError];
for (const line of held) console.warn(line);
const sequence = context.getSequence();
const count = Number(env.LLAMA_GENERATE_MAX_NEW_TOKENS);
const decoder = new TextDecoder("utf-8");  // replaces bytes that are no UTF-8 with U+FFFD
process.stdout.write(promptText);
let generated = 0;
if (count > 0) {
  const options = {
    temperature: Number(env.LLAMA_GENERATE_TEMPERATURE),
    topK: Number(env.LLAMA_GENERATE_TOP_K),
    topP: Number(env.LLAMA_GENERATE_TOP_P),
    minP: 0,
    seed: Number(env.LLAMA_GENERATE_SEED),
    yieldEogToken: true,
  };
  for await (const token of sequence.evaluate(prompt, options)) {
    process.stdout.write(decoder.decode(tokenBytes(token), { stream: true }));
    if (++generated >= count) break;
  }
}
process.stdout.write(decoder.decode() + "\n");
await context.dispose();
await model.dispose();
process.exit(0);
