#!/usr/bin/env bash
# The whole actor system on a GPU machine: start the supervisor on the demo model (the executor
# picks CUDA and bf16), then ask it through the openai SDK and over the bus. Prints what it saw.
set -euo pipefail
data_dir=$(mktemp -d)
python -m kernel.supervisor --data-dir "$data_dir" --port 8077 > "$data_dir/log" 2>&1 &
supervisor=$!
trap 'kill -TERM $supervisor; wait $supervisor' EXIT
for _ in $(seq 120); do grep -q '"event": "serving"' "$data_dir/log" && break; sleep 1; done
grep '"event": "model_loaded"' "$data_dir/log"
python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:8077/v1", api_key="unused")
reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=16, temperature=0)
print("chat:", repr(reply.choices[0].message.content), reply.usage)
chunks = list(client.completions.create(model="demo", prompt="Once", max_tokens=16, stream=True, seed=3))
print("stream chunks:", len(chunks), "finish:", chunks[-1].choices[0].finish_reason)
PY
