"""The ends of aborted requests that the executor will not report: those that were not running on
it (waiting, or draining after a preemption). Their clients wait for an end after the tokens
they drew, all of which are in `output_ids`; the scheduler actor (actor.py) publishes these ends to
the requests' origins. A running request's end comes from the executor, after its last token.
"""

from collections import defaultdict

from actors.scheduler.sequence import Sequence, State
from schemas.requests import RequestOutput


def ends_of_aborted(aborted: list[Sequence], weight_version: str) -> dict[str, list[RequestOutput]]:
    """The ends of the requests of `aborted` that did not run, by origin subject."""
    ends: dict[str, list[RequestOutput]] = defaultdict(list)
    for seq in aborted:
        if seq.state is not State.RUNNING:
            done = len(seq.output_ids)
            ends[seq.origin].append(
                RequestOutput(seq.request_id, [], "", "abort", done, output_index=done, weight_version=weight_version)
            )
    return ends
