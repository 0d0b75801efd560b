"""The scheduler's request table: every request in flight, the waiting queue and the running
batch, and the checks a request passes before it joins them."""

import bisect
import itertools
from collections import deque

import msgspec

from actors.scheduler.sequence import Sequence, State
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.requests import Tenant


class RequestTable:
    """Requests by id, each in one place according to its state.

    Invariants: a WAITING sequence is in `waiting`, which stays in arrival order; a RUNNING one is
    in `running`, in the order they started (the last is preempted first); a DRAINING one is in
    neither until its drop is confirmed. Every sequence is in `by_id`, and nothing else is in
    either queue. A request joins only if it passes `validate`.
    """

    def __init__(self, max_model_len: int, vocab_size: int) -> None:
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.by_id: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, request_id: str) -> Sequence | None:
        return self.by_id.get(request_id)

    def validate(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Error | None:
        if request_id in self.by_id:
            return Error("invalid_request", f"request id {request_id!r} is already in flight")
        if not prompt_ids:
            return Error("invalid_request", "the prompt is empty", param="prompt")
        if params.max_tokens is None:
            return Error(
                "context_length_exceeded",
                f"This model's maximum context length is {self.max_model_len} tokens, and the prompt has {len(prompt_ids)}.",
                param="prompt",
            )
        for field, ids in (("prompt", prompt_ids), ("logprob_token_ids", params.logprob_token_ids)):
            if not ids or 0 <= min(ids) and max(ids) < self.vocab_size:  # in C: a long prompt's ids
                continue
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            return Error(
                "invalid_request", f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})", param=field
            )
        start = params.prompt_logprobs_from
        if start is not None and start >= len(prompt_ids):
            return Error(
                "invalid_request",
                f"prompt_logprobs_from is {start}, past the prompt's last position ({len(prompt_ids) - 1})",
                param="prompt_logprobs_from",
            )
        if error := self._token_rules_error(params):
            return error
        # A prompt alone (max_tokens 0) still gets room for one token more, as every start does.
        total = len(prompt_ids) + max(params.max_tokens, 1)
        if total > self.max_model_len:
            return Error(
                "context_length_exceeded",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({len(prompt_ids)} in the prompt, {params.max_tokens} in the completion).",
                param="max_tokens" if len(prompt_ids) < self.max_model_len else "prompt",
            )
        return None

    def _token_rules_error(self, params: SamplingParams) -> Error | None:
        """Token ids of the per-token controls outside the vocabulary, or a mask that leaves nothing to draw."""
        fields = {
            "logit_bias": params.logit_bias,
            "allowed_token_ids": params.allowed_token_ids or (),
            "disallowed_token_ids": params.disallowed_token_ids,
        }
        for name, ids in fields.items():
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                return Error(
                    "invalid_request",
                    f"{name}: token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})",
                    param=name,
                )
        allowed, disallowed = params.allowed_token_ids, set(params.disallowed_token_ids)
        if allowed is not None and not allowed:
            return Error("invalid_request", "allowed_token_ids must not be empty", param="allowed_token_ids")
        if (set(allowed) <= disallowed) if allowed is not None else len(disallowed) >= self.vocab_size:
            return Error(
                "invalid_request", "disallowed_token_ids leaves no token to draw", param="disallowed_token_ids"
            )
        return None

    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        origin: str,
        output_ids: list[int],
        tenant: Tenant,
        fork_of: str | None,
        pooling: Pooling | None = None,
    ) -> Sequence | Error:
        """Queues a request, its `max_tokens` filled in with what the context leaves if not given;
        or the reason it cannot be served."""
        if params.max_tokens is None and len(prompt_ids) < self.max_model_len:
            params = msgspec.structs.replace(params, max_tokens=self.max_model_len - len(prompt_ids))
        error = self.validate(request_id, prompt_ids, params)
        if pooling is not None and params.max_tokens != 0:
            error = error or Error("invalid_request", "an embedding draws no token: max_tokens must be 0", "max_tokens")
        if error:
            return error
        seq = Sequence(
            request_id,
            list(prompt_ids),
            params,
            origin,
            next(self._arrivals),
            list(output_ids),
            tenant,
            fork_of,
            pooling,
        )
        self.by_id[request_id] = seq
        self.waiting.append(seq)
        return seq

    def start(self, seq: Sequence) -> None:
        """A waiting sequence joins the running batch (it is near the head of the queue)."""
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.state = State.RUNNING

    def drain(self, seq: Sequence) -> None:
        """A running sequence leaves the batch, to wait again once the executor confirms its drop."""
        self.running.remove(seq)
        seq.state = State.DRAINING

    def drained(self, request_id: str) -> None:
        """The executor confirmed the drop: a draining sequence rejoins the queue in arrival order."""
        seq = self.by_id.get(request_id)
        if seq is not None and seq.state is State.DRAINING:
            seq.state = State.WAITING
            arrivals = [s.arrival for s in self.waiting]
            self.waiting.insert(bisect.bisect(arrivals, seq.arrival), seq)

    def remove(self, seq: Sequence) -> None:
        """The request is done (finished or aborted), wherever it stood."""
        del self.by_id[seq.request_id]
        if seq.state is State.RUNNING:
            self.running.remove(seq)
        elif seq.state is State.WAITING:
            self.waiting.remove(seq)

    def requeue_all(self, max_model_len: int, vocab_size: int) -> list[Sequence]:
        """A new executor (with these limits) knows nothing: every sequence waits again, in arrival
        order. Returns those that had started, whose KV went with the old executor."""
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        started = [s for s in self.by_id.values() if s.state is not State.WAITING]
        for seq in started:
            seq.state = State.WAITING
        self.running = []
        self.waiting = deque(sorted(self.by_id.values(), key=lambda s: s.arrival))
        return started
