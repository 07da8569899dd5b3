#!/usr/bin/env node
// Writes the Parquet test files (tests/data/parquet/) with writers independent of this project:
// DuckDB (its own C++ writer) and parquet-wasm (arrow-rs, the Rust writer), one file per variant
// the reader must handle (codecs, page versions, encodings, dictionary fallback, nulls, chat and
// prompt/response data) and the files it must refuse. Each readable file gets NAME.expected.jsonl:
// its documents as DuckDB's reader extracts them, one JSON object per line ({"text": ...}, with
// "messages" or "prompt"/"response" for structured data), in file order, which is also the same
// corpus as JSON Lines for the shard comparison. manifest.json lists every file with what it holds
// and the counts a reader must find.
//
//   node dev/make_parquet_fixtures.mjs [OUT_DIR] [NODE_MODULES_DIR]
//
// OUT_DIR defaults to tests/data/parquet, NODE_MODULES_DIR to .deps/parquet/node_modules
// (GPT2_WITH_PARQUET=1 scripts/setup.sh installs the pinned packages there). Everything is
// deterministic: the same packages write the same bytes. Runs offline. tests/test_parquet.cpp
// also runs it into a scratch directory and compares a third reader (hyparquet) there.
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const outDir = resolve(process.argv[2] || join(repo, "tests/data/parquet"));
const modules = resolve(process.argv[3] || join(repo, ".deps/parquet/node_modules"));
const require = createRequire(join(modules, "package.json"));
const { DuckDBInstance } = await import(
  pathToFileURL(require.resolve("@duckdb/node-api")).href
);
const pw = require("parquet-wasm/node");
const arrow = require("apache-arrow");
mkdirSync(outDir, { recursive: true });

