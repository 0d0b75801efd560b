"""The logprobs side of the executor's running batch: which prompt positions a chunk's input
scores, and the runner's logprobs as they travel in the step outputs."""

import msgspec

from gpu.step_io import PositionLogprobs
from schemas.generate import TokenLogprobs
from schemas.step import SequenceUpdate


def scored_targets(
    scores_from: int | None, token_ids: list[int], start: int, next_token: int | None, final: bool
) -> tuple[int, tuple[int, ...]]:
    """The prompt tokens an input of `token_ids` fed from position `start` scores: `(first, targets)`,
    target i following fed position `first + i`, from the first whose target is at prompt position
    `scores_from` or later (None: the run scores nothing). Each fed position is followed by the
    next fed token, the last by `next_token` (the scheduler names it while the prompt goes on). A
    final chunk's last position draws (or, with max_tokens 0, has no next token): it scores nothing."""
    if scores_from is None:
        return 0, ()
    following = token_ids[1:] + ([] if final or next_token is None else [next_token])
    first = max(scores_from - 1 - start, 0)
    return (first, tuple(following[first:])) if first < len(following) else (0, ())


def wire_logprobs(positions: PositionLogprobs | None, start: int) -> TokenLogprobs | None:
    """The runner's logprobs as they travel, from position `start`: lists nobody asked for stay off the wire."""
    if positions is None or not positions.logprobs:
        return None
    # Every position of a sequence has as many top and asked entries: the first says for all.
    tops = bool(positions.top_ids[0])
    return TokenLogprobs(
        start,
        positions.logprobs,
        positions.top_ids if tops else [],
        positions.top_logprobs if tops else [],
        positions.id_logprobs if positions.id_logprobs[0] else [],
    )


def halves_of(update: SequenceUpdate) -> tuple[SequenceUpdate, SequenceUpdate] | None:
    """`update` as two that say the same in turn, its prompt logprobs cut in half (a whole chunk's,
    with many top or asked ids, can outgrow a bus message): the first carries their first half
    alone, the second the rest and everything else. None when there is nothing to halve."""
    scored = update.prompt_logprobs
    if scored is None or len(scored.logprobs) < 2:
        return None
    h = len(scored.logprobs) // 2
    first = SequenceUpdate(
        update.request_id,
        [],
        update.output_index,
        cached_tokens=update.cached_tokens,
        prompt_logprobs=TokenLogprobs(
            scored.start, scored.logprobs[:h], scored.top_ids[:h], scored.top_logprobs[:h], scored.id_logprobs[:h]
        ),
    )
    rest = TokenLogprobs(
        scored.start + h, scored.logprobs[h:], scored.top_ids[h:], scored.top_logprobs[h:], scored.id_logprobs[h:]
    )
    return first, msgspec.structs.replace(update, cached_tokens=None, prompt_logprobs=rest)
