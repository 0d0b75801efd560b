"""The shape a step runs at, chosen so the device sees few: the CUDA graphs captured at start, the
shape each step takes among them, and the padding that grows its batch to it.

A decode batch replays the decode graph of the next captured batch size; a step with prompt tokens
replays the prompt graphs' pieces at the next captured token count or, run eagerly, grows to a
multiple of the runner's eager token bucket. The rows added write and read only the KV pool's
scratch block (`HostBatch.padded`, `HostBatch.with_filler`).
"""

from typing import NamedTuple

import torch

from gpu.batch import HostBatch
from gpu.cuda_graphs import DecodeGraphs
from gpu.kv_cache import KVCache
from gpu.model import CausalLM
from gpu.prompt_graphs import PromptGraphs
from gpu.staging import Staging

# cuBLAS picks a kernel for each new product shape, which costs a call over ten times the host time
# of a call on a shape it has seen. A step run eagerly (prompt chunks, with or without decodes) is
# grown to a multiple of this many tokens so its shapes repeat.
EAGER_TOKEN_BUCKET = 64


class StepShape(NamedTuple):
    decode_graph: int | None  # the batch size of the decode CUDA graph it replays; None: none
    prompt_tokens: int | None  # the token count of the prompt graphs it replays; None: none


EAGER = StepShape(decode_graph=None, prompt_tokens=None)  # no graph: a decode as it is, prompts bucketed


def capture_graphs(
    model: CausalLM,
    kv: KVCache,
    staging: Staging,
    side: torch.cuda.Stream,
    batch_sizes: tuple[int, ...],
    token_counts: tuple[int, ...],
    warm_up: bool = True,
) -> tuple[DecodeGraphs, PromptGraphs | None]:
    """The decode graphs at `batch_sizes` and, where `token_counts` is not empty, the prompt graphs
    at those counts, captured now over `kv` on the stream `side` (the same at every capture), each
    step run once first if `warm_up`."""
    graphs = DecodeGraphs(model, kv, staging, tuple(batch_sizes))
    graphs.capture(side, warm_up)
    if not token_counts:
        return graphs, None
    prompt_graphs = PromptGraphs(model, kv, staging, tuple(token_counts))
    prompt_graphs.capture(side, warm_up)
    return graphs, prompt_graphs


def shape_of(
    host: HostBatch, graphs: DecodeGraphs | None, prompt_graphs: PromptGraphs | None, every_token: bool
) -> StepShape:
    """The shape `host` runs at among the graphs captured. `every_token`: the step needs every token's
    last layer (scored prompt positions, pooled tokens), which the decode graphs do not keep."""
    if host.is_decode:
        fits = graphs is not None and not every_token
        return StepShape(decode_graph=graphs.padded_size(host.num_seqs) if fits else None, prompt_tokens=None)
    return StepShape(decode_graph=None, prompt_tokens=prompt_graphs and prompt_graphs.padded_tokens(host.num_tokens))


def padded(host: HostBatch, shape: StepShape, eager_token_bucket: int, scratch_block: int) -> HostBatch:
    """`host` grown to `shape`: the decode graph's batch size, the prompt graphs' token count, or for
    another step with prompt tokens a multiple of `eager_token_bucket` tokens. Other decode batches
    stay as they are: they take few sizes, one per batch size."""
    if shape.decode_graph is not None:
        return host.padded(shape.decode_graph, scratch_block)
    if host.is_decode:
        return host
    bucket = eager_token_bucket
    return host.with_filler(shape.prompt_tokens or -(-host.num_tokens // bucket) * bucket, scratch_block)
