"""The per-token controls of gpu/logit_rules.py on plain tensors, against transformers' logits
processors and the formulas vLLM and OpenAI state, one rule at a time and all together."""

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from gpu.logit_rules import LogitRules, TokenRules
from gpu.penalty_counts import FIRST_SLOTS
from gpu.step_io import SequenceInput

VOCAB = 50
EOS = 3
MINUS_INF = float("-inf")


def logits_of(rows: int, seed: int = 0) -> torch.Tensor:
    """[rows, VOCAB] float32 of both signs, as a model gives."""
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def row(rules: TokenRules | None, output_index: int = 0) -> SequenceInput:
    """A sampled row as the runner sees it: only its rules and output index matter here."""
    return SequenceInput([1], 0, [0], sample=True, output_index=output_index, rules=rules)


def applied(engine: LogitRules, rows: list[SequenceInput], logits: torch.Tensor) -> torch.Tensor:
    return engine.apply(engine.prepare(rows), logits)


def test_repetition_penalty_is_transformers_over_prompt_and_outputs():
    prompt, outputs = [5, 6, 7, 7], [9, 6, 11]
    rules = TokenRules.build(
        VOCAB, repetition_penalty=1.7, penalty_slot=0, penalty_prompt_ids=prompt, penalty_output_ids=outputs
    )
    logits = logits_of(1)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + outputs]), logits.clone())
    assert torch.equal(applied(LogitRules(VOCAB, torch.device("cpu")), [row(rules, 3)], logits), expected)


def test_presence_and_frequency_penalties_count_the_generated_tokens_only():
    prompt, outputs = [5, 6], [9, 6, 9, 9, 12]
    rules = TokenRules.build(
        VOCAB,
        frequency_penalty=0.5,
        presence_penalty=1.25,
        penalty_slot=0,
        penalty_prompt_ids=prompt,
        penalty_output_ids=outputs,
    )
    assert len(rules.penalty_prompt_ids) == 0  # only the repetition penalty reads the prompt
    logits = logits_of(1)
    counts = torch.bincount(torch.tensor(outputs), minlength=VOCAB).float()
    expected = logits - 0.5 * counts - 1.25 * (counts > 0).float()  # OpenAI's formula
    assert torch.equal(applied(LogitRules(VOCAB, torch.device("cpu")), [row(rules, 5)], logits), expected)


def test_min_tokens_bans_the_end_ids_until_then_as_transformers():
    rules = TokenRules.build(VOCAB, end_ids=[EOS, 8], min_tokens=3)
    engine = LogitRules(VOCAB, torch.device("cpu"))
    prompt = [1, 2, 3, 4]
    for index in range(5):
        logits = logits_of(1, seed=index)
        ids = torch.tensor([prompt + [7] * index])
        expected = MinNewTokensLengthLogitsProcessor(len(prompt), 3, [EOS, 8])(ids, logits.clone())
        assert torch.equal(applied(engine, [row(rules, index)], logits), expected)


def test_logit_bias_adds_as_transformers_sequence_bias():
    bias = {4: 2.5, 17: -100.0, 30: 100.0}
    logits = logits_of(1)
    expected = SequenceBiasLogitsProcessor({(k,): v for k, v in bias.items()})(torch.tensor([[1]]), logits.clone())
    result = applied(LogitRules(VOCAB, torch.device("cpu")), [row(TokenRules.build(VOCAB, logit_bias=bias))], logits)
    assert torch.allclose(result, expected)
    assert result.argmax().item() == 30


def test_allowed_keeps_only_those_and_disallowed_suppresses_as_transformers():
    logits = logits_of(2)
    engine = LogitRules(VOCAB, torch.device("cpu"))
    allowed = TokenRules.build(VOCAB, allowed_ids=[2, 9, 40])
    disallowed = TokenRules.build(VOCAB, disallowed_ids=[0, 9, 13])
    result = applied(engine, [row(allowed), row(disallowed)], logits)
    keep = torch.full((VOCAB,), MINUS_INF)
    keep[[2, 9, 40]] = 0.0
    assert torch.equal(result[0], logits[0] + keep)
    expected = SuppressTokensLogitsProcessor([0, 9, 13])(torch.tensor([[1]]), logits[1:].clone())
    assert torch.equal(result[1:], expected)


