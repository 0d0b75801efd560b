"""Prefix sharing benchmarks: multi-turn chat and n-sampling, each run with prefix sharing on and
off in the same process on the same requests, through the in-process engine (the scheduler's
batcher and the executor's batch, no bus) on random weights of a real model shape.

    python -m ops.bench.prefix --model llama-3.1-8b [--sessions 64 --turns 8] [--json out.json]

multi-turn: `--sessions` chats of `--turns` turns; every prompt starts with one shared system prompt
  of `--system-tokens`, then the chat so far (earlier user turns and the model's own answers), then
  a new user turn of `--user-tokens`; answers are `--answer-tokens` long. Each chat sends its next
  turn as soon as its answer is complete. Reported: output tokens/s, TTFT, and the prefix hit rate
  (prompt tokens served from the cache / prompt tokens).
no-sharing: the same number of requests and lengths as the first turn, but every prompt random:
  what the cache costs when it never hits (target: at most 2% slower).
n-sampling: `--n-prompts` prompts of `--n-prompt-tokens`, `--n` choices each. On: the choices fork
  one prefill (and the cache is on); off: n independent requests with the cache off.
"""

import argparse
import json
import statistics
import time

import msgspec
import numpy as np
import torch

from actors.inprocess import InProcessEngine
from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from kernel.randomness import choice_seed
from ops.bench.shapes import SHAPES
from schemas.generate import SamplingParams

MAX_PREFILL_TOKENS = 8192


class Run(msgspec.Struct):
    """What one workload measured with sharing on or off; counted while it runs, the rates at its end."""

    seconds: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those served from the prefix cache
    ttft_s: list[float] = []
    tokens_per_s: float = 0.0  # output tokens
    hit_rate: float = 0.0


class Comparison(msgspec.Struct):
    on: Run
    off: Run
    ratio: float  # of output tokens/s, on / off


class PrefixResults(msgspec.Struct):
    """What --json writes."""

    device: str
    args: dict
    results: dict[str, Comparison]  # by workload, as the table names them


class Driver:
    """Steps an engine and calls back when a request produces its first token and when it ends."""

    def __init__(self, engine: InProcessEngine) -> None:
        self.engine = engine
        self.run = Run()
        self.submitted_at: dict[str, float] = {}
        self.prompt_lens: dict[str, int] = {}

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, fork_of: str | None = None) -> None:
        error = self.engine.submit(request_id, prompt, params, fork_of=fork_of)
        if error:
            raise RuntimeError(f"{request_id}: {error.message}")
        self.submitted_at[request_id] = time.perf_counter()
        self.prompt_lens[request_id] = len(prompt)

    def drive(self, on_finish=None) -> Run:
        started = time.perf_counter()
        first_seen: set[str] = set()
        while self.engine.busy:
            output = self.engine.step()
            now = time.perf_counter()
            for update in output.updates:
                rid = update.request_id
                if update.token_ids and rid not in first_seen:
                    first_seen.add(rid)
                    self.run.ttft_s.append(now - self.submitted_at[rid])
                if update.finish_reason:
                    self.run.output_tokens += len(self.engine.outputs[rid])
                    self.run.prompt_tokens += self.prompt_lens[rid]
                    self.run.cached_tokens += self.engine.cached_tokens.get(rid, 0)
                    if on_finish:
                        on_finish(rid)
        self.run.seconds = time.perf_counter() - started
        self.run.tokens_per_s = self.run.output_tokens / self.run.seconds
        self.run.hit_rate = self.run.cached_tokens / max(self.run.prompt_tokens, 1)
        return self.run


