"""The KV tiers against recompute, through the whole server, on random weights of a real model's
shape (issue 34's "Must show"). A server without tiers and one with them (`--host-kv-blocks`,
`--disk-kv-gb`) run the same requests in turn, on the same checkpoint and GPU pool:

a. multi-turn: `--chats` chats, each a context of `--context-tokens` then turns of `--user-tokens`
   and answers of `--answer-tokens`; every round sends one turn of every chat at once. The working
   set (chats x context) is at least 4x the GPU pool, so without tiers each turn recomputes its
   context. Throughput (prompt and output tokens per second over the rounds after the first), with
   tiers against without. Target >= 2x.
b. host hit: the time to first token of an 8K-token prompt whose blocks the pool evicted but the
   host holds, against a prompt of the same length never seen, on the same server. Target <= 0.15.
   Beside it, the same prefix while the pool still held it: what the host hit adds is its load.
c. no hits: `--cold-requests` random prompts, never repeated, in `--repeats` rounds on the fresh
   server: the median round's throughput with tiers against without. Target >= 0.98.
d. restart: a 16K-token prompt computed, the server stopped (SIGTERM) and started again on the same
   data dir: the time to first token of the same prompt against one never seen, and its greedy
   output against the one before the restart (equal on the CPU in float32; on the GPU in bf16 the
   recomputed last block's shape differs from the first run's, and so may its argmax: issue 36).
   Twice: with the disk tier's files in the page cache, as a restart on the same machine finds
   them (target <= 0.5, the same tokens), and dropped from it: read from the disk itself, beside
   the disk's own time to read as many bytes on as many threads, which bounds it.

    python -m ops.bench.kv_tiers --model llama-3.1-8b --json docs/results/kv-tiers-llama-3.1-8b.json
    python -m ops.bench.kv_tiers --model toy-llama --device cpu --kv-blocks 64 --chats 4 --context-tokens 256 --user-tokens 32 \\
        --hit-tokens 256 --restart-tokens 512 --cold-requests 8 --cold-tokens 128
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import torch

from ops.bench.checkpoint import random_checkpoint
from ops.bench.disk_reads import cold_read_s, drop_from_page_cache
from ops.bench.records import KvTierFigures, Row
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES
from ops.local_server import RunningServer, start_server

GREEDY = {"temperature": 0, "ignore_eos": True}


class Client:
    """Streams `/generate` requests of token ids; each answers (seconds to first token, output ids)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session, self.base_url = session, base_url

    async def generate(self, ids: list[int], max_tokens: int) -> tuple[float, list[int]]:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_tokens, **GREEDY}, "stream": True}
        started = time.perf_counter()
        first, output = None, []
        async with self.session.post(f"{self.base_url}/generate", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[len(b"data: ") :])
                if event.get("output_ids"):
                    first = first or time.perf_counter() - started
                    output = event["output_ids"]
        return first or 0.0, output

    async def cache(self) -> dict:
        async with self.session.get(f"{self.base_url}/admin/cache") as response:
            return await response.json()


def tokens(rng: np.random.Generator, count: int, vocab: int) -> list[int]:
    return rng.integers(10, vocab - 10, count).tolist()


async def multi_turn(client: Client, args, vocab: int) -> float:
    """Prompt and output tokens per second over the rounds after the first."""
    rng = np.random.default_rng(args.seed)
    chats = [tokens(rng, args.context_tokens, vocab) for _ in range(args.chats)]
    done, started = 0, 0.0
    for round_ in range(args.rounds):
        if round_ == 1:
            started, done = time.perf_counter(), 0
        turns = [chat + tokens(rng, args.user_tokens, vocab) for chat in chats]
        answers = await asyncio.gather(*(client.generate(turn, args.answer_tokens) for turn in turns))
        chats = [turn + output for turn, (_, output) in zip(turns, answers)]
        done += sum(len(turn) + len(output) for turn, (_, output) in zip(turns, answers))
    return done / (time.perf_counter() - started)


async def cold(client: Client, args, vocab: int) -> list[float]:
    """Prompt and output tokens per second of random prompts, never repeated: a round of new prompts
    per repeat, so that a round's noise is seen as such (the rounds come first on a fresh server,
    before any other workload's blocks are being saved)."""
    rounds = []
    for round_ in range(args.repeats):
        rng = np.random.default_rng([args.seed + 1, round_])
        prompts = [tokens(rng, args.cold_tokens, vocab) for _ in range(args.cold_requests)]
        started = time.perf_counter()
        answers = await asyncio.gather(*(client.generate(p, args.answer_tokens) for p in prompts))
        rounds.append(sum(len(p) + len(out) for p, (_, out) in zip(prompts, answers)) / (time.perf_counter() - started))
    return rounds


