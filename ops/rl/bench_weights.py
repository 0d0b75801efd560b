"""Times weight updates of a real model shape on GPUs against bounds measured in the same run:
NCCL from a trainer process on GPU 1 into the server's weights on GPU 0 (flattened buckets, and
per tensor), against the same bytes broadcast bare; CUDA IPC from a trainer process on GPU 0,
against a device copy of the same bytes. Prints one JSON object.

    python -m ops.rl.bench_weights --model llama-3.1-8b [--bucket-mb 1024]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from gpu.config import ModelConfig
from gpu.host_weights import HostWeights
from gpu.ipc_tensors import ipc_payload
from gpu.live_weights import LiveWeights
from gpu.weight_group import WeightGroup
from gpu.weight_receiver import WeightReceiver
from gpu.weights import random_model
from kernel.nats_server import free_port
from ops.bench.shapes import SHAPES
from ops.rl.http_updates import buckets

GROUP = "weight_update_group"


def named_weights(model_name: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    model = random_model(ModelConfig.from_dict(SHAPES[model_name]), torch.device("cuda"), torch.bfloat16, seed)
    live = LiveWeights(model)
    return [(name, live.read(name).contiguous()) for name in sorted(live.required)]


def trainer(args) -> None:
    """Rank 0 on its own GPU: bare buckets, flattened buckets, then every tensor, as the server asks."""
    named = named_weights(args.model, seed=1)
    group = WeightGroup("127.0.0.1", args.port, 0, 2, GROUP, "nccl", torch.device("cuda"), 120)
    for _ in range(args.repeats):
        for bucket in buckets(named, args.bucket_mb << 20):
            group.send([t for _, t in bucket], True, time.monotonic() + 60)  # the bare bound
        for bucket in buckets(named, args.bucket_mb << 20):
            group.send([t for _, t in bucket], True, time.monotonic() + 60)
        group.send([t for _, t in named], False, time.monotonic() + 60)
    print("done", flush=True)


def ipc_trainer(args) -> None:
    named = named_weights(args.model, seed=2)
    payloads = [ipc_payload(bucket, True) for bucket in buckets(named, args.bucket_mb << 20)]
    sys.stdout.write(json.dumps([p.hex() for p in payloads]) + "\n")
    sys.stdout.flush()
    sys.stdin.read()


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def server(args) -> dict:
    model = random_model(ModelConfig.from_dict(SHAPES[args.model]), torch.device("cuda:0"), torch.bfloat16, 0)
    host = HostWeights(model)
    host.refresh("0")
    host.wait()
    receiver = WeightReceiver(model, host, "cuda:0")
    named = [(name, receiver.live.read(name)) for name in sorted(receiver.live.required)]
    total = sum(t.nbytes for _, t in named)
    results: dict = {"model": args.model, "bytes": total, "bucket_mb": args.bucket_mb}
    options = ["--model", args.model, "--bucket-mb", str(args.bucket_mb), "--repeats", str(args.repeats)]
    if "nccl" in args.transports:
        results["nccl"] = _nccl(args, receiver, named, options)
    if "ipc" in args.transports:
        results["ipc"] = _ipc(args, receiver, total, options)
    return results


def _nccl(args, receiver: WeightReceiver, named, options: list[str]) -> dict:
    port = free_port()
    env = {"CUDA_VISIBLE_DEVICES": "1", "NCCL_NVLS_ENABLE": "0"}
    command = [sys.executable, "-m", "ops.rl.bench_weights", "--role", "trainer", "--port", str(port)]
    push = subprocess.Popen([*command, *options], env=_env(env), stdout=subprocess.PIPE, text=True)
    receiver.join_group("127.0.0.1", port, 1, 2, GROUP, "nccl", 120)
    group = receiver.group(GROUP)
    sizes = [sum(t.nbytes for _, t in bucket) for bucket in buckets(named, args.bucket_mb << 20)]
    for _ in range(args.repeats):
        scratch = [torch.empty(size, dtype=torch.uint8, device="cuda:0") for size in sizes]
        bare = timed(lambda: [group.receive_into([s], False, time.monotonic() + 60) for s in scratch])
        flat = timed(lambda: [_apply_group(receiver, b, True) for b in buckets(named, args.bucket_mb << 20)])
        per_tensor = timed(lambda: _apply_group(receiver, named, False))
    push.wait(timeout=120)
    return {"bare_broadcast_s": bare, "flattened_update_s": flat, "per_tensor_update_s": per_tensor}


def _ipc(args, receiver: WeightReceiver, total: int, options: list[str]) -> dict:
    ipc = subprocess.Popen(
        [sys.executable, "-m", "ops.rl.bench_weights", "--role", "ipc", *options],
        env=_env({"NCCL_NVLS_ENABLE": "0"}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    payloads = [bytes.fromhex(p) for p in json.loads(ipc.stdout.readline())]
    source = torch.empty(args.bucket_mb << 20, dtype=torch.uint8, device="cuda:0")
    target = torch.empty_like(source)
    copies = -(-total // source.numel())  # the same bytes, a bucket at a time
    copy = min(timed(lambda: [target.copy_(source) for _ in range(copies)]) for _ in range(3))
    update = min(timed(lambda: receiver.apply_ipc(payloads, True)) for _ in range(args.repeats))
    ipc.stdin.close()
    ipc.wait(timeout=60)
    return {"device_copy_s": copy, "update_s": update}


def _apply_group(receiver, named, flattened: bool) -> None:
    names = [n for n, _ in named]
    dtypes = ["bfloat16"] * len(named)
    shapes = [list(t.shape) for _, t in named]
    receiver.apply_group(GROUP, names, dtypes, shapes, flattened, [], 60.0)


def _env(extra: dict) -> dict:
    return os.environ | extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--bucket-mb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--role", default="server", choices=("server", "trainer", "ipc"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--transports", default="nccl,ipc", help="nccl (needs two GPUs), ipc")
    args = parser.parse_args()
    if args.role == "trainer":
        trainer(args)
    elif args.role == "ipc":
        ipc_trainer(args)
    else:
        print(json.dumps(server(args), indent=2))


if __name__ == "__main__":
    main()
