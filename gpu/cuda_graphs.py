"""CUDA graphs of decode-only steps, for each batch size in a fixed set (padded up to the next
size) one per kind of plan the attention backend makes (FlashInfer: plain, or shared prefixes read once).

A decode step of an 8B model launches a few hundred kernels; replayed from a graph they cost one
launch. The graphs share their input and attention-metadata buffers, so a graph is only ever
replayed right after `prepare` has planned and filled them for it; the next step's `prepare` is
enqueued on the same stream, so it overwrites them only once this replay has read them. Graphs
are captured largest first into one shared memory pool (a smaller graph reuses the larger one's
activations), and all write their logits into one static buffer. Padded rows feed token 0 at
position 0 and write and read only the KV pool's scratch block.
"""

import bisect
from dataclasses import replace

import torch

from gpu.attention.base import PLAIN_GRAPH
from gpu.batch import HostBatch, token_thirds
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache
from gpu.model import CausalLM
from gpu.staging import Staging

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv: KVCache, staging: Staging, batch_sizes: tuple[int, ...]) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"CUDA graph batch sizes must be positive, got {batch_sizes}")
        if not model.attention_backend.supports_cuda_graphs:
            raise ValueError(f"{type(model.attention_backend).__name__} cannot run inside a CUDA graph")
        self.model, self.kv, self.staging = model, kv, staging
        self.sizes = sorted(set(batch_sizes))
        self.max_batch = self.sizes[-1]
        device = kv.layers[0].device
        # Graph of size B reads ids | positions | slots from the first 3B entries.
        self._inputs = torch.zeros(3 * self.max_batch, dtype=torch.int32, device=device)
        self._logits = torch.empty(self.max_batch, model.config.vocab_size, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}  # by size and the backend's kind
        self._stream = torch.cuda.current_stream(device)
        # While timing (benchmarks): every replay's (size, start event, end event).
        self._timings: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] | None = None

    def start_timing(self) -> None:
        """Times every replay from now on with device events (a benchmark's GPU time per step)."""
        self._timings = []

    def stop_timing(self, size: int) -> list[float]:
        """Stops timing; the seconds each replay of graph size `size` took since `start_timing`
        (waits for the device)."""
        timings, self._timings = self._timings or [], None
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for s, start, end in timings if s == size]

    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a decode batch of `num_seqs` runs at; None above the largest."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    @torch.inference_mode()
    def capture(self, side: torch.cuda.Stream, warm_up: bool = True) -> None:
        """Captures on `side`, a stream other than the default (see PromptGraphs.capture). `warm_up`:
        run each graph's step once before capturing it (compiles kernels, sizes workspaces); a
        capture again over the same model and stream (waking) can do without."""
        pool = None
        backend = self.model.attention_backend
        kinds = [(size, kind) for size in reversed(self.sizes) for kind in backend.graph_kinds(size)]
        # The backend makes its graph buffers at a size's first plan: all of them here, before any
        # capture. (Without this pass, one run of `python -m ops.bench.sleep_wake` saw the memory
        # held grow over the wakes; with it, none did. The cause was not found.)
        for size, kind in kinds:
            backend.prepare_graph(self._upload(self._idle_batch(size)), kind)
            self.staging.release()
        for size, kind in kinds:
            batch = self._upload(self._idle_batch(size))
            static = self._static(batch)
            backend.prepare_graph(batch, kind)
            side.wait_stream(self._stream)  # the plan's copies
            with torch.cuda.stream(side):
                if warm_up:  # on the stream that captures
                    self.model.compute_logits(static, self.kv, out=self._logits[:size])
                # capture_begin directly: torch.cuda.graph's garbage collection and emptying of
                # the cache on entry would cost more than the capture (waking captures again).
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(pool=pool)
                try:
                    self.model.compute_logits(static, self.kv, out=self._logits[:size])
                finally:  # a failed capture must not leave the stream capturing
                    graph.capture_end()
            pool = graph.pool()
            self._graphs[size, kind] = graph
            self._stream.wait_stream(side)
            self.staging.release()
        torch.cuda.synchronize()

    def prepare(self, batch: ForwardBatch) -> str:
        """Plans `batch` (a decode batch padded to a captured size) into the graphs' metadata buffers
        and copies its input ids, positions and slots into their inputs; returns the kind of graph
        the attention backend planned for. The copy reads `batch.token_data` on the stream, so ids
        written there on the device before this call (tokens the previous step drew) are the ones
        the graph feeds."""
        kind = self.model.attention_backend.prepare_graph(batch)
        self._inputs[: 3 * batch.num_seqs].copy_(batch.token_data, non_blocking=True)
        return kind

    def replay(self, size: int, kind: str = PLAIN_GRAPH) -> torch.Tensor:
        """Replays the graph of `size` and `kind`, prepared for it; its logits [size, vocab] float32,
        a view valid until the next replay."""
        graph = self._graphs[size, kind]
        if self._timings is None:
            graph.replay()
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self._stream)
            graph.replay()
            end.record(self._stream)
            self._timings.append((size, start, end))
        return self._logits[:size]

    def _static(self, batch: ForwardBatch) -> ForwardBatch:
        inputs = self._inputs[: 3 * batch.num_seqs]
        tokens = token_thirds(inputs)
        return replace(
            batch,
            token_data=inputs,
            input_ids=tokens.input_ids,
            positions=tokens.positions,
            slot_mapping=tokens.slot_mapping,
            logits_index=None,
        )

    def _idle_batch(self, size: int) -> HostBatch:
        # Every row on the scratch block: capturing writes no KV that a sequence owns.
        return HostBatch.empty(self.kv.block_size).padded(size, self.kv.scratch_block)

    def _upload(self, host: HostBatch) -> ForwardBatch:
        batch, _ = ForwardBatch.from_host(host, self.staging)
        return batch
