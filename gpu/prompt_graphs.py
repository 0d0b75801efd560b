"""CUDA graphs of steps with prompt tokens, captured in pieces around attention, for each of a fixed
set of token counts (a step is padded up to the next count with filler tokens).

A prompt step of an 8B model launches about ten kernels a layer; launched one by one from Python
they can cost more host time than the GPU needs to run them (some ten milliseconds each for 1K
tokens), so the first token waits on the host. Everything but attention depends only on the
number of tokens, so it is captured: piece 0 embeds the tokens and computes layer 0's queries,
piece i finishes layer i-1 (output projection, norm, MLP) and computes layer i's queries, the last
piece finishes the last layer. Attention, whose kernels depend on how the tokens split into
sequences, runs eagerly between the replays, reading the queries from a fixed buffer and writing
its output into another. The logits of the few tokens that sample (and of scored prompt positions)
are computed eagerly after, from the last layer's buffers.

All pieces of all counts share one memory pool: each piece's temporaries die within it, and
replays never overlap, so a piece can reuse what the previous one used.
"""

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpu.batch import HostBatch, token_thirds
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache
from gpu.model import CausalLM, LastLayer
from gpu.staging import Staging

# Every count captures one graph per layer, so the counts are few: steps of 64 tokens up to 512,
# then 128, then 256 up to 2048. Padding costs at most 64 tokens below 512 and at most a quarter
# of the step above (513 tokens run as 640, 1025 as 1280).
DEFAULT_TOKEN_COUNTS = (*range(64, 512, 64), *range(512, 1024, 128), *range(1024, 2049, 256))


@dataclass(frozen=True)
class _Buffers:
    """Where the pieces meet the eager parts of the step: fixed addresses a graph can hold."""

    inputs: torch.Tensor  # [3T] int32: input ids | positions | KV slots
    queries: torch.Tensor  # [T, heads, head_dim]: the layer's rotated queries, attention's input
    attended: torch.Tensor  # [T, heads, head_dim]: attention's output
    residual: torch.Tensor  # [T, hidden]
    hidden: torch.Tensor  # [T, hidden]: the last layer's output

    @classmethod
    def allocate(cls, model: CausalLM, max_tokens: int, device: torch.device) -> "_Buffers":
        config, dtype = model.config, model.lm_head.weight.dtype
        heads = (max_tokens, config.num_attention_heads, config.head_dim)
        return cls(
            inputs=torch.zeros(3 * max_tokens, dtype=torch.int32, device=device),
            queries=torch.zeros(heads, dtype=dtype, device=device),
            attended=torch.zeros(heads, dtype=dtype, device=device),
            residual=torch.zeros(max_tokens, config.hidden_size, dtype=dtype, device=device),
            hidden=torch.zeros(max_tokens, config.hidden_size, dtype=dtype, device=device),
        )

    def rows(self, num_tokens: int) -> "_Buffers":
        """The buffers of a step of `num_tokens` tokens: views of the first rows."""
        return _Buffers(
            inputs=self.inputs[: 3 * num_tokens],
            queries=self.queries[:num_tokens],
            attended=self.attended[:num_tokens],
            residual=self.residual[:num_tokens],
            hidden=self.hidden[:num_tokens],
        )


