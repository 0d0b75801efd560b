"""The batch-invariant operators of `--deterministic` (gpu/invariant/): a row's result is the same
bits alone and inside batches of any size; attention's the same for a prompt whole, chunked, on a
cached prefix and decoded token by token, with its splits folded in one program or spread over
several. The norm, log-softmax and sampler kernels the default mode runs are checked to be
batch-invariant already.

They run on a CUDA GPU, or on the CPU under Triton's interpreter (small shapes; its tile products
made as blind to a row's place as a GPU's, tests/gpu/tensor_cores.py):
    TRITON_INTERPRET=1 python -m pytest tests/gpu/test_invariant_kernels.py
"""

import pytest
import torch

from gpu.attention import BackendInputs, TorchAttention
from gpu.forward_batch import ForwardBatch
from gpu.invariant.attention import InvariantAttention
from gpu.invariant.attention_kernels import KV_SPLIT
from gpu.invariant.matmul import matmul
from gpu.kv_cache import KVCache
from gpu.staging import Staging
from tests.devices import DEVICE, INTERPRETED, needs_triton
from tests.gpu.tensor_cores import row_blind_dot  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, needs_triton, pytest.mark.usefixtures("row_blind_dot")]
# The interpreter multiplies bfloat16 matrices as raw integers: float16 stands in for it there.
DTYPES = (torch.float32, torch.float16) if INTERPRETED else (torch.float32, torch.bfloat16)


