"""FlashInfer's paged prefill attention called once a layer at the host cost of its kernel launch.

`BatchPrefillWithPagedKVCacheWrapper.run` (FlashInfer 0.7.2) checks and fills in its twenty-odd
options on every call before it hands its compiled module's `paged_run` the 49 arguments the kernel
takes: several times the host time of `paged_run` alone. A prompt step calls it once a layer
under one plan, so for a small model it is most of a prompt step's host time, which its first token
waits on (measurements: docs/journal/benchmarks.md, section "The prompt step's attention calls").
Here the first call after a plan goes through `run`, which is watched for the arguments it gives
`paged_run`; the other layers call `paged_run` with those, their own queries, keys, values and
output put in. Nothing else in them depends on the layer: the rest is the plan (its buffers and
schedule), the options it was made with, and what the device and the cache's shape decide, which
every layer shares.
"""

import torch

# Where in paged_run's arguments FlashInfer 0.7.2's run puts the queries, the layer's keys and
# values (the two halves of its paged cache) and the output.
_Q, _K, _V, _OUT = 3, 4, 5, 10
_ARGUMENTS = 49


class PagedPrefill:
    """A BatchPrefillWithPagedKVCacheWrapper's `plan` and a quicker `run` into a given output."""

    def __init__(self, wrapper) -> None:
        self.wrapper = wrapper
        self._args: list | None = None  # paged_run's arguments under the current plan

    def plan(self, *args, **kwargs) -> None:
        self._args = None
        self.wrapper.plan(*args, **kwargs)

    def run(self, q: torch.Tensor, cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Attention of `q` [T, heads, head_dim] over `cache` [blocks, 2, block_size, kv_heads,
        head_dim] (NHD), written into `out` (like q, contiguous)."""
        if self._args is None:
            self._args = self._run_watched(q, cache, out)
            return out
        if len(q) != self.wrapper._qo_indptr_last or out.shape != q.shape:  # what run() would refuse
            raise ValueError(
                f"queries {tuple(q.shape)} and output {tuple(out.shape)} do not fit the plan's "
                f"{self.wrapper._qo_indptr_last} tokens"
            )
        args = self._args
        args[_Q], args[_OUT] = q, out
        args[_K], args[_V] = cache.unbind(1)
        self.wrapper._cached_module.paged_run(*args)
        return out

    def _run_watched(self, q: torch.Tensor, cache: torch.Tensor, out: torch.Tensor) -> list:
        """Runs the public `run`, keeping the arguments it hands the compiled module."""
        wrapper, module = self.wrapper, self.wrapper._cached_module
        handed: list = []

        class Watcher:
            def __getattr__(self, name):
                return getattr(module, name)

            def paged_run(self, *args):
                handed.extend(args)
                return module.paged_run(*args)

        wrapper._cached_module = Watcher()
        try:
            wrapper.run(q, cache, out=out)
        finally:
            wrapper._cached_module = module
        keys, values = cache.unbind(1)
        if not (
            len(handed) == _ARGUMENTS
            and handed[_Q] is q
            and handed[_OUT] is out
            and handed[_K].data_ptr() == keys.data_ptr()
            and handed[_V].data_ptr() == values.data_ptr()
        ):
            raise RuntimeError(
                "FlashInfer's prefill run did not hand paged_run its arguments as 0.7.2's does "
                "(another version, or a backend other than fa2/fa3); PagedPrefill must learn how"
            )
        return handed
