"""Continuous batching on the plain scheduler and executor objects, with a real tiny model.

Whatever the arrival times, chunk budget and pool size (preemption included), every request gets
the tokens it would get alone, and every KV block is either free or held by exactly one request.
"""

import random

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from actors.executor.inprocess import InProcessEngine
from actors.scheduler.sequence import State
from gpu.runner import ModelRunner
from schemas.generate import SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def seeded(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.95, top_k=40, seed=seed, ignore_eos=True)


def check_blocks(engine: InProcessEngine) -> None:
    """Each block is free or held by exactly one running request; nothing leaks."""
    pool = engine.batcher.pool
    held = [b for seq in engine.batcher.sequences.values() for b in seq.blocks]
    assert len(held) == len(set(held))
    assert all(pool.ref_count(b) == 1 for b in held)
    assert len(held) + pool.num_free == pool.num_blocks
    for seq in engine.batcher.sequences.values():
        assert (seq.state is State.RUNNING) == bool(seq.blocks)


def run_schedule(runner, requests, arrivals, max_prefill_tokens, max_num_seqs=256):
    engine = InProcessEngine(runner, max_num_seqs=max_num_seqs, max_prefill_tokens=max_prefill_tokens)

    def arrive(step: int) -> None:
        for i, (prompt, params) in enumerate(requests):
            if arrivals[i] == step:
                assert engine.submit(f"r{i}", prompt, params) is None
        check_blocks(engine)

    engine.run(arrive, min_steps=max(arrivals) + 1)
    check_blocks(engine)
    assert engine.batcher.pool.num_free == engine.batcher.pool.num_blocks
    return [engine.outputs[f"r{i}"] for i in range(len(requests))], engine


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


@pytest.fixture(scope="module")
def alone(llama_dir):
    """Each request run by itself on a roomy pool: the reference."""
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=256, block_size=4)
    cache = {}

    def run(prompt, params):
        key = (tuple(prompt), msgspec.msgpack.encode(params))
        if key not in cache:
            cache[key] = run_schedule(runner, [(prompt, params)], [0], 4096)[0][0]
        return cache[key]

    return run


request_strategy = st.tuples(
    st.lists(st.integers(5, 900), min_size=1, max_size=40),
    st.integers(1, 24),
    st.one_of(st.none(), st.integers(0, 2**31)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(request_strategy, min_size=1, max_size=6),
    arrivals=st.lists(st.integers(0, 30), min_size=6, max_size=6),
    max_prefill_tokens=st.sampled_from([3, 8, 64]),
    num_blocks=st.sampled_from([16, 24, 400]),
)
def test_batching_never_changes_tokens(llama_dir, alone, requests, arrivals, max_prefill_tokens, num_blocks):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=num_blocks, block_size=4)
    built = [(prompt, greedy(n) if seed is None else seeded(n, seed)) for prompt, n, seed in requests]
    outputs, _ = run_schedule(runner, built, arrivals[: len(built)], max_prefill_tokens)
    for (prompt, params), output in zip(built, outputs):
        assert output == alone(prompt, params)


def test_small_pool_preempts_and_resumes(llama_dir, alone):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=20, block_size=4)
    rng = random.Random(0)
    requests = [([rng.randrange(5, 900) for _ in range(12)], greedy(30)) for _ in range(4)]
    outputs, engine = run_schedule(runner, requests, [0, 0, 1, 2], 16)
    assert all(engine.finish_reasons[f"r{i}"] == "length" for i in range(4))
    for (prompt, params), output in zip(requests, outputs):
        assert output == alone(prompt, params)


def test_abort_frees_blocks(llama_dir):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    engine.submit("a", list(range(5, 40)), greedy(50))
    engine.submit("b", list(range(5, 20)), greedy(50))
    for _ in range(6):
        engine.step()
    engine.abort("a")
    check_blocks(engine)
    engine.run()
    assert engine.batcher.pool.num_free == 64
    assert len(engine.outputs["b"]) == 50


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_eight_staggered_requests_match_transformers(build_tiny_model, arch):
    model_dir = build_tiny_model(arch)
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=128, block_size=4)
    rng = random.Random(11)
    requests = [([rng.randrange(5, 900) for _ in range(rng.randrange(2, 50))], greedy(rng.randrange(4, 30))) for _ in range(8)]
    outputs, _ = run_schedule(runner, requests, [0, 0, 1, 3, 5, 8, 13, 21], max_prefill_tokens=32)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    for (prompt, params), output in zip(requests, outputs):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=params.max_tokens, do_sample=False, pad_token_id=0)
        assert output == expected[0, len(prompt):].tolist()
