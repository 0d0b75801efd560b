"""The token masks of constrained draws (structured output) on their way into the logits.

The runner gives the caller's filler a host bitmask of the step's drawing rows, [R, ceil(V/32)]
int32 with every bit set (every token allowed), after the forward pass is enqueued; the filler
clears the bits of the tokens each constrained row may not draw (actors/executor/grammars.py). The
mask is uploaded in one copy from pinned memory and applied in place with xgrammar's kernel (Triton
on CUDA, C++ on the CPU): a masked logit is -inf, in the logits that both the draw and the raw
logprobs read.
"""

from collections.abc import Callable

import torch

ALL_ALLOWED = -1  # an int32 with every bit set


class TokenMasks:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.words = (vocab_size + 31) // 32
        self._host = torch.empty(0, self.words, dtype=torch.int32)  # [rows, words]; pinned on CUDA
        self._device = self._host
        # The last upload out of `_host`: a refill waits for it (it has nearly always run by then,
        # since the filler waits for the step before, which was enqueued after the upload).
        self._uploaded: torch.cuda.Event | None = None
        if device.type == "cuda":
            self._warm_up()

    def apply(self, logits: torch.Tensor, fill: Callable[[torch.Tensor], None]) -> None:
        """`logits` [R, V] float32, masked in place as `fill` says: it gets the host bitmask [R, words]
        int32 with every bit set and clears those of the tokens each row may not draw."""
        rows = logits.shape[0]
        host = self.host_rows(rows)
        fill(host)
        if self.device.type == "cuda":
            mask = self._device[:rows]
            mask.copy_(host, non_blocking=True)
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
        else:
            mask = host
        import xgrammar  # here, not at the top: 1.3 s of CPU at every executor start, for a feature most servers never use

        xgrammar.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size)

    def host_rows(self, rows: int) -> torch.Tensor:
        """The host bitmask's first `rows` rows, every bit set; grown (twice as large) when too small."""
        if self._uploaded is not None:
            self._uploaded.synchronize()
        if rows > self._host.shape[0]:
            size = max(rows, 2 * self._host.shape[0])
            cuda = self.device.type == "cuda"
            self._host = torch.empty(size, self.words, dtype=torch.int32, pin_memory=cuda)
            self._device = torch.empty(size, self.words, dtype=torch.int32, device=self.device) if cuda else self._host
        host = self._host[:rows]
        # numpy's fill, on this thread alone: torch's would run on its intra-op threads, one region
        # ending in a barrier across every core, so as slow as the busiest core, on the step's path.
        host.numpy().fill(ALL_ALLOWED)
        return host

    def _warm_up(self) -> None:
        """Compiles the kernel now, not in a step (Triton's first call compiles it for this GPU)."""
        logits = torch.zeros(1, self.vocab_size, dtype=torch.float32, device=self.device)
        self.apply(logits, lambda host: host[:, :1].fill_(0))
        torch.cuda.synchronize(self.device)
