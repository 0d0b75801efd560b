"""Fault drill: streams a mixed workload (half HTTP through the openai SDK, half over the bus, of
which half want token ids and no text; half greedy, half seeded), kills one actor with SIGKILL
mid-stream, and reports what the clients saw against an uninterrupted run of the same workload.

    python -m ops.fault_drill --kill tokenizer --tokenizers 2 --requests 32 --max-tokens 24

`--shape` serves random weights of a real model's shape (ops/bench/shapes.py) instead of the demo
model, written as a checkpoint from the GPU first; `--deterministic` serves with batch-invariant
kernels, where every request, greedy or seeded, must come out as in the uninterrupted run:

    python -m ops.fault_drill --kill executor --shape llama-3.1-8b --deterministic --requests 16 --max-tokens 200
"""

import argparse
import asyncio
import os
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from openai import AsyncOpenAI

from kernel.model_source import DEMO_MODEL
from ops.bench.shapes import SHAPES
from ops.bus_client import stream_generate
from ops.local_server import RunningServer, start_server
from schemas.generate import GenerateRequest, GenerateResult, SamplingParams

RESTART_WAIT_S = 30.0


@dataclass
class ClientLog:
    """What one client received; `arrivals` are the monotonic times of its chunks."""

    text: str = ""
    token_ids: list[int] | None = None  # bus clients see ids; HTTP clients see text and a count
    request_id: str | None = None  # bus clients choose theirs
    detokenize: bool = True
    completion_tokens: int = 0
    arrivals: list[float] = field(default_factory=list)


def workload(count: int) -> list[dict]:
    """Odd items go over HTTP, even ones over the bus; each door gets greedy and seeded requests, and
    half the bus requests want no text (`detokenize`, which the HTTP clients, on OpenAI's routes, ignore)."""
    return [
        {
            "prompt": f"Request {i}: " + "tell me more " * (i % 5),
            "seed": 1000 + i,
            "temperature": 0.0 if i // 2 % 2 == 0 else 0.8,
            "detokenize": i // 4 % 2 == 0,
        }
        for i in range(count)
    ]


async def over_http(base_url: str, item: dict, max_tokens: int, progress: "Progress") -> ClientLog:
    log = ClientLog()
    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        stream = await client.completions.create(
            model="demo",
            prompt=item["prompt"],
            max_tokens=max_tokens,
            temperature=item["temperature"],
            seed=item["seed"],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if chunk.choices:
                log.text += chunk.choices[0].text
                log.arrivals.append(time.monotonic())
                progress.arrived()
            if chunk.usage:
                log.completion_tokens = chunk.usage.completion_tokens
    return log


async def over_bus(nc, item: dict, max_tokens: int, progress: "Progress", request_id: str) -> ClientLog:
    """Through the reference bus client, which resumes a stream after a bus outage."""
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=item["temperature"],
        seed=item["seed"],
        ignore_eos=True,
        detokenize=item["detokenize"],
    )
    log, chunks = ClientLog(token_ids=[], request_id=request_id, detokenize=item["detokenize"]), []
    request = GenerateRequest(text=item["prompt"], params=params, request_id=request_id)
    async for reply in stream_generate(nc, request):
        if isinstance(reply, GenerateResult):
            break
        chunks.append(reply)
        log.arrivals.append(time.monotonic())
        progress.arrived()
    if [c.sequence for c in chunks] != list(range(len(chunks))):
        raise RuntimeError("a chunk was lost or repeated")
    log.token_ids = [t for c in chunks for t in c.token_ids]
    log.text = "".join(c.text for c in chunks)
    if log.token_ids != reply.token_ids or log.text != reply.text:
        raise RuntimeError("the streamed chunks disagree with the final result")
    log.completion_tokens = reply.completion_tokens
    return log


class Progress:
    """Counts the chunks the clients received, so the drill strikes while streams are flowing."""

    def __init__(self, strike_at: int) -> None:
        self.chunks = 0
        self._strike_at = strike_at
        self.strike = asyncio.Event()

    def arrived(self) -> None:
        self.chunks += 1
        if self.chunks >= self._strike_at:
            self.strike.set()