// ---- the documents: deterministic, Unicode-rich, of mixed lengths, some repeated, some null ----
let seed = 0x9e3779b9;
function random() {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (list) => list[Math.floor(random() * list.length)];
const WORDS = [
  "the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on",
  "are", "as", "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one",
  "caf\u00e9", "na\u00efve", "\u00fcber", "se\u00f1or", "\u041f\u0440\u0438\u0432\u0435\u0442",
  "\u043c\u0438\u0440", "\u65e5\u672c\u8a9e", "\u6587\u5b57", "\ud83d\ude42", "\ud83c\udf0d",
  "e\u0301", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e9\u05dc\u05d5\u05dd",
  "don't", "\"quoted\"", "back\\slash", "tab\there", "x+y=z", "<|endoftext|>", "1,234.5",
];
function sentence(words) {
  const out = [];
  for (let i = 0; i < words; ++i) out.push(pick(WORDS));
  return out.join(" ") + pick([".", "!", "?", ":", ""]);
}
// A document: mostly a short line, some empty, some with line breaks and tabs, a few of several
// hundred bytes (spanning pages); `tiny` keeps them shorter (files of thousands of rows).
function documentText(i, tiny = false) {
  const kind = random();
  if (kind < 0.03) return "";
  if (kind < 0.06) return `line one\r\nline two\n\n\tindented ${i}\n`;
  if (kind < (tiny ? 0.065 : 0.08)) {
    const paragraphs = [];
    for (let p = 0; p < 6; ++p) paragraphs.push(sentence(10 + Math.floor(random() * 12)));
    return paragraphs.join("\n\n");
  }
  return tiny ? `D${i} ${sentence(1 + Math.floor(random() * 3))}`
              : `Document ${i}. ` + sentence(2 + Math.floor(random() * 10));
}
// `rows` documents, about `nullShare` of them null and a fifth repeated from earlier ones.
function documents(rows, nullShare, tiny = false) {
  const docs = [];
  for (let i = 0; i < rows; ++i) {
    const r = random();
    if (r < nullShare) docs.push(null);
    else if (r < nullShare + 0.2 && docs.length > 0) docs.push(pick(docs) ?? documentText(i, tiny));
    else docs.push(documentText(i, tiny));
  }
  return docs;
}
// Documents sharing long prefixes (URLs, dated titles): what DELTA_BYTE_ARRAY encodes well.
function prefixed(rows, nullShare) {
  const docs = [];
  for (let i = 0; i < rows; ++i) {
    if (random() < nullShare) docs.push(null);
    else docs.push(`https://example.org/wiki/${pick(["Caf\u00e9", "Z\u00fcrich", "\u6771\u4eac", "Paris"])}/${i} ${sentence(2 + Math.floor(random() * 8))}`);
  }
  return docs;
}
function conversation(i, nullShare) {
  const r = random();
  if (r < nullShare) return null;
  if (r < 2 * nullShare) return [];
  const messages = [];
  if (random() < 0.3) messages.push({ role: "system", content: "You are helpful. \u2728" });
  const turns = 1 + Math.floor(random() * 3);
  for (let t = 0; t < turns; ++t) {
    messages.push({ role: "user", content: sentence(3 + Math.floor(random() * 12)) });
    const answer = random();
    if (answer < 0.08) messages.push({ role: "assistant", content: null });  // a tool call, say
    else if (answer < 0.12) messages.push(null);
    else messages.push({ role: "assistant", content: documentText(i) });
  }
  return messages;
}

// ---- the documents as this project reads them (DOC-NOTES / src/data/parquet.hpp) ----
function chatText(messages, roleKey, contentKey) {
  return messages.map((m) => `${m[roleKey]}: ${m[contentKey]}`).join("\n\n");
}
function usableMessages(messages, roleKey, contentKey) {
  return (messages ?? []).filter((m) => m !== null && m[roleKey] !== null && m[contentKey] !== null);
}

// ---- writers ----
const db = await DuckDBInstance.create(":memory:");
const duck = await db.connect();
await duck.run("SET threads = 1");  // one row order, one file layout
const manifest = { writers: {}, files: [] };
manifest.writers.duckdb = (await duck.runAndReadAll("SELECT version() AS v")).getRowObjectsJson()[0].v;

const sql = (s) => `'${String(s).replaceAll("'", "''")}'`;
// A DuckDB table from JS rows (columns of VARCHAR, or the given SQL types), through JSON.
async function duckTable(name, columns, rows) {
  const json = join(outDir, `.${name}.json`);
  writeFileSync(json, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
  const spec = Object.entries(columns).map(([k, t]) => `${sql(k)}: ${sql(t)}`).join(", ");
  await duck.run(`CREATE OR REPLACE TABLE ${name} AS SELECT * FROM read_json(${sql(json)}, format = 'newline_delimited', columns = {${spec}})`);
  rmSync(json);
}
async function duckWrite(file, table, options) {
  await duck.run(`COPY (SELECT * EXCLUDE ("row") FROM ${table} ORDER BY "row") TO ${sql(join(outDir, file))} (FORMAT parquet, ${options})`);
}
function arrowWrite(file, columns, configure) {
  writeTable(file, new arrow.Table(columns), configure);
}
// Columns that may not be null (REQUIRED in Parquet: no definition levels, or fewer).
function arrowWriteRequired(file, fields, vectors, configure) {
  const schema = new arrow.Schema(fields);
  const data = arrow.makeData({ type: new arrow.Struct(schema.fields), length: vectors[0].length,
                                nullCount: 0, children: vectors.map((v) => v.data[0]) });
  writeTable(file, new arrow.Table([new arrow.RecordBatch(schema, data)]), configure);
}
function writeTable(file, table, configure) {
  const wasmTable = pw.Table.fromIPCStream(arrow.tableToIPC(table, "stream"));
  const builder = configure(new pw.WriterPropertiesBuilder().setCreatedBy("parquet-wasm 0.8.0 (arrow-rs)"));
  writeFileSync(join(outDir, file), pw.writeParquet(wasmTable, builder.build()));
}
const utf8 = (values) => arrow.vectorFromArray(values, new arrow.Utf8());
function messagesVector(values, elementName, roleKey, contentKey) {
  const struct = new arrow.Struct([
    new arrow.Field(roleKey, new arrow.Utf8(), true),
    new arrow.Field(contentKey, new arrow.Utf8(), true),
  ]);
  return arrow.vectorFromArray(values, new arrow.List(new arrow.Field(elementName, struct, true)));
}

// ---- the expected documents, as DuckDB's reader extracts them ----
async function readBack(file) {
  const rows = (await duck.runAndReadAll(
    `SELECT * FROM read_parquet(${sql(join(outDir, file))}, file_row_number = true) ORDER BY file_row_number`,
  )).getRowObjectsJson();
  return rows;
}
const expectedFiles = new Map();  // contents -> file name
async function expect(entry) {
  const rows = await readBack(entry.file);
  const lines = [];
  let nullRows = 0, nullMessages = 0;
  for (const row of rows) {
    if (entry.kind === "text") {
      const text = row[entry.column];
      if (text === null) { ++nullRows; continue; }
      lines.push({ text });
    } else if (entry.kind === "prompt_response" || entry.kind === "prompt_completion") {
      const answer = entry.kind === "prompt_response" ? "response" : "completion";
      if (row.prompt === null || row[answer] === null) { ++nullRows; continue; }
      const joiner = entry.kind === "prompt_response" ? "\n\n" : "";
      lines.push({ text: row.prompt + joiner + row[answer], prompt: row.prompt, response: row[answer] });
    } else {
      const [roleKey, contentKey] = entry.fields;
      const all = row[entry.column] ?? [];
      const kept = usableMessages(all, roleKey, contentKey);
      nullMessages += all.length - kept.length;
      if (kept.length === 0) { ++nullRows; continue; }
      lines.push({
        text: chatText(kept, roleKey, contentKey),
        messages: kept.map((m) => ({ role: m[roleKey], content: m[contentKey] })),
      });
    }
  }
  // Files of the same documents share one expected file, named after the first of them.
  const text = lines.map((l) => JSON.stringify(l)).join("\n") + (lines.length ? "\n" : "");
  entry.expected = expectedFiles.get(text) ?? entry.file.replace(/\.parquet$/, ".expected.jsonl");
  if (!expectedFiles.has(text)) {
    expectedFiles.set(text, entry.expected);
    writeFileSync(join(outDir, entry.expected), text);
  }
  const meta = (await duck.runAndReadAll(
    `SELECT compression, encodings, row_group_id FROM parquet_metadata(${sql(join(outDir, entry.file))}) WHERE path_in_schema LIKE ${sql(entry.kind === "chat" ? entry.column + "%" : entry.kind === "text" ? entry.column : "prompt")}`,
  )).getRowObjectsJson();
  Object.assign(entry, {
    rows: rows.length,
    documents: lines.length,
    null_rows: nullRows,
    null_messages: nullMessages,
    row_groups: new Set(meta.map((m) => m.row_group_id)).size,
    codecs: [...new Set(meta.map((m) => m.compression))],
    encodings: [...new Set(meta.flatMap((m) => m.encodings.split(", ")))].sort(),
  });
  manifest.files.push(entry);
}
const withRow = (records) => records.map((r, i) => ({ row: i, ...r }));

// DuckDB: v1 pages (PARQUET_VERSION v1, its default) with dictionaries or PLAIN; v2 pages with
// DELTA_LENGTH_BYTE_ARRAY; each codec; row groups of 2048 rows (its smallest).
{
  const docs = documents(2100, 0.05, true);
  await duckTable("plain_text", { row: "INTEGER", id: "INTEGER", text: "VARCHAR", url: "VARCHAR" },
    withRow(docs.map((text, i) => ({ id: i, text, url: `https://example.org/${i % 97}` }))));
  for (const [file, options, note] of [
    ["duckdb_snappy_v1.parquet", "COMPRESSION snappy, ROW_GROUP_SIZE 2048", "DuckDB's default: snappy, v1 pages"],
    ["duckdb_zstd_v2.parquet", "COMPRESSION zstd, PARQUET_VERSION v2, ROW_GROUP_SIZE 2048", "v2 pages, DELTA_LENGTH_BYTE_ARRAY"],
    ["duckdb_gzip_v1.parquet", "COMPRESSION gzip, ROW_GROUP_SIZE 2048", "gzip"],
    ["duckdb_uncompressed_v2.parquet", "COMPRESSION uncompressed, PARQUET_VERSION v2, ROW_GROUP_SIZE 2048", "no codec, v2 pages"],
  ]) {
    await duckWrite(file, "plain_text", options);
    await expect({ file, writer: "duckdb", kind: "text", column: "text", note });
  }
}
{
  const chats = [];
  for (let i = 0; i < 130; ++i) chats.push(conversation(i, 0.04));
  await duckTable("chat", { row: "INTEGER", id: "INTEGER", messages: "STRUCT(role VARCHAR, content VARCHAR)[]" },
    withRow(chats.map((messages, i) => ({ id: i, messages }))));
  await duckWrite("duckdb_chat.parquet", "chat", "COMPRESSION snappy");
  await expect({ file: "duckdb_chat.parquet", writer: "duckdb", kind: "chat", column: "messages", fields: ["role", "content"], note: "messages: LIST > list > element {role, content}" });
}
{
  const rows = [];
  for (let i = 0; i < 200; ++i) {
    const r = random();
    rows.push({ prompt: r < 0.03 ? null : `Question ${i}: ${sentence(4 + Math.floor(random() * 10))}?`, response: r > 0.97 ? null : documentText(i) });
  }
  await duckTable("pairs", { row: "INTEGER", prompt: "VARCHAR", response: "VARCHAR" }, withRow(rows));
  await duckWrite("duckdb_prompt_response.parquet", "pairs", "COMPRESSION zstd");
  await expect({ file: "duckdb_prompt_response.parquet", writer: "duckdb", kind: "prompt_response", note: "prompt and response columns" });
}

// parquet-wasm (arrow-rs): dictionary pages that fall back to PLAIN within a chunk, forced PLAIN,
// both DELTA string encodings, v1 and v2 pages, lists of structs spelled list/item (older pyarrow)
// and list/element, ShareGPT's from/value. Small pages and batches, so that chunks hold many pages.
const small = (b) => b.setDataPageSizeLimit(1024).setWriteBatchSize(32).setMaxRowGroupSize(250);
{
  const docs = documents(450, 0.05);
  arrowWrite("arrow_dictionary_fallback_snappy.parquet", { text: utf8(docs) },
    (b) => small(b).setCompression(pw.Compression.SNAPPY).setDictionaryPageSizeLimit(2000));
  await expect({ file: "arrow_dictionary_fallback_snappy.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "a dictionary page, RLE_DICTIONARY pages, then PLAIN pages in the same chunk (the dictionary outgrew its limit)" });
  arrowWrite("arrow_plain_v2_gzip.parquet", { text: utf8(docs) },
    (b) => small(b).setCompression(pw.Compression.GZIP).setDictionaryEnabled(false).setWriterVersion(pw.WriterVersion.V2));
  await expect({ file: "arrow_plain_v2_gzip.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "forced PLAIN, v2 pages" });
  arrowWrite("arrow_delta_length_zstd.parquet", { text: utf8(docs) },
    (b) => small(b).setCompression(pw.Compression.ZSTD).setDictionaryEnabled(false).setEncoding(pw.Encoding.DELTA_LENGTH_BYTE_ARRAY));
  await expect({ file: "arrow_delta_length_zstd.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "DELTA_LENGTH_BYTE_ARRAY, v1 pages" });
}
{
  const docs = prefixed(500, 0.05);
  arrowWrite("arrow_delta_byte_array_v2.parquet", { text: utf8(docs) },
    (b) => small(b).setCompression(pw.Compression.UNCOMPRESSED).setDictionaryEnabled(false).setEncoding(pw.Encoding.DELTA_BYTE_ARRAY).setWriterVersion(pw.WriterVersion.V2));
  await expect({ file: "arrow_delta_byte_array_v2.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "DELTA_BYTE_ARRAY, v2 pages, no codec" });
  arrowWrite("arrow_delta_byte_array_snappy.parquet", { text: utf8(docs) },
    (b) => small(b).setCompression(pw.Compression.SNAPPY).setDictionaryEnabled(false).setEncoding(pw.Encoding.DELTA_BYTE_ARRAY));
  await expect({ file: "arrow_delta_byte_array_snappy.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "DELTA_BYTE_ARRAY, v1 pages" });
}
{
  const chats = [];
  for (let i = 0; i < 120; ++i) chats.push(conversation(i, 0.04));
  arrowWrite("arrow_chat_list_item.parquet",
    { id: arrow.vectorFromArray(chats.map((_, i) => i), new arrow.Int32()), messages: messagesVector(chats, "item", "role", "content") },
    (b) => small(b).setCompression(pw.Compression.SNAPPY).setMaxRowGroupSize(50));
  await expect({ file: "arrow_chat_list_item.parquet", writer: "arrow-rs", kind: "chat", column: "messages", fields: ["role", "content"], note: "messages: LIST > list > item (older pyarrow's spelling)" });
  const shared = chats.map((c) => c === null ? null : c.map((m) => m === null ? null : { from: m.role === "user" ? "human" : m.role === "assistant" ? "gpt" : m.role, value: m.content }));
  arrowWrite("arrow_sharegpt_v2_zstd.parquet", { conversations: messagesVector(shared, "element", "from", "value") },
    (b) => small(b).setCompression(pw.Compression.ZSTD).setWriterVersion(pw.WriterVersion.V2).setMaxRowGroupSize(50));
  await expect({ file: "arrow_sharegpt_v2_zstd.parquet", writer: "arrow-rs", kind: "chat", column: "conversations", fields: ["from", "value"], note: "ShareGPT: conversations: LIST > list > element {from, value}, v2 pages" });
}
{  // REQUIRED columns: a text column and a chat list whose every level is required
  const docs = documents(300, 0).map((d) => d ?? "");
  arrowWriteRequired("arrow_required_text_snappy.parquet",
    [new arrow.Field("text", new arrow.Utf8(), false)], [utf8(docs)],
    (b) => small(b).setCompression(pw.Compression.SNAPPY));
  await expect({ file: "arrow_required_text_snappy.parquet", writer: "arrow-rs", kind: "text", column: "text", note: "a REQUIRED text column (no definition levels), dictionary, v1 pages" });
  const struct = new arrow.Struct([new arrow.Field("role", new arrow.Utf8(), false),
                                   new arrow.Field("content", new arrow.Utf8(), false)]);
  const type = new arrow.List(new arrow.Field("element", struct, false));
  const chats = [];
  for (let i = 0; i < 80; ++i) {
    const c = conversation(i, 0);
    chats.push(random() < 0.05 ? [] : c.filter((m) => m !== null && m.content !== null));
  }
  arrowWriteRequired("arrow_required_chat_v2_gzip.parquet",
    [new arrow.Field("messages", type, false)], [arrow.vectorFromArray(chats, type)],
    (b) => small(b).setCompression(pw.Compression.GZIP).setWriterVersion(pw.WriterVersion.V2).setMaxRowGroupSize(40));
  await expect({ file: "arrow_required_chat_v2_gzip.parquet", writer: "arrow-rs", kind: "chat", column: "messages", fields: ["role", "content"], note: "a REQUIRED list of REQUIRED structs (empty lists its only gaps), v2 pages" });
}
{
  const prompts = [], completions = [];
  for (let i = 0; i < 300; ++i) {
    prompts.push(random() < 0.03 ? null : `The ${pick(WORDS)} of ${pick(WORDS)} is`);
    completions.push(` ${sentence(1 + Math.floor(random() * 6))}`);
  }
  arrowWrite("arrow_prompt_completion.parquet", { prompt: utf8(prompts), completion: utf8(completions) },
    (b) => small(b).setCompression(pw.Compression.UNCOMPRESSED));
  await expect({ file: "arrow_prompt_completion.parquet", writer: "arrow-rs", kind: "prompt_completion", note: "prompt and completion columns (joined directly)" });
}

// ---- files the reader must refuse, each with the words its one error line must contain ----
const refusals = [];
{
  await duck.run("SET force_mbedtls_unsafe = 'true'");  // DuckDB's writer needs it to encrypt offline
  await duck.run("PRAGMA add_parquet_key('key256', '01234567891123450123456789112345')");
  await duck.run(`COPY (SELECT 'secret' AS text) TO ${sql(join(outDir, "refuse_encrypted.parquet"))} (FORMAT parquet, ENCRYPTION_CONFIG {footer_key: 'key256'})`);
  refusals.push({ file: "refuse_encrypted.parquet", writer: "duckdb", error: "encrypted Parquet file (its magic is PARE)" });
  await duck.run(`COPY (SELECT 'squeezed ' || i AS text FROM range(10) t(i)) TO ${sql(join(outDir, "refuse_brotli.parquet"))} (FORMAT parquet, COMPRESSION brotli)`);
  refusals.push({ file: "refuse_brotli.parquet", writer: "duckdb", error: "compressed with BROTLI, which this reader does not read" });
  await duck.run(`COPY (SELECT 'squeezed ' || i AS text FROM range(10) t(i)) TO ${sql(join(outDir, "refuse_lz4.parquet"))} (FORMAT parquet, COMPRESSION lz4_raw)`);
  refusals.push({ file: "refuse_lz4.parquet", writer: "duckdb", error: "compressed with LZ4_RAW, which this reader does not read" });
  await duck.run(`COPY (SELECT i::BIGINT AS text, ('\\x00\\x01'::BLOB) AS data, 'words' AS body FROM range(5) t(i)) TO ${sql(join(outDir, "refuse_not_string.parquet"))} (FORMAT parquet)`);
  refusals.push({ file: "refuse_not_string.parquet", writer: "duckdb", error: "column 'text' is INT64, not a string" });
  refusals.push({ file: "refuse_not_string.parquet", writer: "duckdb", text_field: "data", error: "column 'data' is BYTE_ARRAY without a string annotation (binary), not a string" });
  refusals.push({ file: "refuse_not_string.parquet", writer: "duckdb", text_field: "missing", error: "no column 'missing' (--text-field); its columns: text (INT64), data (BYTE_ARRAY without a string annotation (binary)), body (a string)" });
  await duck.run(`COPY (SELECT 'x' AS title, [{'role': 'user', 'content': 'a'}] AS chosen, [{'role': 'user', 'content': 'b'}] AS rejected) TO ${sql(join(outDir, "refuse_two_chats.parquet"))} (FORMAT parquet)`);
  refusals.push({ file: "refuse_two_chats.parquet", writer: "duckdb", error: "several chat columns ('chosen', 'rejected'): choose one with --text-field" });
}
manifest.refusals = refusals;
manifest.writers["arrow-rs"] = "parquet-wasm 0.8.0";
writeFileSync(join(outDir, "manifest.json"), JSON.stringify(manifest, null, 1) + "\n");
console.log(`wrote ${manifest.files.length} files and ${refusals.length} refusals to ${outDir}`);
