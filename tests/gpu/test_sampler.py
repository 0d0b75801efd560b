"""The sampler draws from the right distribution, and each draw depends only on (seed, position).
Each draw test runs the torch path and the GPU's kernel (gpu/sampler_kernel.py; in Triton's
interpreter on a machine without CUDA), which must draw the same tokens."""

import dataclasses
import math
import random

import pytest
import torch

from gpu.sampler import (
    SamplingArrays,
    SamplingTensors,
    _as_int64,
    _mix64,
    filter_min_p,
    filter_top_k_top_p,
    sample,
    uniform_noise,
)
from gpu.sampler_heads import _head_kernel, heads
from gpu.sampler_kernel import _sample_kernel, compile_sampler, sample_on_gpu
from gpu.sampler_split import chunk_kernel, combine_kernel, split_passes
from gpu.staging import on_cpu
from gpu.step_io import SequenceInput
from tests.devices import DEVICE, INTERPRETED, needs_cuda


def params(rows: list[dict], device: str = "cpu") -> SamplingTensors:
    """SamplingTensors from per-row dicts; unspecified fields take neutral values."""

    def column(name, default):
        return [row.get(name, default) for row in rows]

    return SamplingTensors.from_lists(
        column("temperature", 1.0),
        column("top_p", 1.0),
        column("top_k", 0),
        column("min_p", 0.0),
        column("seed", 0),
        column("position", 0),
        device,
    )


def draw_on_the_kernel(logits: torch.Tensor, rows: list[dict]) -> torch.Tensor:
    return sample_on_gpu(logits.to(DEVICE), params(rows, DEVICE)).cpu()


def draw_on_the_torch_path(logits: torch.Tensor, rows: list[dict]) -> torch.Tensor:
    return sample(logits, params(rows))


@pytest.fixture(params=[draw_on_the_torch_path, draw_on_the_kernel], ids=["torch", "kernel"])
def draw(request):
    """draw(logits, rows): one token per row of `logits`, sampled as the row's dict says."""
    return request.param


# Thousands of rows take minutes in Triton's interpreter: there the equality test at the end covers
# the kernel, and the draw counts run on the torch path alone.
@pytest.fixture(
    params=[
        draw_on_the_torch_path,
        pytest.param(draw_on_the_kernel, marks=pytest.mark.skipif(INTERPRETED, reason="slow in Triton's interpreter")),
    ],
    ids=["torch", "kernel"],
)
def draw_many(request):
    return request.param


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_the_runner_uploads_each_setting_by_name_as_from_lists_would_build_it():
    vocab = 50
    chosen = [
        SequenceInput([1], 0, [0], True, temperature=1e-6, top_k=5, seed=(1 << 64) - 1, output_index=3),
        SequenceInput([2], 0, [1], True, temperature=0.7, top_p=0.9, top_k=vocab, min_p=0.1, seed=5),
    ]
    arrays = SamplingArrays.of(chosen, vocab)
    assert arrays.temperature[0] == 0  # below the greedy bound: drawn greedily
    assert arrays.top_k.tolist() == [5, 0]  # a top_k of the whole vocabulary is off
    assert arrays.seed.tolist() == [-1, 5] and arrays.position.tolist() == [3, 0]
    staged = SamplingTensors.from_arrays(on_cpu(arrays), arrays)
    built = SamplingTensors.from_lists([0.0, 0.7], [1.0, 0.9], [5, 0], [0.0, 0.1], [(1 << 64) - 1, 5], [3, 0], "cpu")
    for field in dataclasses.fields(SamplingTensors):
        mine, theirs = getattr(staged, field.name), getattr(built, field.name)
        assert torch.equal(mine, theirs) if isinstance(mine, torch.Tensor) else mine == theirs, field.name


def test_hash_is_splitmix64():
    # splitmix64 seeded with 0 first outputs 0xE220A8397B1DCDAF: our int64 arithmetic is uint64's.
    z = torch.tensor([_as_int64(0x9E3779B97F4A7C15)])
    assert _mix64(z).item() == _as_int64(0xE220A8397B1DCDAF)


