"""An embedding's pooling across its prompt's chunks, on the executor's side: which tokens of each
chunk pool, the runner's sums of their final hidden states (gpu/pooling.py) added up, and at the
prompt's end the pooled vector that travels in the step output. Normalising is left to the origin,
which also truncates to the dimensions a client asks for."""

import numpy as np

from schemas.embed import Pooling


class PromptPool:
    """Invariant: `tokens` hidden states are summed in `total`, the prompt's first ones in order."""

    def __init__(self, pooling: Pooling) -> None:
        self.pooling = pooling
        self.total: np.ndarray | None = None  # [hidden] float64: the sum so far
        self.tokens = 0

    def tokens_of(self, fed: int, final: bool) -> int:
        """How many of an input's last tokens pool, of `fed` tokens of a chunk (`final`: the prompt's
        last): every one for a mean; the prompt's last token alone for last-token pooling."""
        if self.pooling == "mean":
            return fed
        return 1 if final else 0

    def add(self, sums: np.ndarray, tokens: int) -> None:
        """Adds the runner's sum [hidden] float64 of `tokens` tokens' hidden states."""
        self.total = sums.astype(np.float64) if self.total is None else self.total + sums
        self.tokens += tokens

    def vector(self) -> bytes:
        """The pooled vector, float32 little-endian [hidden]: the mean of the summed states (for
        last-token pooling, the one summed)."""
        return (self.total / self.tokens).astype("<f4").tobytes()
