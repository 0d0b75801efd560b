"""Continuous batching on the plain scheduler and executor objects, with a real tiny model.

Whatever the arrival times, chunk budget, pool size (preemption and eviction included), aborts and
shared prefixes, every request gets the tokens it would get alone, with the prefix cache on or
off, and every KV block is free, cached, or held by the requests that read it.
"""

import random
from collections import Counter

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from actors.inprocess import InProcessEngine
from actors.scheduler.sequence import State
from gpu.runner import ModelRunner
from kernel.randomness import choice_seed
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from tests.sampling import greedy


def seeded(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.95, top_k=40, seed=seed, ignore_eos=True)


def check_blocks(engine: InProcessEngine) -> None:
    """Each block is free, held by the prefix cache alone, or held by one or more requests (and
    maybe the cache); its reference count is its number of holders, so nothing leaks. Requests
    share only blocks that lead their block tables (a cached prefix, or the prompt of the choice
    they fork), before the first token they compute, so no block is written by two requests."""
    batcher = engine.batcher
    pool = batcher.kv.pool
    tree = batcher.kv.cache.cached_blocks()
    in_tree = set(tree)
    assert len(tree) == len(in_tree)
    holders = Counter(tree)
    writable: Counter[int] = Counter()
    locked: set[int] = set()
    for seq in batcher.sequences.values():
        assert (seq.state is State.RUNNING) == bool(seq.blocks)
        assert len(seq.blocks) == len(set(seq.blocks))
        holders.update(seq.blocks)
        writable.update(seq.blocks[seq.computed_len // batcher.kv.block_size :])
        if seq.blocks:
            shared = seq.cached.blocks
            assert seq.blocks[: len(shared)] == shared
            assert len(shared) * batcher.kv.block_size <= seq.computed_len
            node = seq.cached.node
            while node is not None:
                locked.update(node.blocks)
                node = node.parent
    assert all(pool.ref_count(b) == holders[b] for b in range(pool.num_blocks))
    assert pool.num_free == pool.num_blocks - len(holders)
    # A block some request writes has no other holder: not the tree, not another request.
    assert all(holders[b] == 1 for b in writable)
    stats = batcher.kv.cache.stats()
    assert stats.cached_blocks == len(tree)
    assert stats.evictable_blocks == len(in_tree - locked)


def check_all_freed(engine: InProcessEngine) -> None:
    """Once nothing runs, flushing the cache leaves every block free."""
    check_blocks(engine)
    pool = engine.batcher.kv.pool
    cached = engine.batcher.kv.cache.stats().cached_blocks
    assert pool.num_free + cached == pool.num_blocks
    assert engine.batcher.kv.flush() == cached
    assert pool.num_free == pool.num_blocks
    check_blocks(engine)


def choices(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The parameters of each of n choices, as an origin gives them: own seeds, same prompt."""
    if params.seed is None:
        return [params] * n
    return [msgspec.structs.replace(params, seed=choice_seed(params.seed, j)) for j in range(n)]


def run_schedule(runner, requests, arrivals, max_prefill_tokens, max_num_seqs=256, aborts=None, prefix_caching=True):
    """Runs `requests` (prompt, params[, n choices]) arriving at the given steps; `aborts[i]`, if
    set, aborts request i (its first choice, which the others fork) that many steps after its
    arrival. Returns each request's outputs (a list of n outputs where n is given)."""
    engine = InProcessEngine(runner, max_num_seqs, max_prefill_tokens, prefix_caching=prefix_caching)
    aborts = aborts or [None] * len(requests)

    def arrive(step: int) -> None:
        for i, (prompt, params, *n) in enumerate(requests):
            if arrivals[i] == step:
                for j, choice in enumerate(choices(params, n[0] if n else 1)):
                    fork_of = f"r{i}" if j else None
                    assert engine.submit(f"r{i}" + (f".{j}" if j else ""), prompt, choice, fork_of=fork_of) is None
            if aborts[i] is not None and arrivals[i] + aborts[i] == step:
                engine.abort(f"r{i}")
        check_blocks(engine)

    engine.run(arrive, min_steps=max(a + (b or 0) for a, b in zip(arrivals, aborts)) + 1)
    check_all_freed(engine)
    outputs = []
    for i, (_, _, *n) in enumerate(requests):
        ids = [f"r{i}" + (f".{j}" if j else "") for j in range(n[0] if n else 1)]
        outputs.append([engine.outputs[r] for r in ids] if n else engine.outputs[ids[0]])
    return outputs, engine


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


tokens = st.integers(5, 900)


@st.composite
def workloads(draw):
    """Requests whose prompts are a few shared stems plus random suffixes (identical prompts
    included), some with several choices, arriving at random steps, some aborted a few steps later."""
    stems = draw(st.lists(st.lists(tokens, min_size=1, max_size=28), min_size=1, max_size=3))
    requests, arrivals, aborts = [], [], []
    for _ in range(draw(st.integers(2, 6))):
        prompt = draw(st.sampled_from(stems)) + draw(st.lists(tokens, max_size=8))
        n, seed = draw(st.integers(1, 16)), draw(st.one_of(st.none(), st.integers(0, 2**31)))
        params = greedy(n) if seed is None else seeded(n, seed)
        requests.append((prompt, params, draw(st.sampled_from([1, 1, 2, 3]))))
        arrivals.append(draw(st.one_of(st.integers(0, 3), st.integers(0, 20))))
        aborts.append(draw(st.one_of(st.none(), st.none(), st.integers(0, 12))))
    return requests, arrivals, aborts


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads(), max_prefill_tokens=st.sampled_from([3, 8, 64]), num_blocks=st.sampled_from([16, 24, 400]))
def test_batching_and_prefix_cache_never_change_tokens(llama_dir, alone, workload, max_prefill_tokens, num_blocks):
    requests, arrivals, aborts = workload
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=num_blocks, block_size=4)
    runs = {
        caching: run_schedule(runner, requests, arrivals, max_prefill_tokens, aborts=aborts, prefix_caching=caching)[0]
        for caching in (True, False)
    }
    for i, (prompt, params, n) in enumerate(requests):
        for j, choice in enumerate(choices(params, n)):
            expected = alone(prompt, choice)
            for outputs in runs.values():
                if aborts[i] is None or j:
                    assert outputs[i][j] == expected
                else:  # cut short at a step that depends on timing
                    assert outputs[i][j] == expected[: len(outputs[i][j])]


def test_small_pool_preempts_and_resumes(llama_dir, alone):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=20, block_size=4)
    rng = random.Random(0)
    requests = [([rng.randrange(5, 900) for _ in range(12)], greedy(30)) for _ in range(4)]
    outputs, engine = run_schedule(runner, requests, [0, 0, 1, 2], 16)
    assert all(engine.finish_reasons[f"r{i}"] == "length" for i in range(4))
    for (prompt, params), output in zip(requests, outputs):
        assert output == alone(prompt, params)


