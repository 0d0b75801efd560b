"""Hidden states pooled for embeddings, on the device right behind the forward pass, with no host sync.

An input that asks (`SequenceInput.pooled_tokens`) gets the sum of the final hidden states (after
the model's last norm: what the LM head reads) of its last `pooled_tokens` tokens, in float64: all
of a chunk's tokens for mean pooling, the prompt's last token for last pooling. A bf16 or fp16
state has 8 or 11 significant bits, so float64 adds up a prompt of 100K of them exactly unless
their sizes span more than 2^25: a mean is then the same bits whatever the order of the device's
atomic adds and however the prompt was chunked, as `--deterministic` promises. The sums of a step travel to pinned memory
with its drawn tokens; the executor adds a prompt's chunks up, in float64 too, and divides.
A step where no input asks does no pooling work (`PoolingRequests.of` is None): one where every
input draws (decodes) is not even looked at, one with prompt chunks costs a pass over its inputs.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, NamedTuple

import numpy as np
import torch

from gpu.staging import Array
from gpu.step_io import SequenceInput

_pooled_tokens = attrgetter("pooled_tokens")


class PoolingArrays(NamedTuple, Generic[Array]):
    """What the step's pooling needs on the device, uploaded with the step."""

    token_index: Array  # [N] int64: the step's tokens whose hidden states are pooled
    row: Array  # [N] int64: the pooled row (of the P asking inputs) each token adds into


@dataclass(frozen=True)
class PoolingRequests:
    """A step's pooling asks, laid out on the host."""

    arrays: PoolingArrays[np.ndarray]
    seqs: list[int]  # [P] the inputs that pool, in order: row i of the result is seqs[i]'s

    @classmethod
    def of(cls, inputs: Sequence[SequenceInput], query_start: np.ndarray) -> "PoolingRequests | None":
        """The asks of a step's `inputs`, whose tokens lie at `query_start` [S+1]; None when none
        asks. Raises ValueError naming an input that draws a token too, or asks for more tokens than
        it feeds."""
        if not any(map(_pooled_tokens, inputs)):  # a step with prompt chunks pays this pass, in C
            return None
        seqs = [i for i, s in enumerate(inputs) if s.pooled_tokens]
        counts = [inputs[i].pooled_tokens for i in seqs]
        for i, count in zip(seqs, counts):
            if inputs[i].sample or not 0 < count <= len(inputs[i].token_ids):
                fed = len(inputs[i].token_ids)
                raise ValueError(f"input {i} pools {count} of its {fed} tokens: it may pool 1 to {fed}, and draw none")
        ends = query_start[1:][seqs].tolist()
        token_index = np.concatenate([np.arange(end - count, end) for end, count in zip(ends, counts)])
        rows = np.repeat(np.arange(len(seqs)), counts)
        return cls(PoolingArrays(token_index.astype(np.int64), rows.astype(np.int64)), seqs)

    def compute(
        self, arrays: PoolingArrays[torch.Tensor], final_hidden: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """The pooled sums [P, hidden] float64, enqueued on the device. `final_hidden(index)`: the
        hidden states [n, hidden] after the final norm of the step's tokens at `index` [n]."""
        states = final_hidden(arrays.token_index).double()  # [N, hidden]
        sums = states.new_zeros(len(self.seqs), states.shape[-1])  # [P, hidden]
        return sums.index_add_(0, arrays.row, states)

    def unpack(self, sums: np.ndarray, num_seqs: int) -> list[np.ndarray | None]:
        """One entry per input of the step: its pooled sum [hidden] float64 from `sums` [P, hidden]
        on the host, None where it pooled nothing."""
        cut: list[np.ndarray | None] = [None] * num_seqs
        for row, seq in enumerate(self.seqs):
            cut[seq] = sums[row]
        return cut
