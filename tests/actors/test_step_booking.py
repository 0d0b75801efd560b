"""What a step output does to the scheduler's books, on the plain objects: the ledger of drops the
executor has not confirmed, and a sequence's progress and outputs."""

from actors.scheduler.drop_ledger import DropLedger
from actors.scheduler.sequence import Sequence, State
from schemas.generate import SamplingParams
from schemas.step import SequenceUpdate


def test_updates_of_a_dropped_run_are_known_until_every_drop_is_confirmed():
    ledger = DropLedger()
    ledger.sent("r")
    ledger.sent("r")  # dropped, resubmitted, dropped again
    assert ledger.unconfirmed("r") and not ledger.unconfirmed("other")
    assert ledger.confirm(["r"]) == []
    assert ledger.unconfirmed("r")
    assert ledger.confirm(["r", "x"]) == ["r", "x"]
    assert not ledger.unconfirmed("r")
    ledger.sent("s")
    ledger.clear()  # a new executor
    assert not ledger.unconfirmed("s")


def prefilling(prompt_len: int = 10, outputs: list[int] = ()) -> Sequence:
    seq = Sequence("r", list(range(prompt_len)), SamplingParams(max_tokens=8), "origin", 0, list(outputs))
    seq.state = State.RUNNING
    seq.start_run(4)  # four tokens from the cache
    return seq


def test_a_run_books_its_prefill_then_its_drawn_tokens():
    seq = prefilling()
    assert (seq.prefill_ids, seq.prefill_sent, seq.prefill_done, seq.computed_len) == (list(range(10)), 4, 4, 4)
    assert not seq.record_computed(SequenceUpdate("r", [], 0, prefilled_tokens=4))
    assert seq.prefilling and seq.computed_len == 8
    assert seq.record_computed(SequenceUpdate("r", [42], 0, prefilled_tokens=2))  # the prefill is done
    assert seq.extend_outputs(SequenceUpdate("r", [42], 0))
    assert seq.record_computed(SequenceUpdate("r", [43], 1)) is False
    assert seq.computed_len == 11  # the prompt, and output 0, fed to draw output 1
    assert seq.extend_outputs(SequenceUpdate("r", [43], 1)) and seq.output_ids == [42, 43]


def test_only_the_exact_continuation_extends_the_outputs():
    seq = prefilling(outputs=[7, 8])
    assert seq.prefill_ids == list(range(10)) + [7, 8]  # a resubmission recomputes what its client has
    assert not seq.extend_outputs(SequenceUpdate("r", [8, 9], 1))  # a repeat
    assert not seq.extend_outputs(SequenceUpdate("r", [11], 3))  # past a gap
    assert seq.output_ids == [7, 8]
    assert seq.extend_outputs(SequenceUpdate("r", [9], 2)) and seq.output_ids == [7, 8, 9]