def test_small_pool_shares_evicts_and_preempts(llama_dir, alone):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=16, block_size=4)
    rng = random.Random(5)
    stems = [[rng.randrange(5, 900) for _ in range(18)] for _ in range(2)]
    requests = [
        (stems[i % 2] + [rng.randrange(5, 900) for _ in range(i % 3)], greedy(16) if i % 2 else seeded(16, i))
        for i in range(6)
    ]
    arrivals = [0, 0, 1, 2, 12, 20]
    for caching in (True, False):
        engine = InProcessEngine(runner, max_prefill_tokens=8, prefix_caching=caching)
        preempted = 0

        def arrive(step: int) -> None:
            for i, (prompt, params) in enumerate(requests):
                if arrivals[i] == step:
                    assert engine.submit(f"r{i}", prompt, params) is None
            check_blocks(engine)

        for i in range(10_000):
            arrive(i)
            if i > max(arrivals) and not engine.busy:
                break
            preempted += len(engine.step().dropped)
        assert preempted > 0
        assert (engine.batcher.kv.cache.stats().hit_tokens > 0) == caching
        for i, (prompt, params) in enumerate(requests):
            assert engine.outputs[f"r{i}"] == alone(prompt, params)
        check_all_freed(engine)


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
    check_all_freed(engine)
    assert len(engine.outputs["b"]) == 50


