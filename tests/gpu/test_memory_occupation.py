"""Sleep and wake (gpu/memory_occupation.py): a runner's memory released by tag and resumed gives the
same greedy tokens, refuses to step while released, and holds no more after 20 cycles. On the CPU,
and (marked `gpu`) on a CUDA device with its graphs, the memory measured from another process."""

import gc
import time

import pytest
import torch

from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from ops.bench.sleep_wake import FREED_TARGET, GROWTH_TOLERANCE_BYTES, WAKE_TARGET_S, FreeMemoryProbe
from tests.devices import needs_cuda
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, generate, random_prompt

PROMPTS = [random_prompt(n, seed=n) for n in (5, 19, 33)]
NEW_TOKENS = 12


@pytest.fixture
def runner(build_tiny_model):
    return ModelRunner(build_tiny_model("llama"), num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)


def greedy(runner) -> list[list[int]]:
    return generate(runner, PROMPTS, NEW_TOKENS, chunk_size=8, arrivals=[0, 1, 2])


@pytest.mark.parametrize("tags", [["weights"], ["kv_cache"], ["cuda_graph"], None])
def test_greedy_tokens_are_the_same_after_a_release_and_resume(runner, tags):
    before = greedy(runner)
    held = runner.memory.device_bytes()
    released = runner.memory.release(tags)
    assert released == frozenset(tags or ("weights", "kv_cache", "cuda_graph"))
    if tags != ["cuda_graph"]:  # the graphs (none on the CPU) hold nothing here
        assert runner.memory.device_bytes() < held
    assert runner.memory.resume(tags) == frozenset()
    assert runner.memory.device_bytes() == held
    assert greedy(runner) == before


def test_released_weights_or_pool_refuse_to_step(runner):
    step = [SequenceInput([5, 6, 7], 0, [0], sample=True)]
    for tag in ("weights", "kv_cache"):
        runner.memory.release([tag])
        with pytest.raises(RuntimeError, match=f"{tag} memory is released"):
            runner.step(step)
        with pytest.raises(RuntimeError, match=tag):
            runner.copy_blocks([(0, 1)])
        runner.memory.resume([tag])
    runner.memory.release(["cuda_graph"])  # alone, it leaves the runner stepping eagerly
    assert runner.step(step)[0] is not None


def test_tags_resume_in_any_order_and_one_by_one(runner):
    before = greedy(runner)
    runner.memory.release(None)
    # slime's order: the weights first (an update would write them here), then the graphs, then the pool.
    assert runner.memory.resume(["weights"]) == {"kv_cache", "cuda_graph"}
    assert runner.memory.resume(["cuda_graph"]) == {"kv_cache"}
    assert runner.memory.release(["weights"]) == {"weights", "kv_cache"}  # again, while half asleep
    assert runner.memory.resume(None) == frozenset()
    assert greedy(runner) == before
    # The weights, then the pool, "cuda_graph" never named: all is back, the graphs too.
    runner.memory.release(None)
    runner.memory.resume(["weights"])
    assert runner.memory.resume(["kv_cache"]) == frozenset()
    assert greedy(runner) == before


def test_unknown_tag_is_refused_by_name(runner):
    with pytest.raises(ValueError, match="'optimizer'"):
        runner.memory.release(["weights", "optimizer"])
    assert runner.memory.released == frozenset()


def test_dropped_weights_take_no_host_copy_and_wait_for_an_update(runner):
    before = greedy(runner)
    saved = {name: p.detach().clone() for name, p in runner.model.named_parameters()}
    runner.memory.release(["weights"], keep_weights=False)
    assert runner.memory.host_bytes() == 0
    runner.memory.resume(["weights"])
    with torch.no_grad():  # what a full update does: every weight written in place
        for name, p in runner.model.named_parameters():
            p.copy_(saved[name])
    assert greedy(runner) == before