async def host_hits(client: Client, args, vocab: int) -> tuple[list[float], list[float], list[float]]:
    """TTFTs of prompts whose prefix the host holds after the pool evicted it, of fresh ones, and of
    the same prefixes while the pool still held them."""
    rng = np.random.default_rng(args.seed + 2)
    hits, fresh, on_gpu = [], [], []
    evict_count = args.kv_blocks * 16 // args.hit_tokens + 2  # more prompts than the pool holds
    for _ in range(args.repeats):
        prefix = tokens(rng, args.hit_tokens, vocab)
        await client.generate(prefix, 1)
        on_gpu.append((await client.generate(prefix + tokens(rng, 16, vocab), 1))[0])
        # Each hit as often as the prefix: the pool keeps the prefixes hit most, and evicts the
        # least recently used of those hit as often.
        for _ in range(evict_count):
            other = tokens(rng, args.hit_tokens, vocab)
            await client.generate(other, 1)
            await client.generate(other + tokens(rng, 16, vocab), 1)
        host_hits_before = (await client.cache())["tiers"]["host"]["hits"]
        hits.append((await client.generate(prefix + tokens(rng, 16, vocab), 1))[0])
        loaded = (await client.cache())["tiers"]["host"]["hits"] - host_hits_before
        prefix_blocks = args.hit_tokens // 16
        if loaded < prefix_blocks:
            raise RuntimeError(f"the host served {loaded} of the prefix's {prefix_blocks} blocks: not a host hit")
        fresh.append((await client.generate(tokens(rng, args.hit_tokens + 16, vocab), 1))[0])
    return hits, fresh, on_gpu