def run_counting_prefill(engine: InProcessEngine, prefilled: Counter) -> None:
    while engine.busy:
        for update in engine.step().updates:
            prefilled[update.request_id] += update.prefilled_tokens


def test_a_repeated_prompt_is_served_from_the_cache(llama_dir, alone):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    prompt = [(7 * i) % 800 + 5 for i in range(30)]
    prefilled = Counter()
    for request_id, tenant in [("first", ""), ("again", ""), ("elsewhere", "tenant-b")]:
        assert engine.submit(request_id, prompt, greedy(6), tenant=Tenant(tenant)) is None
        run_counting_prefill(engine, prefilled)
        assert engine.outputs[request_id] == alone(prompt, greedy(6))

    assert engine.cached_tokens == {"first": 0, "again": 28, "elsewhere": 0}  # whole blocks, one token left
    assert prefilled == {"first": 30, "again": 2, "elsewhere": 30}
    # The next turn of the chat: the first answer's computed tokens are cached too.
    turn = prompt + engine.outputs["first"] + [11, 12, 13]
    assert engine.submit("turn", turn, greedy(4)) is None
    run_counting_prefill(engine, prefilled)
    assert engine.cached_tokens["turn"] == 32  # 35 computed (the last drawn token has no KV): 8 blocks
    assert prefilled["turn"] == len(turn) - 32
    assert engine.outputs["turn"] == alone(turn, greedy(4))
    stats = engine.batcher.kv.cache.stats()
    assert (stats.hit_tokens, stats.queried_tokens) == (28 + 32, 3 * 30 + len(turn))
    check_all_freed(engine)


def test_without_prefix_caching_nothing_is_cached(llama_dir):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    engine = InProcessEngine(runner, max_prefill_tokens=8, prefix_caching=False)
    prompt = list(range(5, 35))
    prefilled = Counter()
    for request_id in ["first", "again"]:
        engine.submit(request_id, prompt, greedy(6))
        run_counting_prefill(engine, prefilled)
    assert engine.cached_tokens == {"first": 0, "again": 0}
    assert prefilled == {"first": 30, "again": 30}
    assert engine.batcher.kv.pool.num_free == 64
    assert engine.batcher.kv.cache.stats() == (0, 0, 0, 0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_eight_staggered_requests_match_transformers(build_tiny_model, arch):
    model_dir = build_tiny_model(arch)
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=128, block_size=4)
    rng = random.Random(11)
    requests = [
        ([rng.randrange(5, 900) for _ in range(rng.randrange(2, 50))], greedy(rng.randrange(4, 30))) for _ in range(8)
    ]
    outputs, _ = run_schedule(runner, requests, [0, 0, 1, 3, 5, 8, 13, 21], max_prefill_tokens=32)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    for (prompt, params), output in zip(requests, outputs):
        with torch.no_grad():
            expected = hf.generate(
                torch.tensor([prompt]), max_new_tokens=params.max_tokens, do_sample=False, pad_token_id=0
            )
        assert output == expected[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompt_len", [29, 32])  # the prompt ends inside a block, or fills its last one
def test_choices_compute_the_prompt_once_and_draw_their_own_tokens(llama_dir, alone, prompt_len):
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    prompt = [(11 * i) % 800 + 5 for i in range(prompt_len)]
    params = choices(seeded(12, 7), 4)
    for j, choice in enumerate(params):
        assert engine.submit(f"c{j}", prompt, choice, fork_of="c0" if j else None) is None
    prefilled = Counter()
    run_counting_prefill(engine, prefilled)
    assert prefilled == {"c0": prompt_len, "c1": 1, "c2": 1, "c3": 1}
    outputs = [engine.outputs[f"c{j}"] for j in range(4)]
    assert outputs == [alone(prompt, choice) for choice in params]
    assert len({tuple(o) for o in outputs}) == 4  # each choice its own draw
    check_all_freed(engine)