def test_a_current_host_copy_is_not_taken_again(runner):
    host = runner.host_weights
    runner.memory.release(["weights"])
    assert host.current
    runner.memory.resume(["weights"])
    copies = [c.data_ptr() for c in host.copies]
    first = host.copies[0].clone()
    host.copies[0].zero_()  # were it copied again, the copy would be whole again
    runner.memory.release(["weights"])
    assert [c.data_ptr() for c in host.copies] == copies and host.copies[0].count_nonzero() == 0
    host.copies[0].copy_(first)
    runner.memory.resume(["weights"])
    host.copies[0].zero_()
    host.changed()  # an update wrote the weights: the next sleep copies them again
    runner.memory.release(["weights"])
    assert torch.equal(host.copies[0], first)
    runner.memory.resume(["weights"])


def test_twenty_cycles_hold_no_more_memory(runner):
    before = greedy(runner)
    awake = runner.memory.device_bytes()
    runner.memory.release(None)
    asleep, host = runner.memory.device_bytes(), runner.memory.host_bytes()
    assert asleep == 0 and host > 0
    runner.memory.resume(None)
    for _ in range(20):
        runner.memory.release(None)
        assert (runner.memory.device_bytes(), runner.memory.host_bytes()) == (asleep, host)
        runner.memory.resume(None)
        assert runner.memory.device_bytes() == awake
    assert greedy(runner) == before


@pytest.fixture
def cuda_runner(build_tiny_model):
    """A runner as the server makes one: the KV pool over most of the free memory, CUDA graphs on;
    with the free memory another process saw before it."""
    torch.cuda.empty_cache()
    probe = FreeMemoryProbe(torch.device("cuda"))
    free_before = probe.free_bytes()
    runner = ModelRunner(build_tiny_model("llama"), device="cuda", block_size=BLOCK_SIZE)
    yield runner, probe, free_before
    probe.close()
    del runner
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@needs_cuda
def test_sleep_frees_the_device_memory_for_another_process_and_wakes_to_the_same_tokens(cuda_runner):
    runner, probe, free_before = cuda_runner
    assert runner.graphs is not None
    before = greedy(runner)
    held = free_before - probe.free_bytes()
    assert runner.memory.release(None) == {"weights", "kv_cache", "cuda_graph"}
    freed = probe.free_bytes() - (free_before - held)
    assert freed >= FREED_TARGET * held, (freed, held)
    started = time.perf_counter()
    runner.memory.resume(None)
    first = runner.step([SequenceInput(PROMPTS[0], 0, [0, 1], sample=True)])[0]
    assert time.perf_counter() - started <= WAKE_TARGET_S
    assert runner.graphs is not None and runner.prompt_graphs is not None  # captured again
    assert first == before[0][0]
    assert greedy(runner) == before


@pytest.mark.gpu
@needs_cuda
def test_releasing_the_pool_releases_the_graphs_which_return_with_it(cuda_runner):
    runner, _, _ = cuda_runner
    before = greedy(runner)
    graphs = runner.graphs
    assert runner.memory.release(["kv_cache"]) == {"kv_cache", "cuda_graph"}
    assert runner.graphs is None
    assert runner.memory.resume(["kv_cache"]) == frozenset()
    assert runner.graphs is not None and runner.graphs is not graphs
    assert greedy(runner) == before


@pytest.mark.gpu
@needs_cuda
def test_twenty_cycles_on_cuda_hold_no_more_memory(cuda_runner):
    runner, probe, _ = cuda_runner
    before = greedy(runner)
    asleep, awake = [], []
    for _ in range(20):
        runner.memory.release(None)
        asleep.append(probe.free_bytes())
        runner.memory.resume(None)
        assert greedy(runner) == before
        awake.append(probe.free_bytes())
    assert asleep[0] - min(asleep) <= GROWTH_TOLERANCE_BYTES, asleep
    assert awake[0] - min(awake) <= GROWTH_TOLERANCE_BYTES, awake