async def settle(client: Client, timeout_s: float = 300.0) -> None:
    """Until the disk tier has every block the host holds (its writes run behind)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await client.cache())["tiers"]["disk"]["pending_blocks"] == 0:
            return
        await asyncio.sleep(0.2)


async def on(server: RunningServer, work) -> object:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        return await work(Client(session, server.base_url))


def serve(work: Path, name: str, checkpoint: Path, flags: list[str]) -> RunningServer:
    return start_server(work / name, *flags, model=str(checkpoint))


def restart(work: Path, checkpoint: Path, flags: list[str], prompt: list[int], args, vocab: int, drop: bool):
    """The server started again on the data dir of the last (`drop`: the disk tier's files out of
    the page cache first): the TTFT of `prompt`, of one as long never seen, the blocks read from
    disk, `prompt`'s greedy output; with `drop`, the disk's own time to read as many bytes cold, and
    those bytes."""
    if drop:
        drop_from_page_cache([path for path in (work / "disk").rglob("*") if path.is_file()])
    server = serve(work, "on", checkpoint, flags)
    try:
        warm_up = tokens(np.random.default_rng(args.seed + 6 + drop), args.restart_tokens, vocab)
        asyncio.run(on(server, lambda c: c.generate(warm_up, 1)))  # a first prefill of this length, not timed
        restored_s, output = asyncio.run(on(server, lambda c: c.generate(prompt, args.answer_tokens)))
        other = tokens(np.random.default_rng(args.seed + 4 + drop), args.restart_tokens, vocab)
        recompute_s, _ = asyncio.run(on(server, lambda c: c.generate(other, args.answer_tokens)))
        disk = asyncio.run(on(server, lambda c: c.cache()))["tiers"]["disk"]
    finally:
        server.stop()
    fetched = disk["hits"]
    size = fetched * disk["bytes"] // max(disk["blocks"], 1)  # the blocks are of one size
    return restored_s, recompute_s, fetched, output, (cold_read_s(work / "disk", size) if drop else 0.0), size


def run(args) -> Report:
    device = torch.device(args.device)
    report = Report()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report.details.run = run_identity(args.model, device_name, "ops.bench.kv_tiers")
    raw = SHAPES[args.model]
    vocab = raw["vocab_size"]
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="kv-tiers-"))
    checkpoint = random_checkpoint(work / f"model-{args.model}", args.model, device, getattr(torch, dtype))
    base = ["--device", device.type, "--dtype", dtype, "--num-kv-blocks", str(args.kv_blocks)]
    base += ["--max-num-seqs", "64", "--incremental-streaming-output"]
    tiers = ["--host-kv-blocks", str(args.host_blocks), "--disk-kv-gb", str(args.disk_gb)]
    tiers += ["--disk-kv-dir", str(work / "disk")]
    report.note(f"device: {device_name}; {args.model} shape, random {dtype} weights; KV pool {args.kv_blocks} blocks")
    report.note(f"server: python -m kernel.supervisor {' '.join(base)}; tiers: {' '.join(tiers)}")

    server = serve(work, "off", checkpoint, base)
    try:
        cold_off = asyncio.run(on(server, lambda c: cold(c, args, vocab)))
        turns_off = asyncio.run(on(server, lambda c: multi_turn(c, args, vocab)))
    finally:
        server.stop()
    server = serve(work, "on", checkpoint, base + tiers)
    try:
        cold_on = asyncio.run(on(server, lambda c: cold(c, args, vocab)))
        turns_on = asyncio.run(on(server, lambda c: multi_turn(c, args, vocab)))
        hits, fresh, on_gpu = asyncio.run(on(server, lambda c: host_hits(c, args, vocab)))
        long_prompt = tokens(np.random.default_rng(args.seed + 3), args.restart_tokens, vocab)
        _, before = asyncio.run(on(server, lambda c: c.generate(long_prompt, args.answer_tokens)))
        asyncio.run(on(server, settle))
    finally:
        server.stop()
    restarts = [restart(work, checkpoint, base + tiers, long_prompt, args, vocab, drop) for drop in (False, True)]
    figures = KvTierFigures(
        kv_blocks=args.kv_blocks,
        working_set_tokens=args.chats * (args.context_tokens + args.rounds * (args.user_tokens + args.answer_tokens)),
        multi_turn_tokens_s_on=turns_on,
        multi_turn_tokens_s_off=turns_off,
        host_hit_ttft_s=hits,
        fresh_ttft_s=fresh,
        gpu_hit_ttft_s=on_gpu,
        cold_tokens_s_on=cold_on,
        cold_tokens_s_off=cold_off,
        restart_ttft_s=[r[0] for r in restarts],
        restart_recompute_ttft_s=[r[1] for r in restarts],
        restart_fetched_blocks=[r[2] for r in restarts],
        restart_same_tokens=all(r[3] == before for r in restarts),
        restart_disk_read_s=restarts[1][4],
        restart_disk_read_bytes=restarts[1][5],
    )
    add_rows(report, figures, args)
    report.details.kv_tiers = figures
    return report


def add_rows(report: Report, f: KvTierFigures, args) -> None:
    pool_tokens = f.kv_blocks * 16
    ratio = f.multi_turn_tokens_s_on / f.multi_turn_tokens_s_off
    report.add(
        Row(
            f"multi-turn: {args.chats} chats of {args.context_tokens}+ tokens, working set "
            f"{f.working_set_tokens / pool_tokens:.1f}x the pool",
            f"{f.multi_turn_tokens_s_on:.0f} tokens/s with tiers",
            f"without tiers (recompute): {f.multi_turn_tokens_s_off:.0f} tokens/s",
            f"{ratio:.2f}",
            ">= 2",
        )
    )
    hit, fresh = statistics.median(f.host_hit_ttft_s), statistics.median(f.fresh_ttft_s)
    on_gpu = f" (the same prefix still on the GPU: {statistics.median(f.gpu_hit_ttft_s) * 1e3:.1f} ms)"
    report.add(
        Row(
            f"host hit: TTFT of a {args.hit_tokens}-token prefix the pool evicted",
            f"{hit * 1e3:.1f} ms (median of {len(f.host_hit_ttft_s)})",
            f"recompute of a prompt as long: {fresh * 1e3:.1f} ms" + (on_gpu if f.gpu_hit_ttft_s else ""),
            f"{hit / fresh:.3f}",
            "<= 0.15",
        )
    )
    cold_on, cold_off = statistics.median(f.cold_tokens_s_on), statistics.median(f.cold_tokens_s_off)
    report.add(
        Row(
            f"no hits: {args.cold_requests} random prompts of {args.cold_tokens} tokens, "
            f"median of {len(f.cold_tokens_s_on)} rounds",
            f"{cold_on:.0f} tokens/s with tiers (rounds {', '.join(f'{r:.0f}' for r in f.cold_tokens_s_on)})",
            f"without tiers: {cold_off:.0f} tokens/s (rounds {', '.join(f'{r:.0f}' for r in f.cold_tokens_s_off)})",
            f"{cold_on / cold_off:.3f}",
            ">= 0.98",
        )
    )
    # The target is the restart's as a SIGTERM and a start on the same machine leave it: the page
    # cache keeps the files. Without it the disk's own read rate bounds the restore, shown beside it.
    for k, cache in enumerate(("kept", "dropped")):
        restored, recomputed = f.restart_ttft_s[k], f.restart_recompute_ttft_s[k]
        bound = f"recompute of a prompt as long: {recomputed * 1e3:.1f} ms"
        if cache == "dropped":
            size, read_s = f.restart_disk_read_bytes, f.restart_disk_read_s
            amount = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
            bound += f"; the disk's own read of those {amount}: {read_s * 1e3:.1f} ms"
            bound += f" ({size / read_s / 1e9:.2f} GB/s)" if read_s else ""
        report.add(
            Row(
                f"restart: TTFT of a {args.restart_tokens}-token prompt after a whole-server restart, "
                f"page cache {cache}",
                f"{restored * 1e3:.1f} ms ({f.restart_fetched_blocks[k]} blocks from disk); "
                f"greedy tokens {'equal' if f.restart_same_tokens else 'differ from'} the first run's",
                bound,
                f"{restored / recomputed:.3f}",
                "<= 0.5" if cache == "kept" else "",
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.kv_tiers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kv-blocks", type=int, default=2048, help="the GPU pool, blocks of 16 tokens")
    parser.add_argument("--host-blocks", type=int, default=12288, help="the host tier's slots")
    parser.add_argument("--disk-gb", type=float, default=40.0)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--context-tokens", type=int, default=16384)
    parser.add_argument("--user-tokens", type=int, default=256)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hit-tokens", type=int, default=8192)
    parser.add_argument("--restart-tokens", type=int, default=16384)
    parser.add_argument("--cold-requests", type=int, default=64)
    parser.add_argument("--cold-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
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
