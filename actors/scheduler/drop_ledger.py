"""The executor's acknowledgements of dropped runs. The scheduler sends `DropSequence` without
waiting; the executor lists each drop it applied in the next `StepOutput`. Until then, updates
under that request id may come from the dropped run, not from the one that replaced it."""

from collections import Counter


class DropLedger:
    """Drops sent to the executor and not confirmed yet, by request id.

    Invariant: `unconfirmed(id)` holds exactly while more drops of `id` were sent than step outputs
    listed, since the executor started; an update of `id` meanwhile may come from a dropped run.
    """

    def __init__(self) -> None:
        self._unconfirmed: Counter[str] = Counter()

    def sent(self, request_id: str) -> None:
        self._unconfirmed[request_id] += 1

    def confirm(self, dropped: list[str]) -> list[str]:
        """Books the drops one step output lists (they took effect before its step ran); returns
        the ids with none left unconfirmed."""
        settled = []
        for request_id in dropped:
            self._unconfirmed[request_id] -= 1
            if self._unconfirmed[request_id] <= 0:
                del self._unconfirmed[request_id]
                settled.append(request_id)
        return settled

    def unconfirmed(self, request_id: str) -> bool:
        return self._unconfirmed[request_id] > 0

    def clear(self) -> None:
        """A new executor has nothing to confirm."""
        self._unconfirmed.clear()
