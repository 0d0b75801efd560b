"""The model, its KV pool and the sampler behind `launch` and `step`: what the executor actor drives.

The runner knows nothing of requests or scheduling. Each step it is told, per sequence, which new
tokens to feed, where they go in the KV pool and how to sample; it returns the drawn tokens.
Block ids are owned by the scheduler; the runner only checks that they are in range.

On CUDA `launch` enqueues a step and returns at once. It prepares (numpy metadata, one
host-to-device copy, the input ids that the previous step drew gathered on the device, the
attention plan), runs the forward pass (a graph replay for decode batches up to the largest
captured size; for steps with prompt tokens, replays of the layers' pieces around eager attention;
gpu/step_shape.py picks the shape) and draws (the sampler, the logprobs asked (gpu/logprobs.py), and a non-blocking copy of both into
pinned memory). `PendingStep.tokens` waits for that copy, the step's one sync; the host builds and
launches the next step meanwhile, so the GPU does not wait for it.
"""

from collections.abc import Callable
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gpu import invariant
from gpu.attention import BackendInputs, make_backend
from gpu.batch import HostBatch
from gpu.batch_limits import BatchLimits
from gpu.config import ModelConfig, resolve_dtype
from gpu.cuda_graphs import DEFAULT_BATCH_SIZES, DecodeGraphs
from gpu.forward_batch import ForwardBatch
from gpu.host_weights import HostWeights
from gpu.kv_cache import KVCache
from gpu.logit_rules import LogitRules, StepRules
from gpu.logprobs import LogprobArrays, LogprobRequests
from gpu.memory_occupation import MemoryOccupation
from gpu.model import CausalLM, LastLayer
from gpu.pooling import PoolingArrays, PoolingRequests
from gpu.previous_draw import PreviousDraw
from gpu.prompt_graphs import DEFAULT_TOKEN_COUNTS, PromptGraphs
from gpu.sampler import GREEDY_BELOW_TEMPERATURE, SamplingArrays, SamplingTensors, sample
from gpu.sampler_kernel import compile_sampler, sample_on_gpu
from gpu.staging import Staging
from gpu.step_io import PendingStep, SequenceInput
from gpu.step_shape import EAGER, EAGER_TOKEN_BUCKET, StepShape, capture_graphs, padded, shape_of
from gpu.token_mask import TokenMasks
from gpu.weights import load_model, random_model


class _Step(NamedTuple):
    """A step between `launch`'s three calls: prepared on the device, to run and draw from."""

    batch: ForwardBatch  # on the device, padded, attention planned
    num_seqs: int  # S, the sequences launched (padding excluded)
    rows: np.ndarray  # [R] the sequences that draw a token, in order
    sampling: SamplingArrays[torch.Tensor] | None  # the rows' settings; None: every row draws greedily
    settings: SamplingArrays[np.ndarray] | None  # their host copy
    shape: StepShape  # the CUDA graph it replays, if any (gpu/step_shape.py)
    graph_kind: str | None  # the kind of decode graph the attention backend planned for
    logprobs: LogprobRequests | None  # the logprobs asked; None: none
    logprob_arrays: LogprobArrays[torch.Tensor] | None  # their arrays on the device
    rules: StepRules | None  # the rows' penalties, bias and masks; None: no row has any
    pooling: tuple[PoolingRequests, PoolingArrays[torch.Tensor]] | None  # embeddings' asks; None: none


class _Forwarded(NamedTuple):
    logits: torch.Tensor  # [R, vocab] float32, of the rows that draw
    last: LastLayer | None  # every token's last layer, where scored prompt positions' logits come from


_token_ids, _starts, _tables, _samples, _previous_rows = (
    attrgetter(n) for n in ("token_ids", "start_position", "block_table", "sample", "previous_row")
)


