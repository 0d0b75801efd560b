"""The per-token controls of gpu/logit_rules.py on plain tensors, against transformers' logits
processors and the formulas vLLM and OpenAI state, one rule at a time and all together."""

import random
from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from gpu.logit_rules import LogitRules, SlotRows, TokenRules, slot_rules_torch
from gpu.logit_rules_kernel import slot_rules_on_gpu
from gpu.rule_slots import FIRST_SLOTS
from gpu.step_io import SequenceInput
from tests.devices import DEVICE, needs_cuda, needs_triton

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
        VOCAB, repetition_penalty=1.7, penalty_prompt_ids=prompt, penalty_output_ids=outputs
    ).with_slot(0)
    logits = logits_of(1)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + outputs]), logits.clone())
    assert torch.equal(applied(LogitRules(VOCAB, torch.device("cpu")), [row(rules, 3)], logits), expected)


def test_presence_and_frequency_penalties_count_the_generated_tokens_only():
    prompt, outputs = [5, 6], [9, 6, 9, 9, 12]
    rules = TokenRules.build(
        VOCAB,
        frequency_penalty=0.5,
        presence_penalty=1.25,
        penalty_prompt_ids=prompt,
        penalty_output_ids=outputs,
    ).with_slot(0)
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
    allowed = TokenRules.build(VOCAB, allowed_ids=[2, 9, 40]).with_slot(0)
    disallowed = TokenRules.build(VOCAB, disallowed_ids=[0, 9, 13]).with_slot(1)
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
            penalty_prompt_ids=prompt,
            penalty_output_ids=outputs,
        ).with_slot(slot)

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
    assert engine.slots.counts is None  # allocated only once a penalized sequence comes
    assert TokenRules.build(VOCAB, end_ids=[EOS], repetition_penalty=1.0, logit_bias={}) is None


def test_a_row_is_never_left_with_nothing_to_draw():
    """min_tokens gives way to the masks: where only end tokens are allowed, it bans nothing."""
    engine = LogitRules(VOCAB, torch.device("cpu"))
    only_ends = TokenRules.build(
        VOCAB, end_ids=[EOS, 8], min_tokens=4, allowed_ids=[EOS, 8, 9], disallowed_ids=[9]
    ).with_slot(0)
    result = applied(engine, [row(only_ends, 0)], logits_of(1))
    assert torch.isfinite(result[0, [EOS, 8]]).all() and torch.isinf(result).sum() == VOCAB - 2
    everything_else = TokenRules.build(
        VOCAB, end_ids=[EOS], min_tokens=4, disallowed_ids=set(range(VOCAB)) - {EOS}
    ).with_slot(1)
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
    first = TokenRules.build(VOCAB, frequency_penalty=1.0).with_slot(0)
    other = TokenRules.build(VOCAB, presence_penalty=1.0).with_slot(1)
    for index, drawn in enumerate([[7, 4], [7, 5], [8, 5]]):
        step = engine.prepare([row(first, index), row(None), row(other, index)])
        engine.apply(step, logits_of(3))
        engine.count(step, torch.tensor([drawn[0], 0, drawn[1]]))  # the row without rules is not counted
    assert engine.slots.counts[0, [7, 8]].tolist() == [2, 1] and engine.slots.counts[0].sum() == 3
    assert engine.slots.counts[1, [4, 5]].tolist() == [1, 2] and engine.slots.counts[1].sum() == 3

    # Slot 0 goes to a new sequence (a preempted one restarting, with two outputs drawn before).
    restarted = TokenRules.build(VOCAB, frequency_penalty=1.0, penalty_output_ids=[9, 9]).with_slot(0)
    logits = logits_of(1)
    result = applied(engine, [row(restarted, 2)], logits)
    expected = logits.clone()
    expected[0, 9] -= 2.0
    assert torch.equal(result, expected)
    assert engine.slots.counts[0].sum() == 2 and engine.slots.counts[1].sum() == 3

    # A slot past the counts' rows grows them, keeping the other slots' counts.
    far = TokenRules.build(VOCAB, presence_penalty=1.0).with_slot(FIRST_SLOTS + 3)
    engine.prepare([row(far)])
    assert len(engine.slots.counts) == 2 * FIRST_SLOTS
    assert engine.slots.counts[1, [4, 5]].tolist() == [1, 2] and engine.slots.counts[0, 9] == 2


