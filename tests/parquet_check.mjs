// A third Parquet reader for tests/test_parquet.cpp: hyparquet (JavaScript, independent of DuckDB,
// arrow-rs and this project) extracts each file's documents as src/data/parquet.hpp defines them.
//   node parquet_check.mjs NODE_MODULES_DIR MANIFEST.json
// For every readable file in the manifest (dev/make_parquet_fixtures.mjs), prints one line:
// {"file": NAME, "documents": [TEXT, ...], "null_rows": N, "null_messages": M}.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, manifestFile] = process.argv.slice(2);
const load = (name, file) => import(pathToFileURL(join(modules, name, file)).href);
const { parquetReadObjects } = await load("hyparquet", "src/index.js");
const { compressors } = await load("hyparquet-compressors", "src/index.js");
const manifest = JSON.parse(readFileSync(manifestFile, "utf8"));

for (const entry of manifest.files) {
  const bytes = readFileSync(join(dirname(manifestFile), entry.file));
  const file = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  const rows = await parquetReadObjects({ file, compressors });
  const documents = [];
  let nullRows = 0, nullMessages = 0;
  for (const row of rows) {
    if (entry.kind === "text") {
      if (row[entry.column] === null || row[entry.column] === undefined) ++nullRows;
      else documents.push(row[entry.column]);
    } else if (entry.kind === "prompt_response" || entry.kind === "prompt_completion") {
      const answer = entry.kind === "prompt_response" ? "response" : "completion";
      if (row.prompt == null || row[answer] == null) ++nullRows;
      else documents.push(row.prompt + (entry.kind === "prompt_response" ? "\n\n" : "") + row[answer]);
    } else {
      const [role, content] = entry.fields;
      const all = row[entry.column] ?? [];
      const kept = all.filter((m) => m != null && m[role] != null && m[content] != null);
      nullMessages += all.length - kept.length;
      if (kept.length === 0) ++nullRows;
      else documents.push(kept.map((m) => `${m[role]}: ${m[content]}`).join("\n\n"));
    }
  }
  console.log(JSON.stringify({ file: entry.file, documents, null_rows: nullRows, null_messages: nullMessages }));
}
