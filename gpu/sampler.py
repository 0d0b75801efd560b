"""Batched token sampling whose randomness is a pure function of (seed, output position, token).

Each row draws with Gumbel-max: argmax(logits / temperature + Gumbel noise), where the noise of
token i comes from a counter-based hash of (seed, position, i), not from a stateful generator. So a
request draws the same tokens whatever else shares its batch, and a preempted request that is
recomputed draws them again. No per-row Python and no host sync: the caller reads the result.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.staging import Array
from gpu.step_io import SequenceInput

_INT64_RANGE = 1 << 64
# A lower temperature draws greedily, as in vLLM: dividing the logits by it can overflow them to inf.
GREEDY_BELOW_TEMPERATURE = 1e-5


def _as_int64(value: int) -> int:
    """The int64 with the same 64 bits as `value` mod 2**64 (torch has no uint64 arithmetic)."""
    value %= _INT64_RANGE
    return value - _INT64_RANGE if value >= 1 << 63 else value


_GOLDEN = _as_int64(0x9E3779B97F4A7C15)
_MIX_A = _as_int64(0xBF58476D1CE4E5B9)
_MIX_B = _as_int64(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    # Logical shift on int64: torch's >> is arithmetic, so clear the copied sign bits.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    # splitmix64's finalizer over int64 tensors; multiplication wraps mod 2**64 as uint64 would.
    z = (z ^ _shift_right(z, 30)) * _MIX_A
    z = (z ^ _shift_right(z, 27)) * _MIX_B
    return z ^ _shift_right(z, 31)


def uniform_noise(seed: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    # seed, position: [S] int64 -> [S, V] float32, uniform in (0, 1), a pure function of (seed, position, index)
    row_key = _mix64(_mix64(seed + _GOLDEN) + position * _GOLDEN)  # [S]
    index = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seed.device)  # [V]
    bits = _mix64(row_key[:, None] + index[None, :] * _GOLDEN)  # [S, V]
    # The top 23 bits k give u = (2k + 1) / 2^24: odd numbers below 2^24 are exact in float32, so u
    # lies in [2^-24, 1 - 2^-24] and the Gumbel noise -log(-log(u)) is finite (k + 0.5 was not
    # exact for the largest k, which rounded u up to 1 and the noise to +inf).
    return (_shift_right(bits, 41) * 2 + 1).float() * (1.0 / (1 << 24))


class SamplingArrays(NamedTuple, Generic[Array]):
    """The sampled rows' settings as one bundle, uploaded with the step: `SamplingTensors`' tensors."""

    temperature: Array  # [R] float32; 0 where the row draws greedily
    top_p: Array  # [R] float32
    top_k: Array  # [R] int64; 0 where it keeps every token
    min_p: Array  # [R] float32
    seed: Array  # [R] int64: the seed's 64 bits
    position: Array  # [R] int64: the index of the output token being drawn

    @classmethod
    def of(cls, chosen: Sequence[SequenceInput], vocab_size: int) -> "SamplingArrays[np.ndarray]":
        """The settings of the sequences that draw a token, in order."""
        n = len(chosen)
        seeds = [s.seed for s in chosen]
        try:
            seed = np.array(seeds, dtype=np.int64)
        except OverflowError:  # seeds are taken mod 2**64, as the sampler's hash does
            seed = np.array([_as_int64(s) for s in seeds], dtype=np.int64)
        temperature = np.fromiter((s.temperature for s in chosen), np.float32, n)
        temperature[temperature < GREEDY_BELOW_TEMPERATURE] = 0.0
        top_k = np.fromiter((s.top_k for s in chosen), np.int64, n)
        top_k[top_k >= vocab_size] = (
            0  # keeps every token: off, or a row with a top-p sizes its head over the whole row
        )
        return cls(
            temperature=temperature,
            top_p=np.fromiter((s.top_p for s in chosen), np.float32, n),
            top_k=top_k,
            min_p=np.fromiter((s.min_p for s in chosen), np.float32, n),
            seed=seed,
            position=np.fromiter((s.output_index for s in chosen), np.int64, n),
        )


@dataclass(frozen=True)
class SamplingTensors:
    temperature: torch.Tensor  # [S] float32; <= 0 means greedy
    top_p: torch.Tensor  # [S] float32; 1 keeps everything
    top_k: torch.Tensor  # [S] int64; <= 0 keeps everything
    min_p: torch.Tensor  # [S] float32; 0 keeps everything
    seed: torch.Tensor  # [S] int64
    position: torch.Tensor  # [S] int64, index of the output token being drawn
    # Host-side summaries, so a batch that needs no filtering (or no randomness) skips that work.
    # min-p has its own: it is one pass over the logits, while top-k and top-p sort every row.
    all_greedy: bool
    any_filtering: bool
    any_min_p: bool
    # The largest top_k of the sampled rows that also have a top_p (0: none): gpu/sampler_kernel.py
    # sizes those rows' heads from that many best logits.
    largest_joint_top_k: int
    # Whether a sampled row has a filter that gpu/sampler_kernel.py checks in rejection passes:
    # top-k or top-p alone, or min-p (a row with both draws from its sized head at once).
    any_rejections: bool

    @classmethod
    def from_lists(
        cls,
        temperature: list[float],
        top_p: list[float],
        top_k: list[int],
        min_p: list[float],
        seed: list[int],
        position: list[int],
        device: torch.device | str,
    ) -> "SamplingTensors":
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32).to(device, non_blocking=True),
            top_p=torch.tensor(top_p, dtype=torch.float32).to(device, non_blocking=True),
            top_k=torch.tensor(top_k, dtype=torch.int64).to(device, non_blocking=True),
            min_p=torch.tensor(min_p, dtype=torch.float32).to(device, non_blocking=True),
            seed=torch.tensor([_as_int64(s) for s in seed], dtype=torch.int64).to(device, non_blocking=True),
            position=torch.tensor(position, dtype=torch.int64).to(device, non_blocking=True),
            **host_summaries(temperature, top_p, top_k, min_p),
        )

    @classmethod
    def from_arrays(cls, device: SamplingArrays[torch.Tensor], host: SamplingArrays[np.ndarray]) -> "SamplingTensors":
        """The uploaded settings `device`, with the summaries of their `host` copies."""
        return cls(
            temperature=device.temperature,
            top_p=device.top_p,
            top_k=device.top_k,
            min_p=device.min_p,
            seed=device.seed,
            position=device.position,
            **host_summaries(host.temperature, host.top_p, host.top_k, host.min_p),
        )


def host_summaries(temperature, top_p, top_k, min_p) -> dict[str, bool | int]:
    """SamplingTensors' host-side fields, from the rows' settings (sequences or numpy arrays of [S])."""
    temperature, top_p, top_k, min_p = map(np.asarray, (temperature, top_p, top_k, min_p))
    sampled = temperature > 0
    joint = sampled & (top_k > 0) & (top_p < 1)
    return {
        "all_greedy": not sampled.any(),
        "any_filtering": bool((sampled & ((top_k > 0) | (top_p < 1))).any()),
        "any_min_p": bool((sampled & (min_p > 0)).any()),
        "largest_joint_top_k": int(top_k[joint].max(initial=0)),
        "any_rejections": bool((sampled & (((top_k > 0) != (top_p < 1)) | (min_p > 0))).any()),
    }


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf every logit outside the row's top k, then outside the smallest set whose
    probability reaches top_p. logits: [S, V] float32; top_k: [S]; top_p: [S] -> [S, V]"""
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True, stable=True)  # [S, V]
    ranks = torch.arange(vocab, device=logits.device)  # [V]
    k = torch.where(top_k > 0, top_k, vocab)  # [S]
    drop = ranks[None, :] >= k[:, None]  # [S, V]
    ordered = ordered.masked_fill(drop, float("-inf"))
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [S, V], probability of the better-ranked tokens
    drop |= mass_before >= top_p[:, None]
    drop[:, 0] = False  # the most likely token always stays
    return logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def filter_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf every logit whose probability is below min_p times that of the row's most
    likely token. logits: [S, V] float32, after temperature; min_p: [S] -> [S, V]"""
    # p < min_p * p_max is logit < max_logit + log(min_p): no softmax, and log(0) = -inf keeps a row whole.
    threshold = logits.max(dim=-1, keepdim=True).values + min_p.log()[:, None]  # [S, 1]
    return logits.masked_fill(logits < threshold, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """One token per row. logits: [S, V] float32 -> [S] int64"""
    greedy = logits.argmax(dim=-1)  # [S]
    if params.all_greedy:
        return greedy
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0)  # [S]; greedy rows discarded below
    scaled = logits / temperature[:, None]  # [S, V]
    if params.any_filtering:
        scaled = filter_top_k_top_p(scaled, params.top_k, params.top_p)
    if params.any_min_p:  # after top-k and top-p, so top-p weighs the unfiltered distribution, as in SGLang
        scaled = filter_min_p(scaled, params.min_p)
    gumbel = -torch.log(-torch.log(uniform_noise(params.seed, params.position, logits.shape[-1])))  # [S, V]
    drawn = (scaled + gumbel).argmax(dim=-1)  # [S]
    return torch.where(params.temperature > 0, drawn, greedy)
