"""A turn of a session at its origin: its prompt continues the parent turn's tokens, and its own
tokens are recorded before its client sees the end, so that the client's next turn can follow."""

from actors.lib.origin.request_stream import RequestRecord, RequestStream
from actors.lib.origin.session_turns import SessionTurnGroup, continue_conversation
from schemas.errors import Error
from schemas.generate import SamplingParams, SessionTurn
from schemas.requests import RequestOutput, Tenant
from schemas.session import RecordTurn
from schemas.tokenizer import Encoded

END_OF_TURN = 2


def test_the_new_turn_follows_the_earlier_tokens():
    assert continue_conversation([1, 5, 6], Encoded([7, 8])) == [1, 5, 6, 7, 8]


def test_closing_tokens_the_earlier_reply_ends_with_are_not_repeated():
    """A reply that stopped at its end-of-turn token already holds what the template closes it with."""
    assert continue_conversation([1, 5, END_OF_TURN], Encoded([END_OF_TURN, 7, 8], closing_tokens=1)) == [1, 5, 2, 7, 8]
    # A reply cut by its token limit lacks them: the template's closing tokens go in.
    assert continue_conversation([1, 5, 6], Encoded([END_OF_TURN, 7, 8], closing_tokens=1)) == [1, 5, 6, 2, 7, 8]


async def no_close(_stream) -> None:
    pass


def turn_group(record_turn) -> tuple[SessionTurnGroup, RequestStream]:
    stream = RequestStream(RequestRecord("turn-2", [1, 5, 6, 7], SamplingParams()), 60.0, no_close)
    group = SessionTurnGroup(
        "turn-2", [1, 5, 6, 7], SessionTurn("s1", replace=True), Tenant("tenant-a"), "turn-1", record_turn
    )
    group.choices.append(stream)
    return group, stream


async def test_a_finished_turn_is_recorded_before_its_client_sees_the_end():
    seen: list[str] = []  # what happened, in order

    async def record_turn(turn: RecordTurn) -> None:
        seen.append(f"recorded {turn.token_ids}")
        assert turn == RecordTurn("s1", Tenant("tenant-a"), "turn-2", "turn-1", True, [1, 5, 6, 7, 10, 11])

    group, stream = turn_group(record_turn)
    stream.deliver(RequestOutput("turn-2", [10], "a", output_index=0))
    stream.deliver(RequestOutput("turn-2", [11], "b", "stop", 2, output_index=1))
    stream.deliver(RequestOutput("turn-2", [12], "c", output_index=2))  # past the end: not the client's
    async for _index, output in group:
        seen.append(f"client got {output.token_ids}{' and the end' if output.finish_reason else ''}")
    assert seen == ["client got [10]", "recorded [1, 5, 6, 7, 10, 11]", "client got [11] and the end"]


async def test_a_failed_turn_is_not_recorded():
    recorded: list[RecordTurn] = []

    async def record_turn(turn: RecordTurn) -> None:
        recorded.append(turn)

    group, stream = turn_group(record_turn)
    stream.deliver(RequestOutput("turn-2", [10], "a", output_index=0))
    stream.fail(Error("unavailable", "the scheduler is gone", retriable=True))
    outputs = [output async for _index, output in group]
    assert outputs[-1].error is not None and recorded == []
