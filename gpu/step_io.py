"""What one model step takes and gives back: a sequence's input, and the launched step whose
drawn tokens are on their way to the host."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from gpu.logit_rules import TokenRules
    from gpu.logprobs import LogprobRequests
    from gpu.pooling import PoolingRequests


@dataclass(frozen=True)
class SequenceInput:
    token_ids: list[int]  # the new tokens to feed this step (a prompt chunk, or the one last sampled token)
    start_position: int  # how many tokens of this sequence are already in the KV cache
    block_table: list[int]  # KV block ids of this sequence, in order; must cover start_position + len(token_ids)
    sample: bool  # draw a token from the last position's logits (False for a non-final prompt chunk)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    output_index: int = 0  # the index of the output token being drawn (0 for the first), keys the randomness
    # >= 0: this decode's one token is the one drawn for sequence `previous_row` of the previous
    # launch, still on the device; token_ids is then [FROM_PREVIOUS_STEP].
    previous_row: int = -1
    # The per-token controls of the draw (penalties, bias, masks, min_tokens): gpu/logit_rules.py.
    rules: "TokenRules | None" = None
    # Logprobs of the drawn token (sample=True): its own, the `top_logprobs` most likely tokens' and
    # those of `logprob_token_ids`; of the raw logits, or with `processed_logprobs` of the
    # distribution drawn from (after rules, temperature and filters).
    logprobs: bool = False
    top_logprobs: int = 0
    logprob_token_ids: tuple[int, ...] = ()
    processed_logprobs: bool = False
    # Prompt logprobs: entry i of `scored_targets` is the token that follows fed position
    # `scored_from + i` (an index into token_ids); its logprob, and the top and asked ids' as above
    # (always of the raw logits), come back in `StepLogprobs.prompt`. A final chunk's last position
    # draws, so it is never scored.
    scored_from: int = 0
    scored_targets: tuple[int, ...] = ()
    # An embedding's: the sum of the final hidden states of the input's last this many tokens comes
    # back in `PendingStep.pooled` (gpu/pooling.py); 0: none. Such an input draws nothing (sample False).
    pooled_tokens: int = 0


# Tuples, not dataclasses: a step at a large batch makes one of each per sequence, on the host's path.
class PositionLogprobs(NamedTuple):
    """Logprobs at consecutive positions of one sequence, on the host: entry i is position i's."""

    logprobs: list[float]  # [N] of the token at each position (the drawn one, or the scored target)
    top_ids: list[list[int]]  # [N][top_logprobs] most likely first; [] entries when none were asked
    top_logprobs: list[list[float]]  # [N][top_logprobs]
    id_logprobs: list[list[float]]  # [N][len(logprob_token_ids)]


class StepLogprobs(NamedTuple):
    """One sequence's logprobs from a step."""

    drawn: PositionLogprobs | None  # one entry, for the drawn token; None when not asked
    prompt: PositionLogprobs | None  # one entry per scored target; None when none


class PendingStep:
    """A launched step: its drawn tokens, and the logprobs asked, are on their way to pinned host memory."""

    def __init__(
        self,
        num_seqs: int,
        rows: np.ndarray,
        drawn: torch.Tensor,
        done: torch.cuda.Event | None,
        logprobs: "tuple[LogprobRequests, torch.Tensor] | None" = None,
        pooled: "tuple[PoolingRequests, torch.Tensor] | None" = None,
    ) -> None:
        self._num_seqs = num_seqs
        self._rows = rows  # [R] the sequences that sample, in order
        self._drawn = drawn  # [R] int64 on the host (pinned on CUDA), written once `done` has passed
        self._done = done
        # The step's asks and their packed result [size] float32 on the host, written with `drawn`.
        self._logprobs = logprobs
        self._pooled = pooled  # the step's pooling asks and their sums [P, hidden] float64, written with `drawn`
        self._tokens: list[int | None] | None = None
        self._unpacked: list[StepLogprobs | None] | None = None

    @classmethod
    def copying(
        cls,
        num_seqs: int,
        rows: np.ndarray,
        drawn: torch.Tensor,
        stream: torch.cuda.Stream | None,
        logprobs: "tuple[LogprobRequests, torch.Tensor] | None" = None,
        pooled: "tuple[PoolingRequests, torch.Tensor] | None" = None,
    ) -> "PendingStep":
        """The step whose tokens `drawn` [R], packed logprobs and pooled sums (on the device when
        `stream` is given) start their copy to pinned host memory now, behind the step's work on `stream`."""
        if stream is None:
            return cls(num_seqs, rows, drawn, None, logprobs, pooled)
        pinned = _pinned_copy(drawn)
        if logprobs is not None:
            logprobs = (logprobs[0], _pinned_copy(logprobs[1]))
        if pooled is not None:
            pooled = (pooled[0], _pinned_copy(pooled[1]))
        done = torch.cuda.Event()
        done.record(stream)
        return cls(num_seqs, rows, pinned, done, logprobs, pooled)

    def done(self) -> bool:
        """Whether the step has finished, so `tokens()` returns without waiting."""
        return self._done is None or self._done.query()

    def tokens(self) -> list[int | None]:
        """Waits for the step and returns one drawn token per sequence with `sample=True`, None for
        the others."""
        if self._tokens is None:
            if self._done is not None:
                self._done.synchronize()  # the step's one host sync; releases the GIL while it waits
            drawn = self._drawn.tolist()
            if len(drawn) == self._num_seqs:
                self._tokens = drawn
            else:
                self._tokens = [None] * self._num_seqs
                for row, token in zip(self._rows.tolist(), drawn):
                    self._tokens[row] = token
        return self._tokens

    def logprobs(self) -> list[StepLogprobs | None]:
        """Waits for the step (as `tokens` does) and returns one entry per sequence: the logprobs it
        asked for, None where it asked none (every entry None when no sequence of the step asked)."""
        self.tokens()
        if self._unpacked is None:
            if self._logprobs is None:
                self._unpacked = [None] * self._num_seqs
            else:
                requests, packed = self._logprobs
                self._unpacked = requests.unpack(packed.numpy(), self._num_seqs)
        return self._unpacked

    def pooled(self) -> list[np.ndarray | None] | None:
        """Waits for the step (as `tokens` does) and returns one entry per sequence: its pooled sum
        [hidden] float64, None where it pooled nothing; None when no sequence of the step pooled."""
        if self._pooled is None:
            return None
        self.tokens()
        requests, sums = self._pooled
        return requests.unpack(sums.numpy(), self._num_seqs)


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of device `tensor` into pinned host memory (from torch's pinned cache), enqueued."""
    pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    pinned.copy_(tensor, non_blocking=True)
    return pinned
