"""The run starts a tokenizer saw of requests it did not track, so that a Track arriving after its
request's run began can say so.

An origin sends a request's Track and its Submit at once. The Track leaves first and the run's step
outputs follow from the Submit, so a tokenizer has the Track first, except when it stalls with both
in its socket buffer: then the two subscriptions may be served in the other order, and outputs go by
untracked. The Track's answer then says the run started before it, and the origin submits again.
"""

from collections import OrderedDict


class UntrackedStarts:
    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s  # longer than any origin waits for the answer to its Track
        self._seen: OrderedDict[str, float] = OrderedDict()  # request id -> monotonic time seen, oldest first

    def saw(self, request_id: str, now: float) -> None:
        """A run of `request_id` started (its first step output went by) while it was not tracked here."""
        self._seen[request_id] = now
        self._seen.move_to_end(request_id)
        while next(iter(self._seen.values())) < now - self.keep_s:
            self._seen.popitem(last=False)

    def claim(self, request_id: str) -> bool:
        """Whether a run of `request_id` started here untracked; it is forgotten either way."""
        return self._seen.pop(request_id, None) is not None
