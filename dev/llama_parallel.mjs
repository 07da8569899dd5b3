// llama.cpp decoding S sequences at once in one context (node-llama-cpp batches the sequences'
// tokens into one evaluation), for dev/bench_serve.sh: each sequence evaluates the same prompt and
// generates N greedy tokens; prints one JSON line with the aggregate generated tokens per second
// (from the first sequence's start to the last one's end) and the median time to first token.
//   node llama_parallel.mjs NODE_MODULES_DIR MODEL.gguf S N THREADS
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, file, ...numbers] = process.argv.slice(2);
const [S, N, threads] = numbers.map(Number);
const { getLlama } = await import(
  pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const prompt = model.tokenize("Hello, I'm a language model,");
const run = async () => {
  const context = await model.createContext({
    contextSize: S * (prompt.length + N + 8), sequences: S, threads, batchSize: 512,
  });
  const firsts = [];
  let tokens = 0;
  const start = performance.now();
  await Promise.all(Array.from({ length: S }, async () => {
    const sequence = context.getSequence();
    let n = 0;
    for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
      void token;
      if (n === 0) firsts.push(performance.now() - start);
      if (++n >= N) break;
    }
    tokens += n;
  }));
  const wall = (performance.now() - start) / 1000;
  await context.dispose();
  firsts.sort((a, b) => a - b);
  return { tokens_per_s: tokens / wall, first_ms: firsts[Math.floor(firsts.length / 2)] };
};
await run();  // warm-up
const result = await run();
console.log(JSON.stringify({ sequences: S, tokens: N, threads, ...result }));
await model.dispose();
