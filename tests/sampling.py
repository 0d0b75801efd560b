"""Sampling parameters the tests ask for again and again."""

from schemas.generate import SamplingParams


def greedy(max_tokens: int, **more) -> SamplingParams:
    """Exactly `max_tokens` tokens, each the most likely one (EOS does not stop it)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **more)
