"""`--deterministic` on the GPU, at the shapes of llama-3.1-8b and qwen3-0.6b (random bf16 weights,
CUDA graphs on): one request's tokens and logprobs are the same bits alone, among 255 others, with
its prompt chunked otherwise, with a prefix-cache hit, after a preemption (recomputed from the
prefix cache, or from nothing), greedy and seeded; and a rollout's logprobs are the prompt logprobs
of its finished sequence sent back (teacher forcing). Through the in-process engine: the
scheduler's batcher and the executor's batch as the actors run them, without the bus, which
carries these numbers as they are. A run after the executor was killed is ops.fault_drill's
(`--kill executor --shape ... --deterministic`).

    python -m pytest tests/gpu/test_determinism_cuda.py -x -q
"""

import gc
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from actors.inprocess import InProcessEngine
from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from ops.bench.shapes import SHAPES
from schemas.generate import SamplingParams, TokenLogprobs
from tests.devices import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda]

PROMPT = 700  # three of attention's splits
NEW_TOKENS = 40
TOP = 5
SAMPLINGS = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=0.9, top_p=0.95, seed=123)}


@pytest.fixture(scope="module", params=["qwen3-0.6b", "llama-3.1-8b"])
def runner(request):
    runner = ModelRunner.with_random_weights(
        ModelConfig.from_dict(SHAPES[request.param]),
        "cuda",
        "bfloat16",
        seed=1,
        deterministic=True,
        cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        cuda_graph_token_counts=(128, 512, 2048),
    )
    yield runner
    del runner  # the next shape needs the memory
    gc.collect()
    torch.cuda.empty_cache()


@dataclass
class Run:
    """What one request got, by position: its tokens, their logprob entries, its prompt's."""

    tokens: dict[int, int] = field(default_factory=dict)
    drawn: dict[int, tuple] = field(default_factory=dict)  # output index -> (logprob, top ids, top logprobs)
    scored: dict[int, tuple] = field(default_factory=dict)  # prompt position -> the same
    cached: int = 0

    def record(self, into: dict, start: int, values: list) -> None:
        for i, value in enumerate(values):
            # A run recomputed after a preemption may give a position again: the same bits.
            assert into.setdefault(start + i, value) == value, (start + i, into[start + i], value)

    def entries(self, logprobs: TokenLogprobs) -> list[tuple]:
        return list(zip(logprobs.logprobs, logprobs.top_ids, logprobs.top_logprobs))


def drive(engine: InProcessEngine, before_step: Callable[[dict[str, Run]], None] | None = None) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    while engine.busy:
        if before_step:
            before_step(runs)
        for update in engine.step().updates:
            run = runs.setdefault(update.request_id, Run())
            run.record(run.tokens, update.output_index, update.token_ids)
            if update.logprobs is not None:
                run.record(run.drawn, update.logprobs.start, run.entries(update.logprobs))
            if update.prompt_logprobs is not None:
                run.record(run.scored, update.prompt_logprobs.start, run.entries(update.prompt_logprobs))
            if update.cached_tokens is not None:
                run.cached = max(run.cached, update.cached_tokens)
    return runs


def ours(name: str) -> SamplingParams:
    return SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True, top_logprobs=TOP, **SAMPLINGS[name])


def others(count: int, vocab: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(vocab) for _ in range(rng.randrange(30, 500))],
            SamplingParams(
                max_tokens=rng.randrange(8, 64), ignore_eos=True, temperature=rng.choice([0.0, 1.0]), seed=i
            ),
        )
        for i in range(count)
    ]


def engine_with(runner, requests, **options) -> InProcessEngine:
    engine = InProcessEngine(runner, **options)
    for request_id, prompt, params in requests:
        assert engine.submit(request_id, prompt, params) is None
    return engine


@pytest.fixture(scope="module")
def prompt(runner) -> list[int]:
    rng = random.Random(7)
    return [rng.randrange(runner.vocab_size) for _ in range(PROMPT)]


@pytest.fixture(scope="module")
def alone(runner, prompt) -> dict[str, Run]:
    """Each sampling's request alone in the engine: what every other way must give."""
    return {name: drive(engine_with(runner, [(name, prompt, ours(name))]))[name] for name in SAMPLINGS}


def assert_same(run: Run, reference: Run) -> None:
    assert run.tokens == reference.tokens and len(run.tokens) == NEW_TOKENS
    assert run.drawn == reference.drawn  # each logprob, top id and top logprob, bit for bit


def test_among_255_others(runner, prompt, alone):
    crowd = [(f"other-{i}", p, params) for i, (p, params) in enumerate(others(254, runner.vocab_size, seed=3))]
    mine = [(name, prompt, ours(name)) for name in SAMPLINGS]
    runs = drive(engine_with(runner, [*crowd[:100], *mine, *crowd[100:]], max_num_seqs=256, max_prefill_tokens=8192))
    for name in SAMPLINGS:
        assert_same(runs[name], alone[name])


@pytest.mark.parametrize("budget", [96, 333])
def test_with_its_prompt_chunked_otherwise(runner, prompt, alone, budget):
    crowd = [(f"other-{i}", p, params) for i, (p, params) in enumerate(others(3, runner.vocab_size, seed=budget))]
    for name in SAMPLINGS:
        runs = drive(engine_with(runner, [crowd[0], (name, prompt, ours(name)), *crowd[1:]], max_prefill_tokens=budget))
        assert_same(runs[name], alone[name])


def test_with_a_prefix_cache_hit(runner, prompt, alone):
    for name in SAMPLINGS:
        engine = engine_with(runner, [("warm", prompt[:500], SamplingParams(max_tokens=1))])
        drive(engine)
        assert engine.submit(name, prompt, ours(name)) is None
        run = drive(engine)[name]
        assert run.cached >= 496
        assert_same(run, alone[name])


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["recomputed-from-the-cache", "recomputed-whole"])
def test_after_a_preemption(runner, prompt, alone, prefix_caching):
    crowd = [(f"other-{i}", p, params) for i, (p, params) in enumerate(others(3, runner.vocab_size, seed=9))]
    for name in SAMPLINGS:
        engine = engine_with(runner, [(name, prompt, ours(name)), *crowd], prefix_caching=prefix_caching)
        preempted = []

        def preempt_midway(runs: dict[str, Run]) -> None:
            if not preempted and len(runs.get(name, Run()).tokens) >= NEW_TOKENS // 2:
                engine.batcher.retract_running()
                preempted.append(True)

        run = drive(engine, preempt_midway)[name]
        assert preempted
        assert_same(run, alone[name])


def test_a_rollouts_logprobs_are_its_sequence_sent_back(runner, prompt, alone):
    """Teacher forcing: the finished sequence as a prompt that draws nothing, scored from the first
    output on, gives each output's logprob entry bit for bit."""
    scoring = SamplingParams(max_tokens=0, top_logprobs=TOP, prompt_logprobs_from=PROMPT)
    for name in SAMPLINGS:
        outputs = [alone[name].tokens[i] for i in range(NEW_TOKENS)]
        forced = drive(engine_with(runner, [("forced", prompt + outputs, scoring)], max_prefill_tokens=512))["forced"]
        assert {position - PROMPT: entry for position, entry in forced.scored.items()} == alone[name].drawn