class PrefixBench:
    def __init__(self, args: argparse.Namespace, runner: ModelRunner) -> None:
        self.args = args
        self.runner = runner
        self.vocab = runner.vocab_size

    def tokens(self, rng: np.random.Generator, count: int) -> list[int]:
        return rng.integers(0, self.vocab, count).tolist()

    def engine(self, sharing: bool) -> InProcessEngine:
        return InProcessEngine(
            self.runner, max_num_seqs=256, max_prefill_tokens=MAX_PREFILL_TOKENS, prefix_caching=sharing
        )

    def params(self, seed: int = 0) -> SamplingParams:
        return SamplingParams(max_tokens=self.args.answer_tokens, temperature=0.0, seed=seed, ignore_eos=True)

    def multi_turn(self, sharing: bool) -> Run:
        a = self.args
        rng = np.random.default_rng(a.seed)
        system = self.tokens(rng, a.system_tokens)
        users = [[self.tokens(rng, a.user_tokens) for _ in range(a.turns)] for _ in range(a.sessions)]
        chats = [list(system) for _ in range(a.sessions)]
        driver = Driver(self.engine(sharing))

        def send(session: int, turn: int) -> None:
            chats[session] += users[session][turn]
            driver.submit(f"s{session}t{turn}", list(chats[session]), self.params())

        def on_finish(request_id: str) -> None:
            session, turn = (int(x) for x in request_id[1:].split("t"))
            chats[session] += driver.engine.outputs[request_id]
            if turn + 1 < a.turns:
                send(session, turn + 1)

        for session in range(a.sessions):
            send(session, 0)
        return driver.drive(on_finish)

    def no_sharing(self, sharing: bool) -> Run:
        a = self.args
        rng = np.random.default_rng(a.seed + 1)
        driver = Driver(self.engine(sharing))
        for i in range(a.sessions):
            driver.submit(f"r{i}", self.tokens(rng, a.system_tokens + a.user_tokens), self.params())
        return driver.drive()

    def n_sampling(self, sharing: bool) -> Run:
        a = self.args
        rng = np.random.default_rng(a.seed + 2)
        driver = Driver(self.engine(sharing))
        for p in range(a.n_prompts):
            prompt = self.tokens(rng, a.n_prompt_tokens)
            base = SamplingParams(max_tokens=a.answer_tokens, temperature=0.8, seed=p, ignore_eos=True)
            for j in range(a.n):
                params = msgspec.structs.replace(base, seed=choice_seed(p, j))
                driver.submit(f"p{p}c{j}", prompt, params, fork_of=f"p{p}c0" if sharing and j else None)
        return driver.drive()


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(name: str, on: Run, off: Run, target: str) -> Comparison:
    ratio = on.tokens_per_s / off.tokens_per_s
    print(
        f"| {name} | {on.tokens_per_s:,.0f} | {off.tokens_per_s:,.0f} | {ratio:.2f}x | "
        f"{p50(on.ttft_s) * 1e3:.0f} / {p50(off.ttft_s) * 1e3:.0f} ms | {on.hit_rate:.0%} | {target} |",
        flush=True,
    )
    return Comparison(on, off, ratio)


def build_runner(args: argparse.Namespace) -> ModelRunner:
    if args.model_dir:
        return ModelRunner(args.model_dir, device=args.device, num_kv_blocks=args.kv_blocks)
    config = ModelConfig.from_dict(SHAPES[args.model])
    kv_bytes = int(args.kv_cache_gb * (1 << 30)) if args.kv_cache_gb else None
    return ModelRunner.with_random_weights(config, args.device, "bfloat16", seed=args.seed, kv_cache_bytes=kv_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument(
        "--model-dir", default=None, help="a model directory instead (e.g. a tiny one, to check on CPU)"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kv-cache-gb", type=float, default=None)
    parser.add_argument("--kv-blocks", type=int, default=None, help="with --model-dir")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=2048)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--n-prompt-tokens", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    runner = build_runner(args)
    device = torch.cuda.get_device_name() if runner.device.type == "cuda" else "cpu"
    print(
        f"device: {device}; model: {args.model_dir or args.model} ({runner.attention_backend_name}, "
        f"{runner.num_kv_blocks} KV blocks of {runner.block_size}); greedy answers of {args.answer_tokens} tokens"
    )
    # Before timing: kernels that compile or load on first use (FlashInfer's JIT takes over a
    # minute on a fresh machine) do it on a small multi-turn run, whose steps mix decodes and chunks.
    warm_up = PrefixBench(argparse.Namespace(**vars(args) | dict(sessions=4, turns=2)), runner)
    started = time.perf_counter()
    warm_up.multi_turn(sharing=False)
    warm_up.multi_turn(sharing=True)
    print(f"warm-up: {time.perf_counter() - started:.1f} s")
    print(
        "| workload | sharing on, out tok/s | off, out tok/s | on / off | TTFT p50 on / off | prefix hits (on) | target |"
    )
    print("|---|---|---|---|---|---|---|")
    bench = PrefixBench(args, runner)
    results = {}
    for name, workload, target in (
        (
            f"multi-turn, {args.sessions} chats x {args.turns} turns, {args.system_tokens}-token system prompt",
            bench.multi_turn,
            ">= 3x at >= 75% hits",
        ),
        (
            f"no sharing, {args.sessions} random {args.system_tokens + args.user_tokens}-token prompts",
            bench.no_sharing,
            ">= 0.98x",
        ),
        (f"n-sampling, {args.n_prompts} x {args.n_prompt_tokens}-token prompts, n = {args.n}", bench.n_sampling, ""),
    ):
        off = workload(sharing=False)
        on = workload(sharing=True)
        results[name] = report(name, on, off, target)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(msgspec.to_builtins(PrefixResults(device, vars(args), results)), f, indent=2)


if __name__ == "__main__":
    main()
