"""The executor's side of the per-token controls: a starting sequence's `TokenRules`
(gpu/logit_rules.py), the penalty slots they count in, and each output's temperature under a
temperature schedule. The running batch owns one `PenaltySlots` and calls these when it plans."""

import heapq

from gpu.logit_rules import TokenRules
from schemas.generate import SamplingParams
from schemas.step import StartSequence


class PenaltySlots:
    """The rows of the runner's penalty counts, one per running sequence with a penalty: the lowest
    free one is handed out, so the counts stay as small as the most such sequences at once.
    A slot given back may go to another sequence at once, even while a step that counts into it
    for the old one is in flight: the runner restarts the slot in the new one's first launch, after
    that step in stream order (gpu/penalty_counts.py)."""

    def __init__(self) -> None:
        self._free: list[int] = []  # a heap
        self._used = 0  # slots ever handed out: 0 ..< _used

    def take(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._used += 1
        return self._used - 1

    def give_back(self, slot: int) -> None:
        heapq.heappush(self._free, slot)


def token_rules(
    params: SamplingParams, start: StartSequence, end_ids: frozenset[int], vocab_size: int, slots: PenaltySlots
) -> TokenRules | None:
    """The rules of the sequence `start` starts, with a penalty slot from `slots` when it has a
    penalty; None when it asks for none. `end_ids`: the ids that end it (EOS, unless ignore_eos,
    and the stop token ids), which min_tokens keeps away."""
    p = params
    penalized = TokenRules.penalized(p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
    return TokenRules.build(
        vocab_size,
        end_ids=end_ids,
        min_tokens=p.min_tokens,  # counted from the first output, those before a preemption included
        logit_bias=p.logit_bias,
        allowed_ids=p.allowed_token_ids,
        disallowed_ids=p.disallowed_token_ids,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        penalty_slot=slots.take() if penalized else -1,
        penalty_prompt_ids=start.penalty_prompt_ids,
        penalty_output_ids=start.penalty_output_ids,
    )


def temperature_at(params: SamplingParams, output_index: int) -> float:
    """The temperature output `output_index` is drawn at: under a schedule, from `temperature` at
    the first output linearly to `final_temperature` at output `temperature_schedule_tokens`, and
    that after. A function of the output index alone, so the seed rule holds."""
    final = params.final_temperature
    if final is None:
        return params.temperature
    steps = params.temperature_schedule_tokens
    if output_index >= steps:
        return final
    return params.temperature + (final - params.temperature) * (output_index / steps)
