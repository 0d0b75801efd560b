"""Seeds of the n choices of one prompt (docs/design.md, "Randomness").

The sampler draws each token from (seed, output position). Choice 0 keeps the request's seed, so
n = 1 is the plain request; choice i > 0 gets a seed derived from (seed, i), so the choices differ,
and a request resubmitted with the same seed and n draws the same tokens in every choice.
"""

import hashlib

SEED_BITS = 63


def choice_seed(seed: int, index: int) -> int:
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) >> (64 - SEED_BITS)