def test_rules_apply_in_order_penalties_bias_then_masks():
    """Every rule on one row equals the processors applied one after another in that order; a row
    without rules between ruled rows, and the logits given, are left as they were."""
    prompt, outputs = [5, 6, 7], [9, 6, 3]

    def every_rule(slot: int) -> TokenRules:
        return TokenRules.build(
            VOCAB,
            end_ids=[EOS],
            min_tokens=5,
            logit_bias={9: 4.0, 20: -1.5},
            allowed_ids=[3, 6, 9, 20, 21],
            disallowed_ids=[21],
            repetition_penalty=1.3,
            frequency_penalty=0.4,
            presence_penalty=0.2,
            penalty_slot=slot,
            penalty_prompt_ids=prompt,
            penalty_output_ids=outputs,
        )

    logits = logits_of(3)
    logits[2] = logits[0]
    given = logits.clone()
    rows = [row(every_rule(2), 3), row(None), row(every_rule(0), 3)]
    result = applied(LogitRules(VOCAB, torch.device("cpu")), rows, logits)

    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + outputs]), logits[:1].clone())[0]
    counts = torch.bincount(torch.tensor(outputs), minlength=VOCAB).float()
    expected = expected - 0.4 * counts - 0.2 * (counts > 0).float()
    expected[[9, 20]] += torch.tensor([4.0, -1.5])
    kept = torch.full((VOCAB,), MINUS_INF)
    kept[[3, 6, 9, 20]] = expected[[3, 6, 9, 20]]  # 21 disallowed, 3 is EOS under min_tokens
    kept[EOS] = MINUS_INF
    assert torch.equal(logits, given)
    assert torch.equal(result[1], given[1])
    assert torch.allclose(result[0], kept) and torch.allclose(result[2], kept)
    assert torch.isinf(result[0]).sum() == VOCAB - 3


def test_a_step_without_rules_does_nothing():
    engine = LogitRules(VOCAB, torch.device("cpu"))
    assert engine.prepare([row(None), row(None)]) is None
    logits = logits_of(2)
    assert engine.apply(None, logits) is logits
    assert engine.counts.counts is None  # allocated only once a penalized sequence comes
    assert TokenRules.build(VOCAB, end_ids=[EOS], repetition_penalty=1.0, logit_bias={}) is None


def test_a_row_is_never_left_with_nothing_to_draw():
    """min_tokens gives way to the masks: where only end tokens are allowed, it bans nothing."""
    engine = LogitRules(VOCAB, torch.device("cpu"))
    only_ends = TokenRules.build(VOCAB, end_ids=[EOS, 8], min_tokens=4, allowed_ids=[EOS, 8, 9], disallowed_ids=[9])
    result = applied(engine, [row(only_ends, 0)], logits_of(1))
    assert torch.isfinite(result[0, [EOS, 8]]).all() and torch.isinf(result).sum() == VOCAB - 2
    everything_else = TokenRules.build(VOCAB, end_ids=[EOS], min_tokens=4, disallowed_ids=set(range(VOCAB)) - {EOS})
    assert torch.isfinite(applied(engine, [row(everything_else, 0)], logits_of(1))[0, EOS])
    with pytest.raises(ValueError, match="no token to draw"):
        TokenRules.build(VOCAB, allowed_ids=[4, 5], disallowed_ids=[4, 5, 6])
    with pytest.raises(ValueError, match="no token to draw"):
        TokenRules.build(VOCAB, disallowed_ids=range(VOCAB))
    with pytest.raises(ValueError, match="token ids"):
        TokenRules.build(VOCAB, logit_bias={VOCAB: 1.0})
    # A stop token id outside the vocabulary cannot be drawn anyway: it is left out of the bans.
    assert TokenRules.build(VOCAB, end_ids=[EOS, VOCAB + 5], min_tokens=2).end_bans.tolist() == [EOS]


def test_counts_follow_the_draws_on_the_device_and_a_reused_slot_starts_afresh():
    engine = LogitRules(VOCAB, torch.device("cpu"))
    first = TokenRules.build(VOCAB, frequency_penalty=1.0, penalty_slot=0)
    other = TokenRules.build(VOCAB, presence_penalty=1.0, penalty_slot=1)
    for index, drawn in enumerate([[7, 4], [7, 5], [8, 5]]):
        step = engine.prepare([row(first, index), row(None), row(other, index)])
        engine.apply(step, logits_of(3))
        engine.count(step, torch.tensor([drawn[0], 0, drawn[1]]))  # the row without rules is not counted
    assert engine.counts.counts[0, [7, 8]].tolist() == [2, 1] and engine.counts.counts[0].sum() == 3
    assert engine.counts.counts[1, [4, 5]].tolist() == [1, 2] and engine.counts.counts[1].sum() == 3

    # Slot 0 goes to a new sequence (a preempted one restarting, with two outputs drawn before).
    restarted = TokenRules.build(VOCAB, frequency_penalty=1.0, penalty_slot=0, penalty_output_ids=[9, 9])
    logits = logits_of(1)
    result = applied(engine, [row(restarted, 2)], logits)
    expected = logits.clone()
    expected[0, 9] -= 2.0
    assert torch.equal(result, expected)
    assert engine.counts.counts[0].sum() == 2 and engine.counts.counts[1].sum() == 3

    # A slot past the counts' rows grows them, keeping the other slots' counts.
    far = TokenRules.build(VOCAB, presence_penalty=1.0, penalty_slot=FIRST_SLOTS + 3)
    engine.prepare([row(far)])
    assert len(engine.counts.counts) == 2 * FIRST_SLOTS
    assert engine.counts.counts[1, [4, 5]].tolist() == [1, 2] and engine.counts.counts[0, 9] == 2
