"""The trainer's side of live weights: what an RL trainer does to push new weights into a running
server, for the tests, the benchmarks and the example trainer.

It joins the weight group as rank 0 (gpu/weight_group.py; the server joins at its rank offset when
asked by `/init_weights_update_group`), describes the tensors in SGLang's request fields
(`update_request`: names, dtypes, shapes, load_format, checksums) and broadcasts them in that
order, one by one or as one flattened bucket; `ipc_payload` (gpu/ipc_tensors.py, beside the
unpickler that opens it) builds `update_weights_from_tensor`'s `serialized_named_tensors` entry.

    python -m ops.rl.weight_push --master-port P --checkpoint DIR [--flattened] [--pause-after N]

joins, prints the update request as one JSON line, broadcasts the checkpoint's tensors and prints
"done" (with --pause-after N: "paused" after N tensors, then waits to be killed: a trainer that
dies mid-broadcast, for the tests).
"""

import argparse
import json
import sys
import time

import torch
from safetensors import safe_open

from gpu.ipc_tensors import ipc_payload
from gpu.weight_check import checksum
from gpu.weight_group import WeightGroup

__all__ = ["WeightPusher", "checkpoint_tensors", "ipc_payload", "update_request"]

NamedTensors = list[tuple[str, torch.Tensor]]


def update_request(named: NamedTensors, flattened: bool, checksums: bool = True) -> dict:
    """The body of SGLang's `/update_weights_from_distributed` for these tensors (without the
    group name and version, which the caller adds)."""
    return {
        "names": [name for name, _ in named],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
        "shapes": [list(t.shape) for _, t in named],
        "load_format": "flattened_bucket" if flattened else None,
        "checksums": [checksum(t) for _, t in named] if checksums else [],
    }


class WeightPusher:
    """Rank 0 of a weight group: joins (returning once every server has) and broadcasts."""

    def __init__(
        self,
        master_port: int,
        world_size: int = 2,
        master_address: str = "127.0.0.1",
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        device: str = "cpu",
        timeout_s: float = 120.0,
    ) -> None:
        self.device = torch.device(device)
        self.group = WeightGroup(
            master_address, master_port, 0, world_size, group_name, backend, self.device, timeout_s
        )

    def push(self, named: NamedTensors, flattened: bool, timeout_s: float = 120.0) -> None:
        """Broadcasts the tensors in order (as one bucket when `flattened`) and waits until sent."""
        self.group.send([t for _, t in named], flattened, time.monotonic() + timeout_s)


def checkpoint_tensors(model_dir: str, device: str = "cpu", dtype: torch.dtype | None = None) -> NamedTensors:
    """The tensors of a single-file checkpoint, in its order, on `device` (cast to `dtype`)."""
    with safe_open(f"{model_dir}/model.safetensors", framework="pt", device=device) as f:
        return [(name, f.get_tensor(name).to(dtype or f.get_tensor(name).dtype)) for name in f.keys()]


def main() -> None:
    parser = argparse.ArgumentParser(description="Push a checkpoint's tensors to a server's weight group.")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--group-name", default="weight_update_group")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="cast the tensors to this dtype first (bfloat16...)")
    parser.add_argument("--checkpoint", required=True, help="a directory with one model.safetensors")
    parser.add_argument("--flattened", action="store_true")
    parser.add_argument("--pause-after", type=int, default=None, help="stop after this many tensors and wait")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype) if args.dtype else None
    named = checkpoint_tensors(args.checkpoint, args.device, dtype)
    pusher = WeightPusher(
        args.master_port, args.world_size, group_name=args.group_name, backend=args.backend, device=args.device
    )
    print(json.dumps(update_request(named, args.flattened)), flush=True)
    if args.pause_after is not None:
        pusher.push(named[: args.pause_after], args.flattened)
        print("paused", flush=True)
        time.sleep(3600)
    pusher.push(named, args.flattened)
    print("done", flush=True)
    sys.stdin.read()  # the store lives in this process: stay until the server has left


if __name__ == "__main__":
    main()
