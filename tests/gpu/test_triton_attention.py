"""The Triton attention backend computes what the torch reference computes, over random paged caches.

They run on a CUDA GPU (bigger shapes), or on the CPU under Triton's interpreter (small shapes, and
no bfloat16: the interpreter multiplies bfloat16 matrices as raw 16-bit integers):
    TRITON_INTERPRET=1 python -m pytest tests/gpu/test_triton_attention.py
"""

import pytest
import torch

from gpu.attention import BackendInputs, TorchAttention, make_backend
from gpu.batch import HostBatch
from gpu.config import ModelConfig
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache
from gpu.runner import ModelRunner
from gpu.staging import Staging
from gpu.step_io import SequenceInput
from tests.devices import DEVICE, INTERPRETED, needs_triton
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, generate, random_prompt, shuffled_tables

pytestmark = [
    pytest.mark.gpu,
    needs_triton,
]
DTYPES = (torch.float32, torch.float16) if INTERPRETED else (torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # per token, against float32
# (heads, kv_heads, head_dim): GQA groups of 2 and 3 (not a power of two), MQA, and plain multi-head.
SHAPES = (
    ((4, 2, 64), (6, 2, 128), (4, 1, 64), (2, 2, 128))
    if INTERPRETED
    else ((32, 8, 128), (28, 4, 128), (16, 1, 64), (16, 16, 64), (8, 2, 256))
)
# Lengths of one token, just under, on and just past a block boundary, and longer than a key tile.
DECODE_CONTEXTS = [1, 15, 16, 17, 40, 130] if INTERPRETED else [1, 15, 16, 17, 100, 1000, 4097, 300, 2, 64]
# (new tokens, context): decodes, a fresh prompt, chunks on top of a cached prefix, a prefix-cache hit.
EXTEND_SEQS = (
    [(1, 1), (5, 9), (16, 40), (1, 70), (37, 37), (10, 200)]
    if INTERPRETED
    else [(1, 1), (5, 9), (16, 40), (1, 70), (300, 300), (200, 1101), (1, 4000), (513, 2049), (64, 64), (7, 33)]
)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def worst_token_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative error of one token's output [heads, head_dim]: a single wrong token
    would hide in the error of a whole batch."""
    out, ref = out.double().flatten(1), ref.double().flatten(1)
    return ((out - ref).norm(dim=1) / ref.norm(dim=1)).max().item()


def paged_case(query_lens, context_lens, block_size, heads, kv_heads, head_dim, dtype, seed=0):
    """Random queries and a cache of random K/V (unused blocks too, so reading a wrong page shows),
    each sequence on blocks drawn at random from the pool -> (batch, kv, q [T, heads, head_dim])"""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(pages) + 3
    kv = KVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, DEVICE)
    kv.layers[0].copy_(torch.randn(kv.layers[0].shape, generator=gen))
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [pool[sum(pages[:i]) : sum(pages[: i + 1])] for i in range(len(pages))]
    starts = [c - q for q, c in zip(query_lens, context_lens)]
    batch = ForwardBatch.build([[0] * q for q in query_lens], starts, tables, block_size, DEVICE)
    q = torch.randn(sum(query_lens), heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    return batch, kv, q


def reference(batch: ForwardBatch, kv: KVCache, q: torch.Tensor) -> torch.Tensor:
    """The torch backend in float32 over the same cache: [T, heads, head_dim]"""
    _blocks, _, block_size, kv_heads, head_dim = kv.layers[0].shape
    exact = KVCache(1, kv.num_blocks, block_size, kv_heads, head_dim, torch.float32, DEVICE)
    exact.layers[0].copy_(kv.layers[0])
    backend = TorchAttention(head_dim**-0.5)
    backend.prepare(batch)
    return backend.attend(0, q.float(), exact)


def staging() -> Staging | None:
    return Staging(torch.device(DEVICE)) if DEVICE == "cuda" else None


def triton_backend(heads, kv_heads, head_dim, dtype, decode_splits=None, **kwargs):
    from gpu.attention.triton_backend import TritonAttention

    return TritonAttention(
        BackendInputs(heads, kv_heads, head_dim, dtype, torch.device(DEVICE), **kwargs), decode_splits
    )


def ours(backend, batch: ForwardBatch, kv: KVCache, q: torch.Tensor) -> torch.Tensor:
    backend.prepare(batch)
    out = backend.attend(0, q, kv)
    assert out.shape == q.shape and out.dtype == q.dtype
    return out


# Automatic splits follow the GPU's multiprocessor count: one on the CPU.
@pytest.mark.parametrize("splits", [1, 3] if INTERPRETED else [1, 3, None], ids=lambda s: f"splits-{s or 'auto'}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_matches_torch(dtype, shape, splits):
    heads, kv_heads, head_dim = shape
    batch, kv, q = paged_case([1] * len(DECODE_CONTEXTS), DECODE_CONTEXTS, 16, heads, kv_heads, head_dim, dtype)
    assert batch.host.is_decode
    out = ours(triton_backend(heads, kv_heads, head_dim, dtype, decode_splits=splits), batch, kv, q)
    assert worst_token_error(out, reference(batch, kv, q)) < TOLERANCE[dtype]


# Pages smaller than a key tile, not a power of two (CPU), or larger than a key tile (GPU).
@pytest.mark.parametrize("block_size", [16, 5] if INTERPRETED else [16, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extend_matches_torch(dtype, shape, block_size):
    """Prefill, chunked prefill and decodes in one step, causal over each sequence's cached prefix."""
    heads, kv_heads, head_dim = shape
    query_lens, contexts = zip(*EXTEND_SEQS)
    batch, kv, q = paged_case(query_lens, contexts, block_size, heads, kv_heads, head_dim, dtype, seed=block_size)
    assert not batch.host.is_decode
    out = ours(triton_backend(heads, kv_heads, head_dim, dtype), batch, kv, q)
    assert worst_token_error(out, reference(batch, kv, q)) < TOLERANCE[dtype]


def test_graph_plan_reads_its_fixed_buffers():
    """prepare_graph copies a padded decode batch's metadata into buffers whose addresses never
    change; attending through them gives the eager result for the real rows."""
    heads, kv_heads, head_dim = SHAPES[0]
    backend = triton_backend(
        heads, kv_heads, head_dim, torch.float32, max_graph_batch=8, max_pages_per_seq=10, decode_splits=2
    )
    addresses = None
    for seed, contexts in enumerate([[33, 1, 16], [2, 150, 17, 64, 5]]):
        batch, kv, q = paged_case([1] * len(contexts), contexts, 16, heads, kv_heads, head_dim, torch.float32, seed)
        host = batch.host.padded(8, kv.scratch_block)
        padded, _ = ForwardBatch.from_host(host, staging())
        backend.prepare_graph(padded)
        paged = backend._plan.paged
        if addresses is None:
            addresses = [t.data_ptr() for t in paged]
        assert [t.data_ptr() for t in paged] == addresses
        q_padded = torch.cat([q, torch.randn(8 - len(contexts), heads, head_dim, device=DEVICE)])
        out = backend.attend(0, q_padded, kv)[: len(contexts)]
        assert worst_token_error(out, reference(batch, kv, q)) < TOLERANCE[torch.float32]
    too_big = HostBatch.build([[0]] * 9, [0] * 9, [[0]] * 9, 16)
    with pytest.raises(ValueError, match="no CUDA-graph decode buffers for 9 sequences"):
        backend.prepare_graph(ForwardBatch.from_host(too_big, staging())[0])


def test_make_backend_names_and_auto_fallback(build_tiny_model):
    from gpu.attention.triton_backend import TritonAttention

    config = ModelConfig.from_pretrained(build_tiny_model("llama"))
    inputs = BackendInputs.for_model(
        config, torch.float32, torch.device(DEVICE), 16, max_model_len=64, max_graph_batch=4
    )
    build = lambda name: make_backend(name, inputs)  # noqa: E731
    assert isinstance(build("triton"), TritonAttention)
    assert isinstance(build("torch"), TorchAttention)
    # float32 is beyond FlashInfer, so `auto` takes Triton on CUDA; the CPU keeps the torch reference.
    assert isinstance(build("auto"), TritonAttention if DEVICE == "cuda" else TorchAttention)
    with pytest.raises(ValueError, match="unknown attention backend 'nope'.*triton"):
        build("nope")


def runner(model_dir, backend: str, **kwargs) -> ModelRunner:
    dtype = "float32" if INTERPRETED else "bfloat16"
    return ModelRunner(
        model_dir,
        device=DEVICE,
        dtype=dtype,
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        attention_backend=backend,
        **kwargs,
    )


def test_model_logits_match_the_torch_backend(build_tiny_model):
    """The whole model on both backends: a prefill, a decode step, then chunks beside decodes."""
    model_dir = build_tiny_model("llama")
    prompts = [random_prompt(n, seed=n) for n in (3, 16, 33)]
    tables = shuffled_tables([50, 50, 50], seed=2)
    steps = [(prompts, [0, 0, 0]), ([[7], [8], [9]], [3, 16, 33]), ([[10], [11, 12, 13], [14]], [4, 17, 34])]
    logits = {}
    for backend in ("torch", "triton"):
        ran = runner(model_dir, backend, cuda_graphs=False)
        with torch.inference_mode():
            logits[backend] = torch.cat(
                [
                    ran.model(ForwardBatch.build(ids, starts, tables, BLOCK_SIZE, DEVICE), ran.kv)
                    for ids, starts in steps
                ]
            )
    assert relative_error(logits["triton"], logits["torch"]) < (1e-5 if INTERPRETED else 1e-2)


@pytest.mark.skipif(not INTERPRETED, reason="the float32 CPU path is the one checked token for token")
def test_greedy_decoding_matches_transformers(build_tiny_model, hf_greedy):
    model_dir = build_tiny_model("qwen2")
    prompts = [random_prompt(n, seed=20 + n) for n in (9, 20)]
    outputs = generate(runner(model_dir, "triton"), prompts, 8, chunk_size=7, arrivals=[0, 1], seed=4)
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(model_dir, prompt, 8)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_decode_gives_the_eager_tokens(build_tiny_model):
    """Batches of 1..9 sequences (padded to 1, 2, 4, 8, or above the largest graph, eager), greedy
    and seeded sampling: the graph path draws exactly the eager path's tokens."""
    model_dir = build_tiny_model("llama")
    graphed, eager = (
        runner(model_dir, "triton", cuda_graphs=True, cuda_graph_batch_sizes=(1, 2, 4, 8)),
        runner(model_dir, "triton", cuda_graphs=False),
    )
    assert graphed.graphs is not None and eager.graphs is None
    prompts = [random_prompt(n, seed=n) for n in (3, 9, 12, 20, 5, 7, 30, 2, 14)]
    arrivals = [0, 2, 3, 3, 5, 6, 6, 6, 8]  # the batch grows one or more at a time
    assert generate(graphed, prompts, 10, arrivals=arrivals) == generate(eager, prompts, 10, arrivals=arrivals)
    seeded = dict(sample=True, temperature=0.8, top_p=0.95, seed=42)
    steps = [[SequenceInput([5, 6, 7], 0, [1], **seeded)], [SequenceInput([8], 3, [1], output_index=1, **seeded)]]
    assert [graphed.step(s) for s in steps] == [eager.step(s) for s in steps]