class LayerPieces:
    """The forward pass cut at attention: `num_pieces` functions of a token count that read and write
    only the fixed buffers, run in order with attention between them."""

    def __init__(self, model: CausalLM, kv: KVCache, max_tokens: int) -> None:
        self.model, self.kv = model, kv
        self.num_pieces = model.config.num_hidden_layers + 1
        self._buffers = _Buffers.allocate(model, max_tokens, kv.layers[0].device)

    def forward(self, batch: ForwardBatch, run_piece: Callable[[int, int], None]) -> LastLayer:
        """The last layer of `batch` (planned by the attention backend), each piece run by
        `run_piece(piece, num_tokens)`: the piece itself or its graph's replay. Views of the fixed
        buffers: take the logits from them before the next step runs."""
        num_tokens = batch.host.num_tokens
        buffers = self._buffers.rows(num_tokens)
        buffers.inputs.copy_(batch.token_data)
        attend = self.model.attention_backend.attend
        for layer in range(self.num_pieces - 1):
            # Layer i of the loads from the host tier has landed before the piece writes the new
            # tokens' KV of layer i (into a block a load may have been writing) and attention reads it.
            self.kv.arrivals.wait_for(layer)
            run_piece(layer, num_tokens)
            attend(layer, buffers.queries, self.kv, out=buffers.attended)
        run_piece(self.num_pieces - 1, num_tokens)
        return LastLayer(output=buffers.hidden, residual=buffers.residual)

    def run_piece(self, piece: int, num_tokens: int) -> None:
        """Piece `piece` of a step of `num_tokens` tokens, whose inputs are in the buffers."""
        buffers = self._buffers.rows(num_tokens)
        tokens = token_thirds(buffers.inputs)
        layers = self.model.model.layers
        if piece == 0:
            x, residual = self.model.model.embed_tokens(tokens.input_ids), None
        else:
            x, residual = layers[piece - 1].finish(buffers.attended, buffers.residual)
        if piece < len(layers):
            rope = self.model.rope_inputs(tokens.positions, tokens.slot_mapping, x)
            queries, residual = layers[piece].query(x, residual, rope, self.kv)
            buffers.queries.copy_(queries)
        else:
            buffers.hidden.copy_(x)
        # The fused norm updated the buffer in place (torch skips a copy onto the same tensor); the
        # torch path made a new residual, and piece 0's is the embedding output, in the graph's pool.
        buffers.residual.copy_(residual)


class PromptGraphs:
    def __init__(self, model: CausalLM, kv: KVCache, staging: Staging, token_counts: tuple[int, ...]) -> None:
        if not token_counts or min(token_counts) < 1:
            raise ValueError(f"CUDA graph token counts must be positive, got {token_counts}")
        self.counts = sorted(set(token_counts))
        self.staging = staging
        self.pieces = LayerPieces(model, kv, self.counts[-1])
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}  # by token count, one per piece

    def padded_tokens(self, num_tokens: int) -> int | None:
        """The captured count a step of `num_tokens` tokens runs at; None above the largest."""
        i = bisect.bisect_left(self.counts, num_tokens)
        return self.counts[i] if i < len(self.counts) else None

    @torch.inference_mode()
    def capture(self, side: torch.cuda.Stream, warm_up: bool = True) -> None:
        """Captures on `side`, a stream other than the default (capture needs one): the same one at
        every capture, since each stream cuBLAS runs on gets a workspace that lives as long as the
        process. `warm_up`: run each count's step once first; a capture again over the same model
        and stream (waking) can do without."""
        model, kv = self.pieces.model, self.pieces.kv
        device = kv.layers[0].device
        pool = None
        for count in reversed(self.counts):
            # Every token on the scratch block: capturing writes no KV that a sequence owns.
            host = HostBatch.empty(kv.block_size).with_filler(count, kv.scratch_block)
            batch, _ = ForwardBatch.from_host(host, self.staging)
            model.attention_backend.prepare(batch)
            side.wait_stream(torch.cuda.current_stream(device))
            graphs = []
            with torch.cuda.stream(side):
                # Warmed up on the capture stream, so what a stream sets up on first use (cuBLAS's
                # workspace) is made here, not inside the first graph.
                if warm_up:
                    self.pieces.forward(batch, self.pieces.run_piece)
                for piece in range(self.pieces.num_pieces):
                    # capture_begin directly: torch.cuda.graph's garbage collection on entry would
                    # cost more than the capture, hundreds of times over.
                    graph = torch.cuda.CUDAGraph()
                    graph.capture_begin(pool=pool)
                    try:
                        self.pieces.run_piece(piece, count)
                    finally:  # a failed piece must not leave the stream capturing
                        graph.capture_end()
                    pool = graph.pool()
                    graphs.append(graph)
            torch.cuda.current_stream(device).wait_stream(side)
            self.staging.release()
            self._graphs[count] = graphs
        torch.cuda.synchronize(device)

    def run(self, batch: ForwardBatch) -> LastLayer:
        """The last layer of `batch`, planned by the attention backend and padded to a captured
        count: views of the graphs' buffers, valid until the next run."""
        return self.pieces.forward(batch, self._replay)

    def _replay(self, piece: int, num_tokens: int) -> None:
        self._graphs[num_tokens][piece].replay()