def test_noise_is_strictly_inside_the_unit_interval():
    u = uniform_noise(torch.tensor([0, 1, -5, 2**62, 44774]), torch.tensor([0, 7, 3, 2**40, 0]), 5000)
    assert u.shape == (5, 5000)
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.01


@pytest.mark.parametrize(
    "row",
    [
        dict(temperature=0.0),
        dict(top_k=1),
        dict(top_p=1e-6),
        dict(temperature=2.0, min_p=1.0),
        dict(temperature=0.7, top_k=1, top_p=0.5, min_p=0.3),
    ],
    ids=["temperature-0", "top-k-1", "tiny-top-p", "min-p-1", "combined"],
)
def test_degenerate_settings_are_argmax(row, draw):
    logits = random_logits(16, 300)
    rows = [dict(row, seed=s, position=s * 3) for s in range(16)]
    assert torch.equal(draw(logits, rows), logits.argmax(-1))


def test_the_largest_noise_is_finite(draw):
    """Seed 44774 at position 0 hashes token 39 to the top of the noise's range, which once rounded
    to u = 1: infinite noise, so that token won every draw, banned or filtered out."""
    logits = torch.arange(64, 0, -1).float().expand(4, -1).clone()  # token 0 is the best
    logits[3, 39] = float("-inf")  # banned
    rows = [dict(top_k=1, seed=44774), dict(top_p=1e-6, seed=44774), dict(min_p=1.0, seed=44774), dict(seed=44774)]
    drawn = draw(logits, rows).tolist()
    assert drawn[:3] == [0, 0, 0] and drawn[3] != 39


def test_a_draw_depends_only_on_its_own_seed_and_position(draw):
    logits = random_logits(8, 500)
    rows = [
        dict(temperature=1.0, seed=1, position=0),
        dict(temperature=0.8, top_p=0.9, seed=2, position=5),
        dict(temperature=0.0),
        dict(temperature=1.3, top_k=20, seed=3, position=2),
        dict(temperature=1.0, top_k=50, top_p=0.95, seed=-4, position=9),
        dict(temperature=2.0, seed=2**63 + 5, position=1),  # seeds wrap to int64
        dict(temperature=1.5, min_p=0.1, seed=5, position=4),
        dict(temperature=0.9, top_p=0.9, min_p=0.05, seed=6, position=0),
    ]
    together = draw(logits, rows).tolist()
    alone = [draw(logits[i : i + 1], [row]).item() for i, row in enumerate(rows)]
    order = [4, 7, 2, 0, 6, 5, 1, 3]
    reordered = draw(logits[order], [rows[i] for i in order]).tolist()
    assert together == alone
    assert reordered == [together[i] for i in order]


def test_seeds_and_positions_change_the_draw(draw):
    flat = torch.zeros(40, 1000)
    by_seed = draw(flat, [dict(seed=s, position=0) for s in range(40)])
    by_position = draw(flat, [dict(seed=7, position=p) for p in range(40)])
    assert len(set(by_seed.tolist())) > 30
    assert len(set(by_position.tolist())) > 30
    again = draw(flat, [dict(seed=s, position=0) for s in range(40)])
    assert torch.equal(by_seed, again)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return ((counts - expected) ** 2 / expected).sum().item()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_softmax(temperature, draw_many):
    draws = 6000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0])
    tokens = draw_many(
        logits.expand(draws, -1), [dict(temperature=temperature, seed=42, position=p) for p in range(draws)]
    )
    counts = torch.bincount(tokens, minlength=6).float()
    # 5 degrees of freedom: 20.5 is the 0.999 quantile; the hash is deterministic, so this cannot flake.
    assert chi_square(counts, (logits / temperature).softmax(-1)) < 20.5


