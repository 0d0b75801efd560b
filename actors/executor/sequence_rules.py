"""The executor's side of the per-token controls: a starting sequence's `TokenRules`
(gpu/logit_rules.py), the slots of the runner's state they use, and each output's temperature
under a temperature schedule. The running batch owns one `FreeSlots` and calls these."""

import heapq

from gpu.logit_rules import TokenRules
from schemas.generate import SamplingParams
from schemas.step import StartSequence


class FreeSlots:
    """The slots of the runner's rule state (gpu/rule_slots.py), one per running sequence whose
    rules need one: the lowest free one is handed out, so the state stays as small as the most such
    sequences at once. A slot given back may go to another sequence at once, even while a step
    that counts into it for the old one is in flight: the runner starts the slot afresh in the new
    one's first launch, after that step in stream order."""

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
    params: SamplingParams, start: StartSequence, end_ids: frozenset[int], vocab_size: int, slots: FreeSlots
) -> TokenRules | None:
    """The rules of the sequence `start` starts, with a slot from `slots` when they need one; None
    when it asks for none. `end_ids`: the ids that end it (EOS, unless ignore_eos, and the stop
    token ids), which min_tokens keeps away."""
    p = params
    rules = TokenRules.build(
        vocab_size,
        end_ids=end_ids,
        min_tokens=p.min_tokens,  # counted from the first output, those before a preemption included
        logit_bias=p.logit_bias,
        allowed_ids=p.allowed_token_ids,
        disallowed_ids=p.disallowed_token_ids,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        penalty_prompt_ids=start.penalty_prompt_ids,
        penalty_output_ids=start.output_ids,
    )
    return rules.with_slot(slots.take()) if rules is not None and rules.needs_slot else rules


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
