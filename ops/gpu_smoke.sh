#!/usr/bin/env bash
# The whole actor system on a GPU machine: start the supervisor on the demo model (the executor
# picks CUDA and bf16), then ask it over HTTP (chat, and a streamed completion). Prints what it saw.
set -euo pipefail
data_dir=$(mktemp -d)
python -m kernel.supervisor --model demo --data-dir "$data_dir" --port 8077 > "$data_dir/log" 2>&1 &
supervisor=$!
trap 'kill -TERM $supervisor; wait $supervisor' EXIT
for _ in $(seq 120); do grep -q '"event": "serving"' "$data_dir/log" && break; sleep 1; done
grep '"event": "model_loaded"' "$data_dir/log"
python - <<'PY'
import json, urllib.request
def post(path, body):
    request = urllib.request.Request("http://127.0.0.1:8077" + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=60).read().decode()
reply = json.loads(post("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0}))
print("chat:", repr(reply["choices"][0]["message"]["content"]), reply["usage"])
events = [line for line in post("/v1/completions", {"model": "demo", "prompt": "Once", "max_tokens": 16, "stream": True, "seed": 3}).splitlines() if line]
print("stream events:", len(events), "last:", events[-1])
PY