class ModelRunner:
    """`attention_backend`: auto (on CUDA FlashInfer where it is installed and fits, else the
    project's Triton kernels; torch on CPU), torch, flashinfer or triton.
    `cuda_graphs`: capture decode steps at `cuda_graph_batch_sizes` and steps with prompt tokens
    at `cuda_graph_token_counts` (empty: those run eagerly); None means wherever the backend allows
    (CUDA with FlashInfer or Triton).
    `deterministic`: compute with the batch-invariant operators (gpu/invariant/), so a token's
    logits are the same bits whatever shares its steps; the attention backend must be auto."""

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        block_size: int = 16,
        attention_backend: str = "auto",
        cuda_graphs: bool | None = None,
        cuda_graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        cuda_graph_token_counts: tuple[int, ...] = DEFAULT_TOKEN_COUNTS,
        deterministic: bool = False,
    ) -> None:
        config = ModelConfig.from_pretrained(model_dir)
        device_ = torch.device(device)
        dtype_ = resolve_dtype(dtype, device_)
        model = load_model(model_dir, config, device_, dtype_)
        options = (num_kv_blocks, kv_cache_bytes, block_size, attention_backend, cuda_graphs)
        graph_sizes = (cuda_graph_batch_sizes, cuda_graph_token_counts)
        self._setup(config, model, device_, dtype_, *options, *graph_sizes, deterministic)

    @classmethod
    def with_random_weights(
        cls, config: ModelConfig, device: str = "cuda", dtype: str | torch.dtype = "auto", seed: int = 0, **options
    ) -> "ModelRunner":
        """A runner over a model of `config`'s shape with random weights made on the device
        (benchmarks); `options` are the constructor's, from `num_kv_blocks` on."""
        runner = cls.__new__(cls)
        device_ = torch.device(device)
        dtype_ = resolve_dtype(dtype, device_)
        runner._setup(config, random_model(config, device_, dtype_, seed), device_, dtype_, **options)
        return runner

    def _setup(
        self,
        config: ModelConfig,
        model: CausalLM,
        device: torch.device,
        dtype: torch.dtype,
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        block_size: int = 16,
        attention_backend: str = "auto",
        cuda_graphs: bool | None = None,
        cuda_graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        cuda_graph_token_counts: tuple[int, ...] = DEFAULT_TOKEN_COUNTS,
        deterministic: bool = False,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.config, self.model, self.device, self.dtype = config, model, device, dtype
        self.deterministic = deterministic
        self.block_size = block_size
        self.vocab_size = config.vocab_size
        self.eos_token_ids = list(config.eos_token_ids)
        # Past the sliding window our full attention would differ from the model's, so stop there.
        self.max_model_len = min(config.max_position_embeddings, config.sliding_window or 1 << 62)
        max_graph_batch = max(cuda_graph_batch_sizes) if cuda_graph_batch_sizes and cuda_graphs is not False else 0
        attention = BackendInputs.for_model(config, dtype, device, block_size, self.max_model_len, max_graph_batch)
        self.model.attention_backend = make_backend(attention_backend, attention, deterministic)
        if deterministic and invariant.runs_here(device):
            self.model.use_operators(invariant.INVARIANT_OPERATORS)
        self.attention_backend_name = type(self.model.attention_backend).__name__
        self.kv = KVCache.for_model(config, block_size, dtype, device, num_kv_blocks, kv_cache_bytes)
        self.num_kv_blocks = self.kv.num_blocks
        self.limits = BatchLimits(self.max_model_len, self.num_kv_blocks, self.vocab_size)
        self.staging = Staging(device) if device.type == "cuda" else None
        # Looked up once: torch.cuda.current_stream() costs tens of microseconds of host time.
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.eager_token_bucket = EAGER_TOKEN_BUCKET if device.type == "cuda" else 1
        # The same draws either way (but where rounding moves a token across a top-p or min-p
        # boundary); the torch sampler's [S, V] passes and sorts are what the kernel avoids.
        self._sample = sample_on_gpu if device.type == "cuda" else sample
        if device.type == "cuda":
            compile_sampler(config.vocab_size, device)
        self._previous = PreviousDraw()  # where `previous_row` inputs come from
        self._rules = LogitRules(config.vocab_size, device)  # `SequenceInput.rules`, and penalty counts
        self._token_masks = TokenMasks(config.vocab_size, device)  # constrained draws' masks (structured output)
        # The weights' host copy: what a failed update rolls back to and where the weights sleep.
        self.host_weights = HostWeights(model)
        self.memory = MemoryOccupation(self)  # sleep and wake: its device memory by tag
        if cuda_graphs is None:
            cuda_graphs = device.type == "cuda" and self.model.attention_backend.supports_cuda_graphs
        if cuda_graphs and self.staging is None:
            raise ValueError("CUDA graphs need a CUDA device")
        self.graph_sizes = (cuda_graph_batch_sizes, cuda_graph_token_counts) if cuda_graphs else None
        self._capture_stream = torch.cuda.Stream(device) if cuda_graphs else None  # every capture's
        self.graphs: DecodeGraphs | None = None
        self.prompt_graphs: PromptGraphs | None = None
        self.capture_graphs()

    def capture_graphs(self, warm_up: bool = True) -> None:
        """Captures the CUDA graphs asked at start (none if none were) over the weights and KV pool
        where they are now: at start, and on waking (no `warm_up`: it ran at start) if they moved."""
        if self.graph_sizes is not None:
            self.kv.arrivals.settle()  # a capture cannot wait for an event recorded outside it
            self.graphs, self.prompt_graphs = capture_graphs(
                self.model, self.kv, self.staging, self._capture_stream, *self.graph_sizes, warm_up
            )

    @property
    def launches_asynchronously(self) -> bool:
        """Whether `launch` returns once the step is enqueued (CUDA), not once it is computed (CPU)."""
        return self.device.type == "cuda"

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """(source, target) block pairs, copied in the KV pool before the next step reads them; none
        touch nothing, and may be asked for while the pool is released."""
        if copies:
            self.memory.check_resident()
            sources, targets = zip(*copies)
            self.kv.copy_blocks(list(sources), list(targets))

    def step(self, seqs: list[SequenceInput]) -> list[int | None]:
        """`launch` and wait for its tokens: one drawn token per sequence with `sample=True`, None
        for the others."""
        return self.launch(seqs).tokens()

    @torch.inference_mode()
    def launch(self, seqs: list[SequenceInput], masks: Callable[[torch.Tensor], None] | None = None) -> PendingStep:
        """Enqueues a step that feeds every sequence's new tokens and draws a token for each with
        `sample=True`, and returns without waiting for the device. Steps run in launch order, and a
        `previous_row` input reads the launch just before this one (an empty launch does not count).
        `masks` (structured output) is called once the forward pass is enqueued, with the host
        bitmask of the drawing rows [R, ceil(V/32)] int32, every bit set: it clears the tokens each
        row may not draw (gpu/token_mask.py), on the host while the device runs the forward pass.
        Raises ValueError, before touching the KV cache, on input that would write outside a
        sequence's blocks or the pool, or read a token the previous launch did not draw."""
        if not seqs:
            return PendingStep(0, np.zeros(0, np.int64), torch.zeros(0, dtype=torch.int64), None)
        step = self._prepare(seqs)
        forwarded = self._forward(step)
        if masks is not None:
            # In place: the raw logprobs, too, are of the tokens the grammar allows (as vLLM's are).
            self._token_masks.apply(forwarded.logits, masks)
        return self._draw(step, forwarded)

    @torch.inference_mode()
    def eager_forward(self, seqs: list[SequenceInput]) -> Callable[[], torch.Tensor]:
        """For profiling the forward pass alone: prepares a step of `seqs` as `launch` does, but for
        no CUDA graph and with no draw (their sampling rules and logprob asks are left aside), and
        returns a function that runs its forward pass eagerly, each call writing the same KV slots,
        and returns the logits of the rows with `sample=True` [R, vocab] float32. The function is
        valid until the next launch or eager_forward (they reuse the step's device buffer)."""
        step = self._prepare(seqs, drawn=False)
        return torch.inference_mode()(lambda: self._forward(step).logits)

    def _prepare(self, seqs: list[SequenceInput], drawn: bool = True) -> _Step:
        """The step on the device, ready to run: its metadata, sampling settings and logprob asks
        laid out on the host and copied over at once, the tokens of the previous launch fed in,
        attention planned. Not `drawn` (`eager_forward`): no graph, no rules, no logprobs. Raises
        ValueError before it enqueues anything."""
        self.memory.check_resident()
        n = len(seqs)
        rows = np.flatnonzero(np.fromiter(map(_samples, seqs), bool, n))  # [R]
        previous_rows = np.fromiter(map(_previous_rows, seqs), np.int64, n)  # [S]
        deferred = np.flatnonzero(previous_rows >= 0)  # [D]
        host = HostBatch.build(
            list(map(_token_ids, seqs)),
            list(map(_starts, seqs)),
            list(map(_tables, seqs)),
            self.block_size,
            logits_rows=rows,
            limits=self.limits,
            deferred=deferred,
        )
        host_feed = self._previous.feed_for(deferred, previous_rows, host.query_start)
        chosen = [seqs[i] for i in rows]
        greedy = all(s.temperature < GREEDY_BELOW_TEMPERATURE for s in chosen)
        settings = None if greedy else SamplingArrays.of(chosen, self.vocab_size)
        logprobs = LogprobRequests.of(seqs, rows, host.query_start, self.vocab_size) if drawn else None
        # An input that pools draws nothing: a step where every input draws (decodes) skips the look.
        pooling = PoolingRequests.of(seqs, host.query_start) if drawn and len(rows) < n else None
        # Scored prompt positions and pooled tokens read the last layer, which decode graphs do not keep.
        every_token = (logprobs is not None and logprobs.scored is not None) or pooling is not None
        shape = shape_of(host, self.graphs, self.prompt_graphs, every_token) if drawn else EAGER
        host = padded(host, shape, self.eager_token_bucket, self.kv.scratch_block)
        extras = (host_feed, settings, logprobs and logprobs.arrays, pooling and pooling.arrays)
        batch, (feed, sampling, logprob_arrays, pooling_arrays) = ForwardBatch.from_host(host, self.staging, extras)
        if feed is not None:
            self._previous.feed(batch.input_ids, feed)
        graph_kind = None
        if shape.decode_graph is not None:
            graph_kind = self.graphs.prepare(batch)  # copies the input ids: after the feed
        else:
            self.model.attention_backend.prepare(batch)
        self._release_staging()
        return _Step(
            batch=batch,
            num_seqs=n,
            rows=rows,
            sampling=sampling,
            settings=settings,
            shape=shape,
            graph_kind=graph_kind,
            logprobs=logprobs,
            logprob_arrays=logprob_arrays,
            rules=self._rules.prepare(chosen) if drawn else None,
            pooling=None if pooling is None else (pooling, pooling_arrays),
        )

    def _forward(self, step: _Step) -> _Forwarded:
        """The logits of the rows that draw, and every token's last layer (but after a decode graph).
        Blocks loaded from the host tier land during the pass, layer by layer, and whole after it."""
        if step.shape.decode_graph is not None:
            self.kv.arrivals.settle()  # a graph cannot wait between its layers
            logits = self.graphs.replay(step.shape.decode_graph, step.graph_kind)  # [decode_graph, vocab]
            rows = logits[: len(step.rows)] if len(step.rows) == step.num_seqs else logits[step.batch.logits_index]
            return _Forwarded(logits=rows, last=None)
        prompt_graph = step.shape.prompt_tokens is not None
        last = self.prompt_graphs.run(step.batch) if prompt_graph else self.model.run_layers(step.batch, self.kv)
        self.kv.arrivals.settle()
        return _Forwarded(logits=self.model.logits(last, step.batch.logits_index), last=last)

    def _draw(self, step: _Step, forwarded: _Forwarded) -> PendingStep:
        """Draws one token per row of the logits after the rows' rules (argmax when every row is
        greedy), keeps them on the device for the next launch, computes the logprobs and the
        embeddings' pooled sums asked, and starts their copy to the host."""
        logits = forwarded.logits  # [R, vocab] float32
        adjusted = self._rules.apply(step.rules, logits)  # [R, vocab]; `logits` itself when no row has rules
        if step.sampling is None:
            drawn = adjusted.argmax(dim=-1)  # [R] int64
        else:
            drawn = self._sample(adjusted, SamplingTensors.from_arrays(step.sampling, step.settings))  # [R] int64
        self._rules.count(step.rules, drawn)  # before the next launch reads the counts, in stream order
        self._previous.remember(drawn, step.rows, step.num_seqs)
        logprobs = None if step.logprobs is None else (step.logprobs, self._logprobs(step, forwarded, adjusted, drawn))
        return PendingStep.copying(
            step.num_seqs, step.rows, drawn, self._stream, logprobs, self._pooled(step, forwarded)
        )

    def _logprobs(
        self, step: _Step, forwarded: _Forwarded, adjusted: torch.Tensor, drawn: torch.Tensor
    ) -> torch.Tensor:
        """The packed logprobs asked: of the model's logits, or for a processed row of `adjusted`
        [R, vocab], the logits the draw used (after the token rules), then its temperature and filters."""
        scored = partial(self.model.logits, forwarded.last)  # index [n] -> [n, vocab] float32
        return step.logprobs.compute(step.logprob_arrays, forwarded.logits, adjusted, drawn, scored)

    def _pooled(self, step: _Step, forwarded: _Forwarded) -> tuple[PoolingRequests, torch.Tensor] | None:
        """The embeddings' pooled sums [P, hidden] float32 (gpu/pooling.py), if any input asks."""
        if step.pooling is None:
            return None
        requests, arrays = step.pooling
        return requests, requests.compute(arrays, partial(self.model.final_hidden, forwarded.last))

    def _release_staging(self) -> None:
        # Everything that reads the staging buffer's pinned memory (our copy, the attention planner's)
        # is enqueued: the next launch may refill it once these have run, not after the whole step.
        if self.staging is not None:
            self.staging.release()
