"""Live weight updates through the whole system, each against a bound measured in the same run
(issue 33's "Must show"). A random-weight checkpoint of a real shape is served on GPU 1 (the
supervisor, the bus and every actor a process); trainer processes (ops/bench/weight_trainer.py)
hold random weights of the same shape and push them over SGLang's HTTP routes. CUDA IPC and disk
alone (`--transports ipc disk --streams 0`) run on one GPU:

a. NCCL: a trainer on GPU 0 broadcasts every weight in flattened buckets into the server's weight
   group (`/update_weights_from_distributed` per bucket, under one pause): pause to resume, against
   a bare broadcast of `--bound-mb` between the same two GPUs (bytes / time). Target <= 0.3 s.
b. CUDA IPC: a trainer on the server's GPU shares its weights (`/update_weights_from_tensor`, SGLang's
   serialized_named_tensors, flattened buckets): pause to resume, against a device copy of the
   same bytes. Target <= 0.1 s.
c. Disk: `/update_weights_from_disk` of the checkpoint, its files dropped from the page cache
   (posix_fadvise DONTNEED, no privileges needed), against a sequential read of the same files
   dropped the same way. Target: >= 90% of the read rate.
d. `--streams` greedy streaming requests through a pause in each mode (abort, retract, in_place),
   an NCCL update and the continue: 0 requests lost, 0 tokens repeated or missing, every token's
   version exact (ops/bench/update_streams.py); pause to resume.

    python -m ops.bench.weight_update --model llama-3.1-8b --json docs/results/weight-update-llama-3.1-8b.json
    python -m ops.bench.weight_update --model toy-llama --device cpu   # gloo in place of NCCL; no (b)

NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in every process, the server's included.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from gpu.config import ModelConfig
from gpu.weights import checkpoint_files, random_model
from kernel.nats_server import free_port
from ops.bench.checkpoint import write_checkpoint
from ops.bench.disk_reads import drop_from_page_cache, read_seconds
from ops.bench.records import Row, StreamsThroughUpdate, WeightUpdateFigures
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES
from ops.bench.update_streams import streams_through_update
from ops.local_server import RunningServer, start_server
from ops.rl.sglang_http import SglangHttp

GB = 1e9
MODES = ("abort", "retract", "in_place")
TARGET_S = {"nccl": 0.3, "gloo": 0.3, "ipc": 0.1}
DISK_TARGET = 0.9


@contextmanager
def environment(values: dict[str, str]):
    """`values` in os.environ for what starts meanwhile (the server's processes copy it)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def trainer(role: str, gpu: str | None, *options: str, stdin: bool = False) -> subprocess.Popen:
    """A process of ops/bench/weight_trainer.py on GPU `gpu` (None: the CPU)."""
    env = os.environ | {"NCCL_NVLS_ENABLE": "0"} | ({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})
    command = [sys.executable, "-m", "ops.bench.weight_trainer", role, *options]
    pipe = subprocess.PIPE if stdin else None
    return subprocess.Popen(
        command, env=env, stdin=pipe, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )


def answer(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"{process.args[3]} trainer exited with {process.wait()} before answering")
    return json.loads(line)


def broadcast_bound(args, device: torch.device) -> dict:
    """A bare broadcast of `--bound-mb` between the trainer's device and the server's."""
    options = ["--device", device.type, "--bound-mb", str(args.bound_mb), "--port", str(free_port())]
    gpus = ("0", "1") if device.type == "cuda" else (None, None)
    pair = [trainer("broadcast", gpu, *options, "--rank", str(rank)) for rank, gpu in enumerate(gpus)]
    found = answer(pair[0])
    for process in pair:
        process.wait(timeout=120)
    return found


def server_gpu() -> str:
    """GPU 1, or GPU 0 on a machine with one (CUDA IPC and disk updates need no other)."""
    return "1" if torch.cuda.device_count() > 1 else "0"


def start(args, device: torch.device, work: Path, report: Report) -> tuple[RunningServer, Path]:
    """Writes the checkpoint (seed 0) and serves it on GPU 1 (or the CPU)."""
    raw = SHAPES[args.model]
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = random_model(ModelConfig.from_dict(raw), device, getattr(torch, dtype), seed=0)
    checkpoint = work / f"model-{args.model}"
    written_s = write_checkpoint(model, raw, checkpoint, {"model": args.model, "seed": 0, "dtype": dtype})
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    flags = ["--device", device.type, "--dtype", dtype, "--num-kv-blocks", str(args.kv_blocks)]
    flags += ["--max-num-seqs", str(max(64, args.streams)), "--incremental-streaming-output"]
    placed = {"NCCL_NVLS_ENABLE": "0"} | ({"CUDA_VISIBLE_DEVICES": server_gpu()} if device.type == "cuda" else {})
    with environment(placed):
        server = start_server(work / "server", *flags, model=str(checkpoint))
    report.note(
        f"server: python -m kernel.supervisor {' '.join(flags)} on {placed}; checkpoint written in {written_s:.1f} s"
    )
    return server, checkpoint


def disk(http: SglangHttp, checkpoint: Path, repeats: int) -> WeightUpdateFigures:
    files = checkpoint_files(checkpoint)
    drop_from_page_cache(files)
    rate = sum(f.stat().st_size for f in files) / read_seconds(files)
    answers = []
    for k in range(repeats):
        drop_from_page_cache(files)
        answers.append(http.update_disk(str(checkpoint), f"disk-{k}"))
    loaded = answers[0]["bytes"]
    return WeightUpdateFigures(
        transport="disk",
        tensors=answers[0]["tensors"],
        bytes=loaded,
        buckets=1,
        pause_to_resume_s=[a["pause_s"] for a in answers],
        load_s=[a["load_s"] for a in answers],
        bound_s=loaded / rate,
        bound=f"sequential read of the files, page cache dropped: {rate / GB:.2f} GB/s",
        arrived=True,
    )


def group_updates(group: subprocess.Popen, backend: str, bound: dict, repeats: int) -> WeightUpdateFigures:
    described = answer(group)
    runs = []
    for k in range(repeats):
        group.stdin.write(json.dumps({"version": f"{backend}-{k}", "pause_mode": "in_place"}) + "\n")
        group.stdin.flush()
        runs.append(answer(group))
    rate = bound["bytes"] / bound["seconds"]
    return WeightUpdateFigures(
        transport=backend,
        tensors=described["tensors"],
        bytes=described["bytes"],
        buckets=runs[0]["buckets"],
        pause_to_resume_s=[r["pause_s"] for r in runs],
        load_s=[r["load_s"] for r in runs],
        bound_s=described["bytes"] / rate,
        bound=f"bare {backend} broadcast of {bound['bytes'] >> 20} MiB: {rate / GB:.1f} GB/s",
        arrived=all(r["arrived"] for r in runs),
    )


def ipc_updates(ipc: subprocess.Popen) -> WeightUpdateFigures:
    found = answer(ipc)
    ipc.wait(timeout=120)
    return WeightUpdateFigures(
        transport="ipc",
        tensors=found["tensors"],
        bytes=found["bytes"],
        buckets=found["buckets"],
        pause_to_resume_s=found["pause_s"],
        load_s=found["load_s"],
        bound_s=found["bound_s"],
        bound=f"device copy of the same bytes: {found['bytes'] / found['bound_s'] / GB:.0f} GB/s",
        arrived=found["arrived"],
    )


async def streams(args, http: SglangHttp, group: subprocess.Popen, vocab: int) -> list[StreamsThroughUpdate]:
    rng = np.random.default_rng(args.seed)
    found = []
    for mode in MODES:
        prompts = rng.integers(0, vocab, (args.streams, args.prompt_tokens)).tolist()
        old, new = http.weight_version(), f"{mode}-update"

        async def update(mode=mode, new=new) -> float:
            group.stdin.write(json.dumps({"version": new, "pause_mode": mode}) + "\n")
            group.stdin.flush()
            return (await asyncio.to_thread(answer, group))["pause_s"]

        found.append(await streams_through_update(http.base_url, prompts, args.stream_tokens, mode, old, new, update))
    return found


def size(nbytes: int) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= GB else f"{nbytes / 1e6:.1f} MB"


def report_rows(report: Report, updates: list[WeightUpdateFigures], through: list[StreamsThroughUpdate]) -> None:
    for u in updates:
        best, label = min(u.pause_to_resume_s), f"{u.transport}: {size(u.bytes)}, {u.tensors} tensors"
        if u.transport == "disk":
            rate, bound_rate = u.bytes / min(u.load_s), u.bytes / u.bound_s
            measured = f"load {min(u.load_s):.2f} s, {rate / GB:.2f} GB/s (pause to resume {best:.2f} s)"
            report.add(Row(label, measured, u.bound, f"{rate / bound_rate:.2f}", f">= {DISK_TARGET}"))
            continue
        runs = ", ".join(f"{s:.3f}" for s in u.pause_to_resume_s)
        measured = f"pause to resume {best:.3f} s (runs {runs}; load {min(u.load_s):.3f} s; {u.buckets} buckets)"
        verdict = "" if u.arrived else "; CHECKSUMS DIFFER"
        target = f"<= {TARGET_S[u.transport]} s"
        report.add(Row(label, measured + verdict, f"{u.bound}: {u.bound_s:.3f} s", f"{best / u.bound_s:.1f}", target))
    for s in through:
        measured = f"{s.lost} lost, {s.repeated_or_missing} repeated or missing, {s.version_errors} version errors"
        detail = f"{s.switched} switched versions mid-stream, {s.resumed_parts} resumed; pause to resume {s.pause_to_resume_s:.3f} s"
        report.add(
            Row(
                f"{s.streams} streams x {s.tokens_each} tokens, update paused in {s.mode} mode",
                measured,
                detail,
                "",
                "0, 0, 0",
            )
        )


def run(args) -> Report:
    device = torch.device(args.device)
    report = Report()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report.details.run = run_identity(args.model, device_name, "ops.bench.weight_update")
    grouped = "group" in args.transports or args.streams > 0  # a trainer on another GPU
    if device.type == "cuda" and torch.cuda.device_count() < 2 and grouped:
        raise SystemExit("the group and the streams need two GPUs: the trainer's (0) and the server's (1)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    bound = broadcast_bound(args, device) if "group" in args.transports else {}
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="weight-update-"))
    server, checkpoint = start(args, device, work, report)
    http = SglangHttp(server.base_url)
    options = ["--url", server.base_url, "--model", args.model, "--bucket-mb", str(args.bucket_mb)]
    try:
        updates = [disk(http, checkpoint, args.repeats)] if "disk" in args.transports else []
        gpu = "0" if device.type == "cuda" else None
        group = trainer("group", gpu, *options, "--device", device.type, stdin=True) if grouped else None
        try:
            if "group" in args.transports:
                updates.append(group_updates(group, backend, bound, args.repeats))
            if device.type == "cuda" and "ipc" in args.transports:
                ipc = trainer("ipc", server_gpu(), *options, "--repeats", str(args.repeats))
                updates.append(ipc_updates(ipc))
            vocab = SHAPES[args.model]["vocab_size"]
            through = asyncio.run(streams(args, http, group, vocab)) if args.streams else []
        finally:
            if group is not None:
                group.stdin.close()
                group.wait(timeout=120)
    finally:
        server.stop()
    report.note(
        f"device: {device_name}; model {args.model} shape, random weights; {backend}; buckets of {args.bucket_mb} MiB"
    )
    report.details.weight_update, report.details.update_streams = updates, through
    report_rows(report, updates, through)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.weight_update",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", help="cuda (two GPUs) or cpu")
    parser.add_argument("--bucket-mb", type=int, default=1024, help="of each update request's flattened bucket")
    parser.add_argument("--bound-mb", type=int, default=1024, help="the bare broadcast's size")
    parser.add_argument("--repeats", type=int, default=3, help="whole updates per transport")
    parser.add_argument("--transports", nargs="+", choices=("disk", "group", "ipc"), default=["disk", "group", "ipc"])
    parser.add_argument(
        "--streams", type=int, default=64, help="requests streaming through each mode's update (0: none)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--stream-tokens", type=int, default=512, help="each stream's output")
    parser.add_argument("--kv-blocks", type=int, default=4096, help="the server's KV pool")
    parser.add_argument(
        "--work-dir", default=None, help="where the checkpoint is kept between runs (default: a new temp dir)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    report = run(args)
    report.print_table()
    if args.json:
        report.write_json(args.json)


if __name__ == "__main__":
    main()
