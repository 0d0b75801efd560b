"""What the origin says to the actors downstream of it: the tokenizers (encode, track, untrack) and
the scheduler (submit, abort, a session's turns), over the bus.

Each request returns its reply or an `Error` (the bus turns every failure on the wire into one);
publishes do not wait for anyone.
"""

from actors.lib.origin.request_stream import RequestRecord
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.generate import Constraint, GenerateRequest
from schemas.requests import Abort, AbortAll, Aborted, Accepted, Submit, Tenant
from schemas.session import BeginTurn, RecordTurn, TurnRecorded, TurnTokens
from schemas.tokenizer import CheckConstraint, ConstraintChecked, Encode, Encoded, Track, Tracked, Untrack

CONTROL_TIMEOUT_S = 10.0  # encode, track and submit are quick; a slower answer means an actor is down
# A tokenizer's first constraint check imports the grammar library (seconds of CPU, several times
# that on a loaded machine: it failed at 10 s in a test run on two busy cores), and a large schema
# compiles for long: a first structured request waits for them rather than failing.
CONSTRAINT_TIMEOUT_S = 60.0


class Downstream:
    def __init__(self, bus: Bus, subjects: Subjects, origin_subject: str) -> None:
        self._bus = bus
        self._subjects = subjects
        self._origin_subject = origin_subject  # where the tokenizers send the text of our requests

    async def encode(self, request: GenerateRequest, continuation: bool = False) -> Encoded | Error:
        """The prompt's tokens; with `continuation`, as the next turns of a conversation (no BOS)."""
        if request.input_ids is not None:
            return Encoded(list(request.input_ids))
        encode = Encode(
            text=request.text,
            messages=request.messages,
            add_special_tokens=not continuation,
            continuation=continuation,
            chat_template=request.chat_template,
        )
        return await self._bus.request(self._subjects.tokenizer, encode, Encoded, CONTROL_TIMEOUT_S)

    async def check_constraint(self, constraint: Constraint | None) -> ConstraintChecked | Error | None:
        """Whether a tokenizer can read `constraint` as a grammar (None: there is none to check)."""
        if constraint is None:
            return None
        check = CheckConstraint(constraint)
        return await self._bus.request(self._subjects.tokenizer, check, ConstraintChecked, CONSTRAINT_TIMEOUT_S)

    async def track(self, record: RequestRecord) -> Tracked | Error:
        """Asks a tokenizer to detokenize the request from where its client stands; the record
        notes which tokenizer took it."""
        params = record.params
        track = Track(
            record.request_id,
            self._origin_subject,
            params.stop,
            params.skip_special_tokens,
            record.delivered_ids,
            record.delivered_chars,
            params.stop_regex,
            params.include_stop_str_in_output,
            record.prompt_ids if params.prompt_logprobs_from is not None else [],
            params.logprob_token_ids,
        )
        reply = await self._bus.request(self._subjects.tokenizer, track, Tracked, CONTROL_TIMEOUT_S)
        if isinstance(reply, Tracked):
            record.tokenizer_id = reply.instance_id
        return reply

    async def untrack(self, request_id: str) -> None:
        await self._bus.publish(self._subjects.tokenizer_untrack, Untrack(request_id))

    async def submit(self, record: RequestRecord) -> Accepted | Error:
        """Submits the request as its record stands: the prompt, and the tokens its client has."""
        submit = Submit(
            record.request_id,
            record.prompt_ids,
            record.params,
            self._origin_subject,
            list(record.delivered_ids),
            record.tenant,
            record.fork_of,
            record.pooling,
        )
        return await self._bus.request(self._subjects.scheduler, submit, Accepted, CONTROL_TIMEOUT_S)

    async def abort(self, request_id: str, reason: str = "abort") -> None:
        """Frees what the request holds downstream; its client gets nothing more."""
        await self._bus.publish(self._subjects.scheduler, Abort(request_id, reason))

    async def abort_keeping_output(self, request_id: str) -> Aborted | Error:
        """Ends the request for a client that waits for its end (finish_reason "abort")."""
        abort = Abort(request_id, keep_output=True)
        return await self._bus.request(self._subjects.scheduler, abort, Aborted, CONTROL_TIMEOUT_S)

    async def abort_all(self, tenant: Tenant | None) -> Aborted | Error:
        """Ends, as `abort_keeping_output` does, every request of `tenant` (None: of everyone)."""
        return await self._bus.request(self._subjects.scheduler, AbortAll(tenant), Aborted, CONTROL_TIMEOUT_S)

    async def begin_turn(self, begin: BeginTurn) -> TurnTokens | Error:
        return await self._bus.request(self._subjects.scheduler, begin, TurnTokens, CONTROL_TIMEOUT_S)

    async def record_turn(self, turn: RecordTurn) -> TurnRecorded | Error:
        return await self._bus.request(self._subjects.scheduler, turn, TurnRecorded, CONTROL_TIMEOUT_S)
