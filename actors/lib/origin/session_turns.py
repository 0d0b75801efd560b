"""A turn of a session, at its origin. No I/O: the pipeline asks and tells the scheduler.

A turn is a request whose prompt starts with the tokens of an earlier turn, which the scheduler
keeps: the origin asks for them first (`BeginTurn`), so that its record still holds the whole
prompt, and tells the scheduler the turn's tokens (`RecordTurn`) when it has finished, before its
client sees the end, so that the client's next turn can follow it.
"""

from collections.abc import AsyncIterator, Awaitable, Callable

from actors.lib.origin.request_stream import RequestGroup
from schemas.generate import SessionTurn
from schemas.requests import RequestOutput, Tenant
from schemas.session import RecordTurn
from schemas.tokenizer import Encoded


def continue_conversation(earlier_ids: list[int], encoded: Encoded) -> list[int]:
    """`encoded` appended to the tokens of an earlier turn, leaving out the leading tokens that close
    the earlier reply where it already ends with them (it stopped at its end-of-turn token)."""
    new_ids = encoded.token_ids
    for overlap in range(min(encoded.closing_tokens, len(earlier_ids)), 0, -1):
        if earlier_ids[-overlap:] == new_ids[:overlap]:
            return earlier_ids + new_ids[overlap:]
    return earlier_ids + new_ids


class SessionTurnGroup(RequestGroup):
    """A request that is a turn of a session (one choice). When it finishes without an error, the
    group hands `record` the turn's tokens and waits for it before it yields the end."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        turn: SessionTurn,
        tenant: Tenant,
        parent_turn: str | None,
        record: Callable[[RecordTurn], Awaitable[None]],
    ) -> None:
        super().__init__(request_id, prompt_ids)
        self._turn = turn
        self._tenant = tenant
        self._parent_turn = parent_turn  # as the scheduler resolved it when the turn began
        self._record = record

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        async for index, output in super().__aiter__():
            if output.finish_reason and output.error is None:
                await self._record(self.recorded_turn(index))
            yield index, output

    def recorded_turn(self, index: int) -> RecordTurn:
        """The turn's tokens are what its client got: up to a stop string, not what ran past it."""
        record = self.choices[index].record
        return RecordTurn(
            self._turn.session_id,
            self._tenant,
            record.request_id,
            self._parent_turn,
            self._turn.replace,
            record.prompt_ids + record.delivered_ids,
        )
