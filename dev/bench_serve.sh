#!/usr/bin/env bash
# Throughput of build/serve under concurrent clients: aggregate generated tokens per second, and
# per request the time to the first token and between tokens (medians), for 1, 4, 8 and 16 clients
# at once, each streaming REQUESTS completions of NEW_TOKENS tokens (temperature 0, a fixed prompt),
# with fp32 and int8 weights. The load generator (below, Python's standard library) talks to the
# server on loopback only, and every request has a time limit. GPT-2 124M-shaped random weights,
# as dev/bench_inference.sh writes them (needs /usr/bin/python3 with torch once, and data/gpt2).
# Beside it, llama.cpp (node-llama-cpp's prebuilt CPU binary, dev/llama_parallel.mjs) decoding as
# many sequences at once in one context, on GGUF files convert_model writes from the same model
# (F32 beside fp32, Q8_0 beside int8), same threads, same prompt and length; LLAMA=0 skips it.
#
#   dev/bench_serve.sh   # env: THREADS=<cores> CLIENTS="1 4 8 16" REQUESTS=2 NEW_TOKENS=64
#                        #      WEIGHTS="fp32 int8" MODEL=/tmp/gpt2_random_124M.bin BUILD=build PORT=18181
#                        #      LLAMA=1 LLAMA_MODULES=.deps/llama-cpp/node_modules
set -euo pipefail
# --help: this header.
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
model=${MODEL:-/tmp/gpt2_random_124M.bin}
threads=${THREADS:-$(nproc)}
clients=${CLIENTS:-"1 4 8 16"}
requests=${REQUESTS:-2}
new_tokens=${NEW_TOKENS:-64}
weights_list=${WEIGHTS:-"fp32 int8"}
port=${PORT:-18181}
llama=${LLAMA:-1}
llama_modules=${LLAMA_MODULES:-$root/.deps/llama-cpp/node_modules}
python=/usr/bin/python3
[[ -x $build/serve ]] || { echo "$build/serve missing: ninja -C build serve" >&2; exit 1; }
if [[ ! -s $model ]]; then
  echo "writing random GPT-2 124M weights to $model" >&2
  "$python" "$root/dev/bench_inference_pytorch.py" --write-random "$model"
fi
max_clients=0
for c in $clients; do (( c > max_clients )) && max_clients=$c; done
log=$(mktemp)
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT

echo "serve, GPT-2 124M random weights, $threads thread(s) of $(lscpu | sed -n 's/Model name: *//p'), $new_tokens tokens x $requests request(s) per client"
printf '%-7s %-8s %14s %14s %16s %12s\n' weights clients "tokens/s" "x 1 client" "first token ms" "between ms"
for weights in $weights_list; do
  (cd "$root" && "$build/serve" "$model" --port "$port" --threads "$threads" \
      --parallel "$max_clients" --weights "$weights" --log-level warn) >"$log" 2>&1 &
  server=$!
  for _ in $(seq 200); do
    "$python" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
      2>/dev/null && break
    sleep 0.1
  done
  single=""
  for c in $clients; do
    figures=$("$python" - "$port" "$c" "$requests" "$new_tokens" <<'PY'
import http.client, json, statistics, sys, threading, time
port, clients, requests, new_tokens = (int(a) for a in sys.argv[1:5])
body = json.dumps({"prompt": "Hello, I'm a language model,", "max_tokens": new_tokens,
                   "temperature": 0, "stream": True})
first, gaps, tokens, failures = [], [], [0], [0]
lock = threading.Lock()
def client():
    for _ in range(requests):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            start = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            last, count, buffer = None, 0, b""
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if not event.startswith(b"data: {"):
                        continue
                    choices = json.loads(event[6:])["choices"]
                    if not choices or not choices[0]["text"]:
                        continue
                    now = time.perf_counter()
                    with lock:
                        if last is None:
                            first.append(now - start)
                        else:
                            gaps.append(now - last)
                    last = now
                    count += 1
            with lock:
                tokens[0] += count
            conn.close()
        except Exception:
            with lock:
                failures[0] += 1
start = time.perf_counter()
threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.perf_counter() - start
print(f"{tokens[0] / wall:.1f} {statistics.median(first) * 1e3:.1f} "
      f"{statistics.median(gaps) * 1e3 if gaps else 0:.2f} {failures[0]}")
PY
)
    read -r rate ttft gap failed <<<"$figures"
    [[ -z $single ]] && single=$rate
    ratio=$(awk -v a="$rate" -v b="$single" 'BEGIN { printf "%.2f", a / b }')
    printf '%-7s %-8s %14s %14s %16s %12s%s\n' "$weights" "$c" "$rate" "$ratio" "$ttft" "$gap" \
      "$([[ $failed != 0 ]] && echo "  ($failed failed)")"
  done
  kill -TERM "$server"; wait "$server" || true
done

if [[ $llama == 1 && -d $llama_modules/node-llama-cpp ]]; then
  echo
  echo "llama.cpp (node-llama-cpp), the same model as GGUF, $threads thread(s), S sequences in one context"
  printf '%-7s %-8s %14s %14s %16s\n' gguf sequences "tokens/s" "x 1 sequence" "first token ms"
  for weights in $weights_list; do
    dtype=f32
    [[ $weights == int8 ]] && dtype=q8_0
    [[ $weights == bf16 ]] && dtype=bf16
    gguf=${model%.bin}_$dtype.gguf
    [[ -s $gguf ]] || (cd "$root" && "$build/convert_model" "$model" "$gguf" --dtype "$dtype" --log-level warn)
    single=""
    for c in $clients; do
      line=$(node "$root/dev/llama_parallel.mjs" "$llama_modules" "$gguf" "$c" "$new_tokens" "$threads")
      rate=$("$python" -c "import json,sys; print(f\"{json.loads(sys.argv[1])['tokens_per_s']:.1f}\")" "$line")
      first=$("$python" -c "import json,sys; print(f\"{json.loads(sys.argv[1])['first_ms']:.1f}\")" "$line")
      [[ -z $single ]] && single=$rate
      ratio=$(awk -v a="$rate" -v b="$single" 'BEGIN { printf "%.2f", a / b }')
      printf '%-7s %-8s %14s %14s %16s\n' "$dtype" "$c" "$rate" "$ratio" "$first"
    done
  done
elif [[ $llama == 1 ]]; then
  echo "(llama.cpp left out: $llama_modules/node-llama-cpp missing; GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh)"
fi
