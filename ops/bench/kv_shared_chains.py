"""A session's KV moving to another machine through JetStream's object store, on random weights of
a real model's shape: two servers on one external NATS (JetStream on), each with its own data dir
and disk tier, as two machines would have them.

The first computes a `--prompt-tokens` prompt; its cache_tier puts the chain files in the bucket.
It stops, and a second server starts on an empty data dir: its cache_tier pulls the chains into
its own disk in the background. Once pulled, the time to first token of the same prompt, against
one as long never seen, on the second server. Target <= 0.5 (as a restart on the same machine).
Beside it, the pull's and the puts' rates, and how many recomputes of the prompt the pull took:
a turn that comes before its chain is pulled is recomputed, never made to wait.

    python -m ops.bench.kv_shared_chains --model llama-3.1-8b --json docs/results/kv-shared-chains-llama-3.1-8b.json
    python -m ops.bench.kv_shared_chains --model toy-llama --device cpu --prompt-tokens 512
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kernel.bus import Bus
from kernel.nats_server import EmbeddedNats
from kernel.subjects import Subjects
from ops.bench.checkpoint import random_checkpoint
from ops.bench.kv_tiers import on, serve, settle, tokens
from ops.bench.records import KvSharedChainFigures, Row
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES

BLOCK_TOKENS = 16


async def blocks_in_bucket(nats_url: str) -> int:
    """The blocks the namespace's bucket of chains holds now (each object's description lists them)."""
    bus = await Bus.connect(nats_url, "bench")
    try:
        bucket = await bus.object_bucket(Subjects("llm").chains_bucket, 1 << 40)
        return sum(len(stored.description.split()) for stored in await bucket.objects())
    finally:
        await bus.close()


async def wait_for_puts(nats_url: str, blocks: int, timeout_s: float = 300.0) -> float:
    """Seconds until the bucket holds `blocks` blocks."""
    started = time.monotonic()
    while await blocks_in_bucket(nats_url) < blocks:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the bucket did not get the prompt's {blocks} blocks within {timeout_s} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def rate(events: list[dict]) -> tuple[int, float]:
    """Bytes and seconds of the bucket lane's runs that the events report."""
    return sum(e["bytes"] for e in events), sum(e["seconds"] for e in events)


def run(args) -> Report:
    device = torch.device(args.device)
    report = Report()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report.details.run = run_identity(args.model, device_name, "ops.bench.kv_shared_chains")
    vocab = SHAPES[args.model]["vocab_size"]
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="kv-shared-"))
    checkpoint = random_checkpoint(work / f"model-{args.model}", args.model, device, getattr(torch, dtype))
    nats, nats_loop = EmbeddedNats(work / "nats"), asyncio.new_event_loop()  # the process belongs to its loop
    nats_loop.run_until_complete(nats.start())
    flags = ["--device", device.type, "--dtype", dtype, "--num-kv-blocks", str(args.kv_blocks)]
    flags += ["--nats-url", nats.url, "--host-kv-blocks", str(args.host_blocks), "--disk-kv-gb", str(args.disk_gb)]
    report.note(f"device: {device_name}; {args.model} shape, random {dtype} weights; KV pool {args.kv_blocks} blocks")
    report.note(f"servers: python -m kernel.supervisor {' '.join(flags)} (its own --data-dir each); nats-server -js")
    try:
        prompt = tokens(np.random.default_rng(args.seed), args.prompt_tokens, vocab)
        blocks = args.prompt_tokens // BLOCK_TOKENS
        first = serve(work, "first", checkpoint, flags)
        try:
            asyncio.run(on(first, lambda c: c.generate(prompt, args.answer_tokens)))
            asyncio.run(on(first, settle))
            puts_after_s = asyncio.run(wait_for_puts(nats.url, blocks))
        finally:
            first.stop()
        put_bytes, put_s = rate(first.find("kv_chains_put"))

        second = serve(work, "second", checkpoint, flags)
        try:
            pulled = second.wait_for("kv_chains_pulled", timeout_s=600)
            warm_up = tokens(np.random.default_rng(args.seed + 1), args.prompt_tokens, vocab)
            asyncio.run(on(second, lambda c: c.generate(warm_up, 1)))  # a first prefill of this length, not timed
            moved_s, _ = asyncio.run(on(second, lambda c: c.generate(prompt, args.answer_tokens)))
            other = tokens(np.random.default_rng(args.seed + 2), args.prompt_tokens, vocab)
            recompute_s, _ = asyncio.run(on(second, lambda c: c.generate(other, args.answer_tokens)))
            disk_hits = asyncio.run(on(second, lambda c: c.cache()))["tiers"]["disk"]["hits"]
        finally:
            second.stop()
    finally:
        nats_loop.run_until_complete(nats.stop())
        nats_loop.close()
    figures = KvSharedChainFigures(
        prompt_tokens=args.prompt_tokens,
        moved_ttft_s=moved_s,
        recompute_ttft_s=recompute_s,
        disk_hit_blocks=disk_hits,
        pulled_bytes=pulled["bytes"],
        pull_s=pulled["seconds"],
        put_bytes=put_bytes,
        put_s=put_s,
        puts_done_after_s=puts_after_s,
    )
    add_rows(report, figures)
    report.details.kv_shared_chains = figures
    return report


def add_rows(report: Report, f: KvSharedChainFigures) -> None:
    report.add(
        Row(
            f"another machine: TTFT of a {f.prompt_tokens}-token prompt on a new server (empty data dir), "
            "its chains pulled from the bucket",
            f"{f.moved_ttft_s * 1e3:.1f} ms ({f.disk_hit_blocks} blocks from disk)",
            f"recompute of a prompt as long: {f.recompute_ttft_s * 1e3:.1f} ms",
            f"{f.moved_ttft_s / f.recompute_ttft_s:.3f}",
            "<= 0.5",
        )
    )
    report.add(
        Row(
            f"the pull: {f.pulled_bytes / 2**30:.2f} GiB of chains from the bucket into the disk, in the background",
            f"{f.pull_s:.2f} s ({f.pulled_bytes / f.pull_s / 1e9:.2f} GB/s)",
            f"recompute of the prompt: {f.recompute_ttft_s * 1e3:.1f} ms",
            f"{f.pull_s / f.recompute_ttft_s:.1f}",
            "",
        )
    )
    report.add(
        Row(
            f"the puts: {f.put_bytes / 2**30:.2f} GiB of chains into the bucket, behind the spills",
            f"{f.put_s:.2f} s of the bucket lane ({f.put_bytes / max(f.put_s, 1e-9) / 1e9:.2f} GB/s)",
            f"the bucket whole {f.puts_done_after_s:.2f} s after the disk tier settled",
            "",
            "",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.kv_shared_chains", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kv-blocks", type=int, default=2048, help="the GPU pool, blocks of 16 tokens")
    parser.add_argument("--host-blocks", type=int, default=4096, help="the host tier's slots")
    parser.add_argument("--disk-gb", type=float, default=8.0, help="each server's disk tier, and the bucket")
    parser.add_argument("--prompt-tokens", type=int, default=16384)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--work-dir", default=None, help="keeps the checkpoint between runs (default: a new temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report = run(args)
    report.print_table()
    if args.json:
        report.write_json(args.json)


if __name__ == "__main__":
    main()
