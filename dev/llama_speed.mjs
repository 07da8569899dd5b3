// llama.cpp's prompt (prefill) time and decoding speed on a GGUF file, for
// dev/bench_inference.sh: through node-llama-cpp's prebuilt CPU binary (nothing is built or
// downloaded). Evaluates a prompt of P tokens of " the" (id 262, as the benchmark's prompt), then
// N greedy tokens, R times in one process (each in a fresh context); prints one JSON line per run
// after the first (a warm-up): prefill_ms (to the first generated token), ms_per_token after it.
//   node llama_speed.mjs NODE_MODULES_DIR MODEL.gguf P N THREADS R
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, file, ...numbers] = process.argv.slice(2);
const [P, N, threads, R] = numbers.map(Number);
const { getLlama } = await import(
  pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
for (let r = 0; r <= R; r++) {
  const context = await model.createContext({ contextSize: P + N + 8, threads, batchSize: 512 });
  const sequence = context.getSequence();
  const prompt = Array(P).fill(262);
  let n = 0;
  let first = 0;
  const start = performance.now();
  for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
    void token;
    if (n === 0) first = performance.now();
    if (++n >= N) break;
  }
  const end = performance.now();
  await context.dispose();
  if (r === 0) continue;
  console.log(JSON.stringify({
    prompt: P, generated: N, threads,
    prefill_ms: +(first - start).toFixed(2),
    ms_per_token: +((end - first) / (N - 1)).toFixed(3),
  }));
}
await model.dispose();
