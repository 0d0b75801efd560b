"""The trainer's processes of `python -m ops.bench.weight_update`, each a role of its own, started
with its own device by the benchmark (never the server's process: a trainer is another program):

- `broadcast`: one of a pair of bare torch.distributed processes timing a broadcast of
  `--bound-mb` from rank 0: the transport's bandwidth between the two devices, the NCCL bound;
- `group`: rank 0 of the server's weight group, random weights of the served shape (another seed
  than the checkpoint's, so every update changes them); each line on stdin asks one whole update
  (`{"version", "pause_mode"}`), answered by one JSON line on stdout;
- `ipc`: on the server's own device, times `--repeats` whole updates by CUDA IPC and a device copy of
  the same bytes (the IPC bound), and prints one JSON line.

Each prints JSON lines on stdout; NCCL_NVLS_ENABLE=0 is set before torch.distributed starts.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"

import torch  # noqa: E402  (after the environment NCCL reads)
import torch.distributed as dist  # noqa: E402

from gpu.config import ModelConfig  # noqa: E402
from gpu.live_weights import LiveWeights  # noqa: E402
from gpu.weight_check import checksum  # noqa: E402
from gpu.weights import random_model  # noqa: E402
from ops.bench.shapes import SHAPES  # noqa: E402
from ops.rl.http_updates import GroupUpdates, NamedTensors, ipc_update  # noqa: E402
from ops.rl.sglang_http import SglangHttp  # noqa: E402

REPEATS = 5


def served_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def named_weights(model: str, device: torch.device, seed: int) -> NamedTensors:
    """Random weights of `model`'s shape under the checkpoint's names, in the served dtype."""
    live = LiveWeights(random_model(ModelConfig.from_dict(SHAPES[model]), device, served_dtype(device), seed))
    return [(name, live.read(name).contiguous()) for name in sorted(live.required)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def broadcast(args, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=2)
    payload = torch.ones(args.bound_mb << 20, dtype=torch.uint8, device=device)
    seconds = []
    for _ in range(REPEATS + 1):  # the first makes the communicator
        dist.barrier()
        synchronize(device)
        started = time.perf_counter()
        dist.broadcast(payload, src=0)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    dist.barrier()
    if args.rank == 0:
        median = statistics.median(seconds[1:])
        print(json.dumps({"bytes": payload.numel(), "seconds": median, "backend": backend}), flush=True)
    dist.destroy_process_group()


def group(args, device: torch.device) -> None:
    """Joins the server's group, then pushes a whole update per line on stdin."""
    http = SglangHttp(args.url)
    named = named_weights(args.model, device, args.seed)
    updates = GroupUpdates(http, "nccl" if device.type == "cuda" else "gloo", str(device))
    total = sum(t.nbytes for _, t in named)
    print(json.dumps({"tensors": len(named), "bytes": total}), flush=True)
    probes = [named[0], named[-1]]  # read back after each update: the bytes the server holds now
    for line in sys.stdin:
        asked = json.loads(line)
        answers, pause_s = updates.update(
            named, asked["version"], args.bucket_mb << 20, pause_mode=asked["pause_mode"], checksums=False
        )
        arrived = all(http.weight_checksum(name) == checksum(tensor) for name, tensor in probes)
        load_s = sum(a["load_s"] for a in answers)
        print(
            json.dumps({"pause_s": pause_s, "load_s": load_s, "buckets": len(answers), "arrived": arrived}), flush=True
        )
    updates.close()


def device_copy_s(total: int, bucket_bytes: int, device: torch.device) -> float:
    """The least of three device-to-device copies of `total` bytes, a bucket at a time."""
    source = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = []
    for _ in range(3):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(-(-total // bucket_bytes)):
            target.copy_(source)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def ipc(args, device: torch.device) -> None:
    """On the server's device: whole updates by CUDA IPC, and a device copy of the same bytes."""
    http = SglangHttp(args.url)
    named = named_weights(args.model, device, args.seed)
    total = sum(t.nbytes for _, t in named)
    bound_s = device_copy_s(total, args.bucket_mb << 20, device)
    runs = [ipc_update(http, named, f"ipc-{k}", args.bucket_mb << 20) for k in range(args.repeats)]
    arrived = all(http.weight_checksum(name) == checksum(tensor) for name, tensor in [named[0], named[-1]])
    print(
        json.dumps(
            {
                "tensors": len(named),
                "bytes": total,
                "bound_s": bound_s,
                "pause_s": [pause_s for _, pause_s in runs],
                "load_s": [sum(a["load_s"] for a in answers) for answers, _ in runs],
                "buckets": len(runs[0][0]),
                "arrived": arrived,
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.weight_trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("broadcast", "group", "ipc"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--url", help="the server (group, ipc)")
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=1024)
    parser.add_argument("--bound-mb", type=int, default=1024, help="the bare broadcast's size")
    parser.add_argument("--port", type=int, help="broadcast: the pair's rendezvous")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)  # the one GPU CUDA_VISIBLE_DEVICES leaves it
    {"broadcast": broadcast, "group": group, "ipc": ipc}[args.role](args, device)


if __name__ == "__main__":
    main()