def random_rules(rng: random.Random, vocab: int, slot: int) -> TokenRules | None:
    """Any mix of the rules, as requests would ask them."""

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    rules = TokenRules.build(
        vocab,
        end_ids=ids(2),
        min_tokens=rng.choice([0, 3]),
        logit_bias=rng.choice([{}, dict(zip(ids(5), [rng.uniform(-100, 100) for _ in range(5)]))]),
        allowed_ids=rng.choice([None, ids(rng.randrange(1, 300))]),
        disallowed_ids=rng.choice([[], ids(40)]),
        repetition_penalty=rng.choice([1.0, 1.4]),
        frequency_penalty=rng.choice([0.0, -0.5, 1.5]),
        presence_penalty=rng.choice([0.0, 2.0]),
        penalty_prompt_ids=ids(rng.randrange(1, 200)),
        penalty_output_ids=ids(rng.randrange(0, 20)),
    )
    return rules.with_slot(slot) if rules is not None and rules.needs_slot else rules


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_the_rules_edit_the_logits_as_on_the_cpu():
    """64 rows of mixed rules over a real vocabulary, five steps with the draws counted on the
    device: the edited logits and the counts are the CPU's, bit for bit."""
    vocab, rng = 151_936, random.Random(0)
    rules = [random_rules(rng, vocab, slot) for slot in range(64)]
    engines = {d: LogitRules(vocab, torch.device(d)) for d in ("cpu", "cuda")}
    for index in range(5):
        logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(index)) * 4
        steps = {d: e.prepare([row(r, index) for r in rules]) for d, e in engines.items()}
        edited = {d: e.apply(steps[d], logits.to(d)) for d, e in engines.items()}
        assert torch.equal(edited["cuda"].cpu(), edited["cpu"])
        assert torch.isfinite(edited["cpu"]).any(dim=-1).all()
        drawn = edited["cpu"].argmax(dim=-1)
        for d, e in engines.items():
            e.count(steps[d], drawn.to(d))
    assert torch.equal(engines["cuda"].slots.counts.cpu(), engines["cpu"].slots.counts)
    assert torch.equal(engines["cuda"].slots.prompt_seen.cpu(), engines["cpu"].slots.prompt_seen)


@needs_triton
def test_the_kernel_edits_as_the_torch_path():
    """Slotted and plain rows, rows strided apart, a vocabulary of blocks with a short last one,
    three steps with their draws counted: gpu/logit_rules_kernel.py gives the torch path's logits."""
    vocab, rng = 5000, random.Random(1)
    rules = [random_rules(rng, vocab, slot) for slot in range(10)] + [None, None]
    engine = LogitRules(vocab, torch.device("cpu"))
    for index in range(3):
        wide = torch.randn(12, 2 * vocab, generator=torch.Generator().manual_seed(index)) * 4
        logits = wide[:, :vocab]  # rows strided apart, as a CUDA graph's output rows are not
        step = engine.prepare([row(r, index) for r in rules])
        expected = slot_rules_torch(logits, step.rows, engine.slots)
        state = SimpleNamespace(
            counts=engine.slots.counts.to(DEVICE),
            prompt_seen=engine.slots.prompt_seen.to(DEVICE),
            blocked=engine.slots.blocked.to(DEVICE),
        )
        rows = SlotRows._make(t.to(DEVICE) for t in step.rows)
        edited = slot_rules_on_gpu(logits.to(DEVICE), rows, state).cpu()
        assert torch.equal(torch.isinf(edited), torch.isinf(expected))
        assert torch.allclose(edited, expected, rtol=1e-6, atol=1e-6)
        engine.count(step, engine.apply(step, logits).argmax(dim=-1))