async def run_workload(
    server: RunningServer, count: int, max_tokens: int, kill=None
) -> tuple[list[ClientLog | BaseException], float | None]:
    """Runs the workload; `kill()` is called once streams are flowing. Returns each client's log
    (or the exception that ended it) and the kill time."""
    nc = await server.connect_nats()
    # A quarter of the way: most requests are mid-stream, whatever the speed of the machine.
    progress = Progress(strike_at=count * max_tokens // 4)
    run = uuid.uuid4().hex[:8]
    tasks = [
        over_http(server.base_url, item, max_tokens, progress)
        if i % 2
        else over_bus(nc, item, max_tokens, progress, f"drill-{run}-{i}")
        for i, item in enumerate(workload(count))
    ]
    gathered = asyncio.gather(*tasks, return_exceptions=True)
    killed_at = None
    if kill:
        await progress.strike.wait()
        killed_at = time.monotonic()
        kill()
    logs = await gathered
    await nc.close()  # every stream has ended: nothing is left to flush, and the bus may still be down
    return logs, killed_at


def failures(logs: list[ClientLog | BaseException]) -> list[BaseException]:
    return [log for log in logs if isinstance(log, BaseException)]


def compare(reference: list[ClientLog], logs: list[ClientLog | BaseException]) -> tuple[int, int]:
    """(requests whose output differs, tokens repeated or missing) among those that completed."""
    differing, token_errors = 0, 0
    for want, got in zip(reference, logs):
        if isinstance(got, BaseException):
            continue
        if got.text != want.text or got.token_ids != want.token_ids:
            differing += 1
        if want.token_ids is not None:
            token_errors += sum(a != b for a, b in zip(got.token_ids, want.token_ids))
            token_errors += abs(len(got.token_ids) - len(want.token_ids))
        else:
            token_errors += abs(got.completion_tokens - want.completion_tokens)
    return differing, token_errors


def stall_s(logs: list[ClientLog], killed_at: float) -> float:
    """The longest any client waited, across the kill, for its next chunk."""
    waits = []
    for log in logs:
        if isinstance(log, BaseException):
            continue
        before = [t for t in log.arrivals if t <= killed_at]
        after = [t for t in log.arrivals if t > killed_at]
        if after:
            waits.append(after[0] - (before[-1] if before else killed_at))
    return max(waits, default=0.0)


async def restarted(server: RunningServer, actor: str, pid: int) -> bool:
    """Whether the supervisor has started `actor` again within RESTART_WAIT_S: a short workload can
    end before the restart does."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while server.process_pids()[actor] == pid:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def write_shape(shape: str, out: Path) -> Path:
    """Random bf16 weights of `shape`, made on the GPU and written as a checkpoint into `out`; the
    device's memory is handed back for the server."""
    import torch

    from gpu.config import ModelConfig
    from gpu.weights import random_model
    from ops.bench.checkpoint import write_checkpoint

    model = random_model(ModelConfig.from_dict(SHAPES[shape]), torch.device("cuda"), torch.bfloat16, seed=0)
    write_checkpoint(model, SHAPES[shape], out, {"model": shape, "seed": 0})
    del model
    torch.cuda.empty_cache()
    return out


async def drill(
    actor: str,
    count: int,
    max_tokens: int,
    tokenizers: int,
    data_dir: Path,
    shape: str | None = None,
    deterministic: bool = False,
) -> dict:
    flags = ["--num-kv-blocks", "512", "--tokenizers", str(tokenizers)]
    flags += ["--deterministic"] if deterministic else []
    model = DEMO_MODEL
    if shape is not None:  # the HTTP clients ask for the demo model by name
        model, flags = str(write_shape(shape, data_dir / "model")), [*flags, "--served-model-name", DEMO_MODEL]
    server = start_server(data_dir / "server", *flags, model=model)
    try:
        reference, _ = await run_workload(server, count, max_tokens)
        if failures(reference):
            raise RuntimeError(f"the uninterrupted run failed: {failures(reference)[0]!r}")
        pid = server.process_pids()[actor]
        logs, killed_at = await run_workload(server, count, max_tokens, kill=lambda: os.kill(pid, signal.SIGKILL))
        differing, token_errors = compare(reference, logs)
        return {
            "actor": actor,
            "model": shape or DEMO_MODEL,
            "deterministic": deterministic,
            "tokenizers": tokenizers,
            "requests": count,
            "max_tokens": max_tokens,
            "lost": len(failures(logs)),
            "differing": differing,
            "tokens_repeated_or_missing": token_errors,
            "longest_stall_s": round(stall_s(logs, killed_at), 2),
            "restarted": await restarted(server, actor, pid),
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--kill", choices=["scheduler", "executor", "tokenizer", "nats-server"], required=True)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--tokenizers", type=int, default=1)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="serve random weights of this shape (needs a GPU)")
    parser.add_argument("--deterministic", action="store_true", help="serve with --deterministic")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        result = asyncio.run(
            drill(
                args.kill,
                args.requests,
                args.max_tokens,
                args.tokenizers,
                Path(data_dir),
                args.shape,
                args.deterministic,
            )
        )
    print(" | ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