def rows_of(gen: torch.Generator, count: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(count, cols, generator=gen).to(dtype).to(DEVICE)


# Weights off the tiles: columns past a tile's end, K past a reduction step's; and a bias.
@pytest.mark.parametrize("n_cols, k_cols, with_bias", [(100, 70, True), (40, 200, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_matmul_row_is_the_same_bits_alone_and_in_any_batch(dtype, n_cols, k_cols, with_bias):
    gen = torch.Generator().manual_seed(n_cols)
    weight = rows_of(gen, n_cols, k_cols, dtype)
    bias = rows_of(gen, 1, n_cols, dtype)[0] if with_bias else None
    x = rows_of(gen, 300, k_cols, dtype)  # three tiles of rows, the last one partial
    whole = matmul(x, weight, bias)
    exact = x.double() @ weight.double().T + (bias.double() if with_bias else 0)
    assert ((whole.double() - exact).norm() / exact.norm()).item() < (1e-6 if dtype == torch.float32 else 1e-2)
    for count in (1, 2, 17, 129):
        picked = torch.randperm(300, generator=gen)[:count].to(DEVICE)  # each row lands at another place
        assert torch.equal(matmul(x[picked], weight, bias), whole[picked]), count


def test_matmul_refuses_mismatched_shapes():
    weight = torch.zeros(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"x \[T, K\] and a contiguous weight \[N, K\]"):
        matmul(torch.zeros(3, 12, device=DEVICE), weight)


HEADS = (4, 2, 32) if INTERPRETED else (32, 8, 128)  # (heads, kv_heads, head_dim)
BLOCK_SIZE = 16
PROMPT = 2 * KV_SPLIT + 88  # three splits
CHUNKS = (100, 37, 200, PROMPT - 337)


class PagedPrompt:
    """One prompt's keys in a paged cache of random K/V beside a neighbour's, and every position's
    query: the attention of any of its tokens can be asked in any kind of step."""

    def __init__(self, dtype: torch.dtype, seed: int = 0) -> None:
        heads, kv_heads, head_dim = HEADS
        gen = torch.Generator().manual_seed(seed)
        pages = -(-PROMPT // BLOCK_SIZE)
        self.kv = KVCache(1, 2 * pages + 4, BLOCK_SIZE, kv_heads, head_dim, dtype, DEVICE)
        self.kv.layers[0].copy_(torch.randn(self.kv.layers[0].shape, generator=gen))
        order = torch.randperm(2 * pages + 4, generator=gen).tolist()
        self.table, self.other_table = order[:pages], order[pages : 2 * pages]
        self.q = torch.randn(PROMPT, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        self.other_q = torch.randn(PROMPT, heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        self.dtype = dtype

    def attend(self, backend, ours: tuple[int, int], others: list[tuple[int, int]] = (), first: bool = False):
        """Our tokens start..<end (over our keys up to end) in a step beside the neighbour's runs
        (start, end) over its keys; ours first or last. -> our tokens' output [end - start, heads, head_dim]"""
        runs = [(*run, self.other_table, self.other_q) for run in others]
        mine = (*ours, self.table, self.q)
        runs = [mine, *runs] if first else [*runs, mine]
        batch = ForwardBatch.build(
            [[0] * (end - start) for start, end, _, _ in runs],
            [start for start, *_ in runs],
            [table for *_, table, _ in runs],
            BLOCK_SIZE,
            DEVICE,
        )
        backend.prepare(batch)
        out = backend.attend(0, torch.cat([q[start:end] for start, end, _, q in runs]), self.kv)
        offset = 0 if first else sum(end - start for start, end, _, _ in runs[:-1])
        return out[offset : offset + ours[1] - ours[0]]


def invariant(dtype, split_programs=None, **kwargs) -> InvariantAttention:
    heads, kv_heads, head_dim = HEADS
    return InvariantAttention(
        BackendInputs(heads, kv_heads, head_dim, dtype, torch.device(DEVICE), **kwargs), split_programs
    )


# The interpreter's float16 arithmetic is slow and adds nothing to float32's: the GPU checks bf16.
@pytest.mark.parametrize("dtype", DTYPES[:1] if INTERPRETED else DTYPES, ids=str)
def test_attention_is_the_same_bits_whole_chunked_cached_and_decoded(dtype):
    prompt = PagedPrompt(dtype)
    whole = prompt.attend(invariant(dtype), (0, PROMPT), first=True)
    reference = prompt.attend(TorchAttention(HEADS[2] ** -0.5), (0, PROMPT), first=True)
    assert ((whole.double() - reference.double()).norm() / reference.double().norm()).item() < (
        1e-5 if dtype == torch.float32 else 1e-2
    )
    # Chunked beside a neighbour's chunks and decodes, ours first or last.
    start, parts = 0, []
    for i, size in enumerate(CHUNKS):
        others = [(40 * i, 40 * i + 9), (300 + i, 301 + i)]
        parts.append(prompt.attend(invariant(dtype), (start, start + size), others, first=i % 2 == 0))
        start += size
    assert torch.equal(torch.cat(parts), whole)
    # A prefix-cache hit: only the last tokens computed, over the cached keys.
    assert torch.equal(prompt.attend(invariant(dtype), (PROMPT - 50, PROMPT), [(0, 3)]), whole[PROMPT - 50 :])
    # Decodes at and around the splits' boundaries: alone, beside others, folded in one program
    # or spread over three, and in an extend step beside a prompt.
    for position in (0, KV_SPLIT - 1, KV_SPLIT, KV_SPLIT + 1, PROMPT - 1):
        token = (position, position + 1)
        for split_programs in (0, 3):
            backend = invariant(dtype, split_programs)
            assert torch.equal(prompt.attend(backend, token), whole[position : position + 1])
            assert torch.equal(prompt.attend(backend, token, [(7, 8), (500, 501)]), whole[position : position + 1])
        beside_a_prompt = prompt.attend(invariant(dtype), token, [(0, 20)], first=True)
        assert torch.equal(beside_a_prompt, whole[position : position + 1])


def test_graph_decode_reads_its_fixed_buffers_and_gives_the_eager_bits():
    """prepare_graph plans a padded decode batch into buffers of fixed address, with room for the
    longest context a sequence may have; its rows are the bits of the eager decode."""
    dtype = torch.float32
    prompt = PagedPrompt(dtype, seed=1)
    pages = -(-PROMPT // BLOCK_SIZE)
    for split_programs in (0, 2):
        backend = invariant(dtype, split_programs, max_graph_batch=4, max_pages_per_seq=pages, block_size=BLOCK_SIZE)
        eager = prompt.attend(invariant(dtype, split_programs), (PROMPT - 1, PROMPT), [(44, 45)])
        batch = ForwardBatch.build(
            [[0], [0]], [44, PROMPT - 1], [prompt.other_table, prompt.table], BLOCK_SIZE, DEVICE
        ).host.padded(4, prompt.kv.scratch_block)
        staging = Staging(torch.device(DEVICE)) if DEVICE == "cuda" else None
        padded, _ = ForwardBatch.from_host(batch, staging)
        backend.prepare_graph(padded)
        q = torch.cat([prompt.other_q[44:45], prompt.q[PROMPT - 1 :], torch.zeros_like(prompt.q[:2])])
        assert torch.equal(backend.attend(0, q, prompt.kv)[1:2], eager)


@pytest.mark.parametrize("with_residual", [False, True])
def test_the_fused_norm_is_batch_invariant(with_residual):
    """gpu/kernels.py's add_rms_norm takes a row per program and reduces it whole in one block, so
    a row's bits do not depend on the batch: the deterministic mode keeps it as it is."""
    from gpu.kernels import add_rms_norm

    gen = torch.Generator().manual_seed(3)
    x, residual = rows_of(gen, 40, 200, torch.float16), rows_of(gen, 40, 200, torch.float16)
    weight = rows_of(gen, 1, 200, torch.float16)[0]
    whole, whole_residual = add_rms_norm(x, residual.clone() if with_residual else None, weight, 1e-5)
    for row in (0, 13, 39):
        alone, alone_residual = add_rms_norm(
            x[row : row + 1].clone(), residual[row : row + 1].clone() if with_residual else None, weight, 1e-5
        )
        assert torch.equal(alone, whole[row : row + 1]) and torch.equal(alone_residual, whole_residual[row : row + 1])


def test_logprobs_are_batch_invariant():
    """gpu/logprob_kernel.py reduces each row in blocks of a fixed size, folded in order: a row's
    logprobs (drawn token, top ones, asked ids) are the same bits alone and in a batch."""
    from gpu.logprob_kernel import token_logprobs_on_gpu
    from gpu.logprobs import token_logprobs

    gen = torch.Generator().manual_seed(4)
    logits = (3 * torch.randn(20, 5000, generator=gen)).to(DEVICE)
    tokens = torch.randint(0, 5000, (20,), generator=gen).to(DEVICE)
    ids = torch.randint(0, 5000, (20, 2), generator=gen).to(DEVICE)
    whole = token_logprobs_on_gpu(logits, tokens, 3, ids)
    assert torch.allclose(whole, token_logprobs(logits.cpu(), tokens.cpu(), 3, ids.cpu()).to(DEVICE), atol=1e-5)
    for row in (0, 7, 19):
        alone = token_logprobs_on_gpu(logits[row : row + 1].clone(), tokens[row : row + 1], 3, ids[row : row + 1])
        assert torch.equal(alone, whole[row : row + 1])


def test_a_sampled_row_draws_the_same_alone_split_and_in_a_batch():
    """gpu/sampler_kernel.py splits a row over programs in batches of up to SPLIT_ROWS rows and walks
    it in one program beyond, folding its blocks in the same order: a seeded row draws the same
    token either way, top-p's boundary included."""
    from gpu.sampler import SamplingTensors
    from gpu.sampler_kernel import SPLIT_ROWS, sample_on_gpu

    rows = SPLIT_ROWS + 4
    gen = torch.Generator().manual_seed(5)
    logits = (2 * torch.randn(rows, 3000, generator=gen)).to(DEVICE)
    params = dict(temperature=[0.8] * rows, top_p=[0.9] * rows, top_k=[0] * rows, min_p=[0.0] * rows)
    params["seed"], params["position"] = list(range(rows)), [17] * rows

    def draw(picked: list[int]) -> list[int]:
        chosen = {k: [v[i] for i in picked] for k, v in params.items()}
        tensors = SamplingTensors.from_lists(
            chosen["temperature"], chosen["top_p"], chosen["top_k"], chosen["min_p"], chosen["seed"],
            chosen["position"], DEVICE,
        )  # fmt: skip
        return sample_on_gpu(logits[picked].contiguous(), tensors).tolist()

    whole = draw(list(range(rows)))  # one program per row
    assert [draw([i])[0] for i in (0, 5, rows - 1)] == [whole[0], whole[5], whole[-1]]  # split over blocks