def test_top_k_and_top_p_draw_from_the_renormalised_head(draw_many):
    draws = 6000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -2.0])
    rows = [dict(top_k=4, top_p=0.8, seed=9, position=p) for p in range(draws)]
    counts = torch.bincount(draw_many(logits.expand(draws, -1), rows), minlength=6).float()
    probs = logits.softmax(-1)  # [0.44, 0.27, 0.16, ...]: the first three reach 0.8
    assert counts[3:].sum() == 0
    kept = probs[:3] / probs[:3].sum()
    assert chi_square(counts[:3], kept) < 13.8  # 2 degrees of freedom, 0.999 quantile


def test_top_p_keeps_the_smallest_set_reaching_it():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(4, -1)
    kept = filter_top_k_top_p(logits, torch.zeros(4, dtype=torch.int64), torch.tensor([0.4, 0.7, 0.81, 1.0]))
    assert torch.isfinite(kept).sum(-1).tolist() == [1, 2, 3, 4]
    assert torch.equal(kept[3], logits[3])


def test_top_k_keeps_k_tokens_whatever_their_order():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    kept = filter_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(kept[0]).tolist() == [False, True, False, True, False]
    assert math.isclose(kept[0, 1].item(), 3.0)


def test_min_p_keeps_tokens_at_least_that_share_of_the_best():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(4, -1)
    kept = filter_min_p(logits, torch.tensor([0.0, 0.2, 0.5, 1.0]))  # thresholds 0, 0.1, 0.25, 0.5
    assert torch.isfinite(kept).sum(-1).tolist() == [4, 3, 2, 1]
    assert torch.equal(kept[0], logits[0])


def test_min_p_draws_from_the_renormalised_head_and_leaves_other_rows_alone(draw_many):
    draws = 6000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -2.0])
    probs = logits.softmax(-1)  # [0.44, 0.27, 0.16, 0.06, ...]: min_p 0.3 keeps the first three
    rows = [dict(min_p=0.3 if p % 2 else 0.0, seed=11, position=p) for p in range(2 * draws)]
    drawn = draw_many(logits.expand(2 * draws, -1), rows)
    counts = torch.bincount(drawn[1::2], minlength=6).float()
    assert counts[3:].sum() == 0
    assert chi_square(counts[:3], probs[:3] / probs[:3].sum()) < 13.8  # 2 degrees of freedom, 0.999 quantile
    # A row with min_p 0 draws what it draws in a batch without min_p.
    unfiltered = [dict(row, min_p=0.0) for row in rows[::2]]
    assert torch.equal(drawn[::2], draw_many(logits.expand(draws, -1), unfiltered))


def test_the_kernel_draws_what_the_torch_path_draws():
    """Mixed rows (greedy, temperature, top-k, top-p, both, min-p, degenerate settings) over logits
    with ties and banned (-inf) tokens, so the kernel's candidates are rejected and re-drawn: 24 rows
    at once (a program per row), and 4 at a time (each pass split over a program per block)."""
    rng = random.Random(1)
    logits = random_logits(24, 9000)  # three blocks, the last one short
    logits[3, :50] = 20.0  # the best 50 tokens tie: top-k keeps the first k of them
    logits[5, 100:] = float("-inf")
    for trial in range(6):
        rows = [
            dict(
                temperature=rng.choice([0.0, 0.5, 1.0, 1.7]),
                top_k=rng.choice([0, 0, 1, 5, 40, 2000]),
                top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 1e-6]),
                min_p=rng.choice([0.0, 0.0, 0.05, 0.3, 1.0]),
                seed=rng.randrange(-(2**63), 2**63),
                position=rng.randrange(5000),
            )
            for _ in range(24)
        ]
        # The tie with a top-k alone, then with a top-p too, whose head ends within the tie.
        rows[3].update(temperature=1.0, top_k=(1, 5, 40, 0, 5, 40)[trial], top_p=(1.0, 0.9)[trial >= 4], min_p=0.0)
        expected = sample(logits, params(rows))
        assert torch.equal(draw_on_the_kernel(logits, rows), expected), f"trial {trial}"
        in_fours = [draw_on_the_kernel(logits[i : i + 4], rows[i : i + 4]) for i in range(0, 24, 4)]
        assert torch.equal(torch.cat(in_fours), expected), f"trial {trial}, 4 rows at a time"


