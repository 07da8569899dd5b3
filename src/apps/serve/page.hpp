// The page serve answers at /: a prompt or a chat, its reply streamed token by token from the
// server's own API, temperature and length to set. Self-contained (no script or style from
// elsewhere), so it works offline.
#pragma once

#include <string_view>

namespace gpt2::serve_app {

inline constexpr std::string_view kPage = R"PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpt2-mpi serve</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
textarea{width:100%;min-height:6rem;font:inherit;box-sizing:border-box}
#out{white-space:pre-wrap;border:1px solid #ccc;border-radius:4px;padding:.75rem;min-height:6rem;
background:#fafafa}
.row{display:flex;gap:1rem;align-items:center;flex-wrap:wrap;margin:.5rem 0}
label{display:flex;gap:.4rem;align-items:center}
#status{color:#666;font-size:13px}
</style></head><body>
<h1>gpt2-mpi serve</h1>
<p id="model">model: …</p>
<div class="row">
<label><input type="radio" name="mode" value="completion" checked> completion</label>
<label><input type="radio" name="mode" value="chat"> chat</label>
</div>
<textarea id="prompt" placeholder="Write a prompt"></textarea>
<div class="row">
<label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
<label>max tokens <input id="max_tokens" type="number" min="1" value="100"></label>
<label>API key <input id="key" type="password" size="12"></label>
<button id="send">Generate</button><button id="stop" disabled>Stop</button>
</div>
<div id="out"></div><p id="status"></p>
<script>
const $ = id => document.getElementById(id);
let controller = null;
const headers = () => {
  const h = {'Content-Type': 'application/json'};
  if ($('key').value) h['Authorization'] = 'Bearer ' + $('key').value;
  return h;
};
fetch('/v1/models', {headers: headers()}).then(r => r.json())
  .then(j => { $('model').textContent = 'model: ' + j.data[0].id; }).catch(() => {});
async function generate() {
  const chat = document.querySelector('input[name=mode]:checked').value === 'chat';
  const body = {stream: true, temperature: parseFloat($('temperature').value),
                max_tokens: parseInt($('max_tokens').value, 10)};
  if (chat) body.messages = [{role: 'user', content: $('prompt').value}];
  else body.prompt = $('prompt').value;
  $('out').textContent = chat ? '' : $('prompt').value;
  $('status').textContent = 'generating…';
  controller = new AbortController();
  $('send').disabled = true; $('stop').disabled = false;
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await fetch(chat ? '/v1/chat/completions' : '/v1/completions',
                          {method: 'POST', headers: headers(), body: JSON.stringify(body),
                           signal: controller.signal});
    if (!r.ok) { const e = await r.json(); throw new Error(e.error.message); }
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        const chunk = JSON.parse(event.slice(6));
        if (!chunk.choices.length) continue;
        const c = chunk.choices[0];
        const piece = chat ? (c.delta.content || '') : c.text;
        if (piece) { $('out').textContent += piece; tokens++; }
      }
    }
    const s = (performance.now() - started) / 1000;
    $('status').textContent = 'done: ' + tokens + ' chunks in ' + s.toFixed(2) + ' s';
    document.body.dataset.done = 'yes';
  } catch (e) {
    $('status').textContent = e.name === 'AbortError' ? 'stopped' : 'error: ' + e.message;
  }
  $('send').disabled = false; $('stop').disabled = true;
}
$('send').onclick = generate;
// ?prompt=...&mode=chat&temperature=0&max_tokens=20&run=1 fills the form (and generates): a
// link that shows a prompt's reply, and how the headless-browser test drives the page.
const query = new URLSearchParams(location.search);
if (query.has('prompt')) $('prompt').value = query.get('prompt');
if (query.has('temperature')) $('temperature').value = query.get('temperature');
if (query.has('max_tokens')) $('max_tokens').value = query.get('max_tokens');
if (query.get('mode') === 'chat') document.querySelector('input[value=chat]').checked = true;
if (query.get('run') === '1') generate();
$('stop').onclick = () => controller && controller.abort();
</script></body></html>
)PAGE";

}  // namespace gpt2::serve_app
