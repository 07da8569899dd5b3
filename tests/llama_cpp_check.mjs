// llama.cpp's own judgement of exported GGUF files, through node-llama-cpp's prebuilt CPU binary
// (nothing is built or downloaded). One process for all the jobs: starting llama.cpp costs seconds.
//   node llama_cpp_check.mjs NODE_MODULES_DIR JOBS.json
// JOBS.json: [{"model": PATH, "mode": M, "text": T | "ids": [...], "count": N,
//              "lora": [PATH, ...] (optional: GGUF LoRA adapters applied at scale 1)}, ...] with mode
//   tokenize  llama.cpp's token ids of text
//   greedy    the next `count` tokens after ids, at temperature 0 (an end-of-generation token does
//             not stop it: our generator has no such stop, and a char model's eos is its newline)
//   teacher   llama.cpp's top-1 token after each prefix of ids
// Prints a JSON list with one list of ids per job.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, jobsFile] = process.argv.slice(2);
const { getLlama } = await import(
  pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const results = [];
for (const job of JSON.parse(readFileSync(jobsFile, "utf8"))) {
  const model = await llama.loadModel({ modelPath: job.model });
  const out = [];
  if (job.mode === "tokenize") {
    out.push(...model.tokenize(job.text, true));
  } else {
    // One thread: llama.cpp's spinning workers crawl on a busy machine (0.5 s a token against 4 ms).
    const lora = job.lora ? { adapters: job.lora.map((filePath) => ({ filePath, scale: 1 })) } : undefined;
    const context = await model.createContext({ contextSize: model.trainContextSize, threads: 1, lora });
    const sequence = context.getSequence();
    if (job.mode === "greedy") {
      for await (const token of sequence.evaluate(job.ids, { temperature: 0, yieldEogToken: true })) {
        out.push(token);
        if (out.length >= job.count) break;
      }
    } else if (job.mode === "teacher") {
      const input = job.ids.map((id) => [id, { generateNext: { token: true, options: { temperature: 0 } } }]);
      for (const result of await sequence.controlledEvaluate(input)) out.push(result?.next?.token ?? -1);
    } else {
      throw new Error(`unknown mode ${job.mode}`);
    }
    await context.dispose();
  }
  await model.dispose();
  results.push(out);
}
console.log(JSON.stringify(results));
process.exit(0);