@pytest.mark.parametrize("top_k", [0, 8], ids=["top-p", "top-k then top-p"])
def test_a_draw_at_a_top_p_boundary_does_not_depend_on_the_batch(top_k):
    """top_p within two float32 steps of the mass of the best 2 to 5 tokens (of the top-k head,
    renormalized, with a top-k): a row draws the same token in a batch of 16 (each pass split over
    blocks) and of 17 (a program per row). With these logits two rows disagreed when the two ways
    added the blocks' sums in different orders."""
    logits = random_logits(17, 9000, seed=6)
    rows = []
    for row in range(16):
        best = logits[row].sort(descending=True).values[: top_k or None]
        cumulative = best.softmax(-1).cumsum(-1)
        boundary = cumulative[row // 4 + 1]
        steps = row % 4 - 2  # -2, -1, 0 or +1 float32 steps from it
        for _ in range(abs(steps)):
            boundary = torch.nextafter(boundary, torch.tensor(float(steps > 0)))
        rows.append(dict(top_p=boundary.item(), top_k=top_k, seed=row + 600, position=row))
    split = draw_on_the_kernel(logits[:16], rows)
    one_program_per_row = draw_on_the_kernel(logits, rows + [dict(seed=99)])
    assert torch.equal(split, one_program_per_row[:16])


def test_a_row_with_both_top_k_and_top_p_needs_no_rejection_pass_unless_its_head_ends_in_a_tie():
    """Such a row draws from its worked-out head at once: after the first pass only a row whose head
    ends inside a tie is left to check its candidate's rank (it was left looking whenever the draw
    was the head's last token, every step for a head of one)."""
    logits = random_logits(2, 9000)
    logits[0, 123] = 40.0  # top-p 0.8 keeps token 123 alone
    logits[1, [5, 4100, 8000]] = 40.0  # a third each: top-p 0.5 keeps two of the three
    rows = [dict(top_k=20, top_p=0.8, seed=1), dict(top_k=20, top_p=0.5, seed=2)]
    p = params(rows, DEVICE)
    on_device = logits.to(DEVICE)
    sizes, bounds = heads(on_device, p)
    assert sizes.tolist() == [1, 2]
    row_args = (
        on_device,
        on_device.stride(0),
        9000,
        p.temperature,
        p.top_p,
        p.top_k,
        p.min_p,
        p.seed,
        p.position,
        sizes,
        bounds,
    )
    _, state_i = split_passes(row_args, p.any_rejections, True)
    assert state_i[1].tolist() == [0, 1]  # looking, per row
    assert torch.equal(draw_on_the_kernel(logits, rows), sample(logits, params(rows)))


@needs_cuda
def test_no_batch_compiles_a_kernel_after_compile_sampler():
    """The runner calls compile_sampler when it starts: a first step of any size and settings (rows
    with both top-k and top-p, beside others or not; split or not) then waits for no compile."""
    vocab = 9000
    compile_sampler(vocab, torch.device(DEVICE))
    kernels = (_sample_kernel, chunk_kernel, combine_kernel, _head_kernel)

    def compiled() -> int:
        return sum(len(caches[0]) for kernel in kernels for caches in kernel.device_caches.values())

    before = compiled()
    rng = random.Random(3)
    for size in (1, 2, 3, 16, 17, 64, 256):
        for _ in range(4):
            rows = [
                dict(
                    temperature=rng.choice([0.0, 0.7, 1.0]),
                    top_k=rng.choice([0, 0, 20]),
                    top_p=rng.choice([1.0, 0.8]),
                    min_p=rng.choice([0.0, 0.0, 0.1]),
                    seed=rng.randrange(1000),
                )
                for _ in range(size)
            ]
            draw_on_the_kernel(random_logits(size, vocab), rows)
    assert compiled() == before
