// The official `openai` npm client against build/serve (tests/test_serve.cpp): a completion, a
// chat, both streamed too, and the model list; prints what it got as one JSON line.
//   node tests/clients/openai_client.mjs http://127.0.0.1:PORT .deps/openai/node_modules/openai
const [, , base, modulePath] = process.argv;
const { default: OpenAI } = await import(`${modulePath}/index.mjs`);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });
const models = await client.models.list();
const model = models.data[0].id;
const completion = await client.completions.create({
  model, prompt: "To be", max_tokens: 20, temperature: 0,
});
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "To be" }], max_tokens: 20, temperature: 0,
});
let streamedCompletion = "";
for await (const chunk of await client.completions.create({
  model, prompt: "To be", max_tokens: 20, temperature: 0, stream: true,
})) {
  streamedCompletion += chunk.choices[0]?.text ?? "";
}
let streamedChat = "";
for await (const chunk of await client.chat.completions.create({
  model, messages: [{ role: "user", content: "To be" }], max_tokens: 20, temperature: 0,
  stream: true,
})) {
  streamedChat += chunk.choices[0]?.delta?.content ?? "";
}
let refused = "";
try {
  await client.completions.create({ model, prompt: "To be", n: 2 });
} catch (error) {
  refused = `${error.status} ${error.param ?? ""}`;
}
console.log(JSON.stringify({
  model,
  completion: completion.choices[0].text,
  chat: chat.choices[0].message.content,
  streamedCompletion,
  streamedChat,
  refused,
}));
