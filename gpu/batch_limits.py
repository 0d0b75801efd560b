"""What a step's input must stay within, checked on the host before the step is built: each check
raises ValueError naming the first bad sequence, so a bad command never writes outside its blocks
or the KV pool.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchLimits:
    """What a step's input must stay within; the runner's pool and model set them."""

    max_model_len: int
    num_blocks: int
    vocab_size: int


def first_true(bad: np.ndarray) -> int | None:
    """The index of the first True in `bad`, None if none is."""
    return int(bad.argmax()) if bad.any() else None


def check_shapes(query_lens, starts, ends, table_lens, block_size: int, limits: BatchLimits) -> None:
    """Per sequence [S]: tokens fed, start position, end position, block table length."""
    if (i := first_true(query_lens == 0)) is not None:
        raise ValueError(f"sequence {i}: token_ids is empty; every sequence in a step feeds at least one token")
    if (i := first_true(starts < 0)) is not None:
        raise ValueError(f"sequence {i}: start_position {starts[i]} is negative")
    if (i := first_true(ends > limits.max_model_len)) is not None:
        raise ValueError(f"sequence {i}: {ends[i]} tokens exceed max_model_len {limits.max_model_len}")
    if (i := first_true(table_lens * block_size < ends)) is not None:
        raise ValueError(
            f"sequence {i}: block table of {table_lens[i]} blocks holds {table_lens[i] * block_size} tokens, "
            f"but positions up to {ends[i]} are needed"
        )


def check_ids(input_ids, kv_indices, query_start, kv_indptr, limits: BatchLimits) -> None:
    """input_ids [T], kv_indices [P], with the sequences' query_start and kv_indptr [S+1] to name one."""
    if (p := first_true((kv_indices < 0) | (kv_indices >= limits.num_blocks))) is not None:
        seq = int(np.searchsorted(kv_indptr, p, side="right")) - 1
        raise ValueError(f"sequence {seq}: block ids must be in [0, {limits.num_blocks})")
    if (t := first_true((input_ids < 0) | (input_ids >= limits.vocab_size))) is not None:
        seq = int(np.searchsorted(query_start, t, side="right")) - 1
        raise ValueError(f"sequence {seq}: token ids must be in [0, {limits.vocab_size})")
