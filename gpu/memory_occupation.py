"""Sleep and wake: the runner's device memory handed back to the driver by tag and taken again, so a
trainer can use the GPU between rollouts (SGLang's release/resume_memory_occupation, vLLM's
sleep/wake_up). The executor drives it, between steps, after the scheduler has retracted what ran.

Tags: "weights" (kept in the runner's pinned host copy, gpu/host_weights.py, or dropped when a full
update will fill them again), "kv_cache" (the pool; its content is forgotten, so the scheduler
flushes its prefix cache) and "cuda_graph" (the captured graphs: their memory pool and buffers).

Waking captures the graphs again, rather than keeping their addresses valid. Keeping them is
torch_memory_saver's way: every allocation of the weights, the pool and the graphs' pools goes
through a CUDA virtual-memory allocator (a compiled allocator plugged into torch as a MemPool) that
unmaps the physical memory on release and maps new memory at the same virtual addresses on resume.
That needs native code built for each machine, every such allocation made inside its region (by the
loader, by weight updates, by each capture) and none of torch's cached blocks shared across regions;
a slip reads unmapped memory in a later replay. Capturing again takes the path start-up takes, and
costs only time: for llama-3.1-8b well within the 3 s wake-to-token target, since a capture over
the same model and stream skips the warm-ups (docs/results/sleep-wake-llama-3.1-8b.json, from
`python -m ops.bench.sleep_wake`).

So the tags imply one another: the graphs read the weights' and the pool's addresses, which move when
either is released (their storages shrink to nothing and grow back elsewhere), so releasing either
releases "cuda_graph" too. The graphs come back as soon as the weights and the pool are both back,
in whichever order and calls they are resumed (slime resumes the weights, updates them, then resumes
cuda_graph, then kv_cache; others resume the weights, then the pool). A runner whose weights or
pool are released refuses to step; with only its graphs released it steps eagerly.

What stays on the device: the CUDA context and loaded kernels, the attention backend's workspace and
graph wrappers' buffers (small, but each pins the segment of torch's cache it sits in), the token
rules' and sampler's buffers, the staging buffer: a few GB at most beside the weights and the pool.
The first release of the weights allocates their pinned host copy, which takes seconds; later ones
reuse it.
"""

from collections.abc import Iterable

import torch

WEIGHTS, KV_CACHE, CUDA_GRAPH = "weights", "kv_cache", "cuda_graph"
TAGS = frozenset((WEIGHTS, KV_CACHE, CUDA_GRAPH))


def memory_tags(tags: Iterable[str] | None) -> frozenset[str]:
    """`tags` as a set, None meaning every tag. Raises ValueError naming an unknown tag."""
    if tags is None:
        return TAGS
    found = frozenset(tags)
    if unknown := sorted(found - TAGS):
        raise ValueError(f"tags: unknown memory tag {unknown[0]!r}; the tags are {', '.join(sorted(TAGS))}")
    return found


class MemoryOccupation:
    """The device memory of `runner` (a ModelRunner) by tag. One per runner: `runner.memory`. Call
    between steps, with none in flight; not thread-safe."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self._asked: set[str] = set()  # released by the caller and not resumed since
        self._weights_kept = True  # whether the released weights went to the host copy

    @property
    def released(self) -> frozenset[str]:
        """The tags whose memory is back with the driver now: those released and not resumed, and
        "cuda_graph" while the graphs wait for the weights or the pool."""
        dropped = self.runner.graph_sizes is not None and self.runner.graphs is None
        return frozenset(self._asked | ({CUDA_GRAPH} if dropped else set()))

    @property
    def resident(self) -> bool:
        """Whether a step may run: the weights and the pool both hold their memory."""
        return not self._asked & {WEIGHTS, KV_CACHE}

    def check_resident(self) -> None:
        """Raises RuntimeError when a step would read released memory."""
        if not self.resident:
            asleep = sorted(self._asked & {WEIGHTS, KV_CACHE})
            raise RuntimeError(f"the runner's {' and '.join(asleep)} memory is released: resume it before stepping")

    def release(self, tags: Iterable[str] | None = None, keep_weights: bool = True) -> frozenset[str]:
        """Hands the memory of `tags` (None: all) back to the driver; returns `released`. Tags
        released already are left as they are. `keep_weights`: the weights go to the host copy
        (taken again only if the weights changed since it was), which `resume` restores; False
        drops them, and `resume` gives them memory uninitialised, for a full update to fill before
        the next step."""
        tags = memory_tags(tags)
        runner, host = self.runner, self.runner.host_weights
        fresh = tags - self._asked
        self._synchronize()  # no step in flight reads what is freed
        if WEIGHTS in fresh and keep_weights and not host.current:
            host.refresh()  # first, while nothing is released yet: the one step here that may fail (pinned memory)
        if fresh:
            runner.graphs = runner.prompt_graphs = None  # any tag moves or frees what the graphs read
        if KV_CACHE in fresh:
            runner.kv.release()
        if WEIGHTS in fresh:
            host.release()
            self._weights_kept = keep_weights
        self._asked |= tags
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()  # the freed blocks, and the graphs' pool, from torch's cache to the driver
        return self.released

    def resume(self, tags: Iterable[str] | None = None) -> frozenset[str]:
        """Takes the memory of `tags` (None: all) again: the weights restored from the host copy
        (or uninitialised, if dropped), the pool empty, the graphs captured again once the weights,
        the pool and "cuda_graph" have all been resumed. Returns `released`. On failure (the device
        out of memory) what was resumed stays resumed and `released` says what was not."""
        tags = memory_tags(tags)
        runner = self.runner
        if WEIGHTS in tags & self._asked:
            if self._weights_kept:
                runner.host_weights.restore()
            else:
                runner.host_weights.reallocate()
            self._asked.discard(WEIGHTS)
        if KV_CACHE in tags & self._asked:
            runner.kv.reallocate()
            self._asked.discard(KV_CACHE)
        self._asked -= tags
        if self.resident:
            # The graphs read only the weights and the pool: once both are back the graphs are too,
            # "cuda_graph" named or not (a client that resumes the weights and the pool alone would
            # otherwise step eagerly for good).
            self._asked.discard(CUDA_GRAPH)
            if runner.graphs is None:
                runner.capture_graphs(warm_up=False)  # none where the runner captured none at start
        return self.released

    def device_bytes(self) -> int:
        """The device memory held now: on CUDA all that torch's allocator holds for this process
        (the executor's runner and its workings), elsewhere the weights' and the pool's bytes."""
        runner = self.runner
        if runner.device.type == "cuda":
            return torch.cuda.memory_reserved(runner.device)
        weights = sum(t.untyped_storage().nbytes() for t in runner.host_weights.tensors)
        return weights + runner.kv.nbytes

    def host_bytes(self) -> int:
        """The host memory the weights' copy holds (pinned on CUDA), taken once and reused."""
        host = self.runner.host_weights
        return 0 if host.copies is None else host.nbytes

    def _synchronize(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
