"""The origin's I/O shell over a real nats-server. A scheduler and a tokenizer as small as the
origin's conversations with them answer on their real subjects, on a connection of their own, and
keep what they were sent: what a client gets back, and what the origin sends downstream when the
client leaves or the scheduler changes."""

import asyncio

import pytest
import structlog

from actors.lib.origin.pipeline import RequestPipeline
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.generate import ChatMessage, GenerateRequest, SamplingParams, SessionTurn
from schemas.health import Heartbeat
from schemas.requests import Abort, AbortAll, Aborted, Accepted, OutputBatch, RequestOutput, Submit, Tenant
from schemas.session import BeginTurn, RecordTurn, TurnRecorded, TurnTokens
from schemas.tokenizer import Encode, Encoded, Track, Tracked, Untrack

SUBJECTS = Subjects()
ENCODED = [5, 6, 7]
EARLIER_TURN = [1, 2, 3, 4]
ABORT_END_WAIT_S = 0.3


class StandIns:
    """The scheduler and a tokenizer, as the origin sees them."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.scheduler: asyncio.Queue = asyncio.Queue()  # everything the scheduler was sent, in order
        self.encoded: list[Encode] = []
        self.tracked: list[Track] = []
        self.untracked: asyncio.Queue[Untrack] = asyncio.Queue()
        self.aborts_known: set[str] = set()  # what it answers it aborted, keeping the output

    async def start(self) -> None:
        await self.bus.subscribe(
            SUBJECTS.scheduler, Submit | Abort | AbortAll | BeginTurn | RecordTurn, self._on_scheduler
        )
        await self.bus.subscribe(SUBJECTS.tokenizer, Encode | Track, self._on_tokenizer)
        await self.bus.subscribe(SUBJECTS.tokenizer_untrack, Untrack, self._on_untrack)
        # Alive for the whole test (the origin holds requests until every actor on their path is
        # ready); tests that replace or silence the scheduler beat for it themselves.
        for actor in ("tokenizer", "scheduler", "executor"):
            await self.heartbeat(actor, f"{actor}-a", interval_s=60.0)

    async def _on_scheduler(self, message, _reply_to):
        self.scheduler.put_nowait(message)
        match message:
            case Submit(request_id=request_id):
                return Accepted(request_id)
            case BeginTurn(session_id=session_id):
                return TurnTokens(session_id, "turn-1", EARLIER_TURN)
            case RecordTurn(session_id=session_id, turn_id=turn_id):
                return TurnRecorded(session_id, turn_id)
            case Abort(request_id=request_id, keep_output=True):
                return Aborted([request_id] if request_id in self.aborts_known else [])
            case AbortAll():
                return Aborted(sorted(self.aborts_known))
        return None

    async def _on_tokenizer(self, message, _reply_to):
        match message:
            case Encode():
                self.encoded.append(message)
                return Encoded(ENCODED)
            case Track(request_id=request_id):
                self.tracked.append(message)
                return Tracked(request_id, "tokenizer-1")

    async def _on_untrack(self, message: Untrack, _reply_to) -> None:
        self.untracked.put_nowait(message)

    async def heartbeat(self, actor: str, instance_id: str, interval_s: float = 1.0) -> None:
        await self.bus.publish(SUBJECTS.heartbeat(actor), Heartbeat(actor, instance_id, 1, True, interval_s))

    async def send(self, origin: str, *outputs: RequestOutput) -> None:
        """What a tokenizer sends an origin: the text of its requests' new tokens."""
        await self.bus.publish(origin, OutputBatch(list(outputs)))

    async def next_to_scheduler(self):
        return await asyncio.wait_for(self.scheduler.get(), 5)


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def stand_ins(nats_url):
    bus = await Bus.connect(nats_url, "stand-ins")
    actors = StandIns(bus)
    await actors.start()
    yield actors
    await bus.close()


@pytest.fixture
async def origin(nats_url):
    bus = await Bus.connect(nats_url, "origin")
    pipeline = RequestPipeline(
        bus, SUBJECTS, "origin-1", request_timeout_s=10.0, max_migrations=3, abort_end_wait_s=ABORT_END_WAIT_S
    )
    await pipeline.start()
    yield pipeline, bus
    await pipeline.close()
    await bus.close()


async def test_a_request_gets_each_output_once_in_order(origin, stand_ins):
    pipeline, _ = origin
    group = await pipeline.submit(GenerateRequest(text="hi", params=SamplingParams(max_tokens=3)), request_id="r")
    submit = await stand_ins.next_to_scheduler()
    assert (submit.request_id, submit.prompt_ids, submit.origin) == ("r", ENCODED, SUBJECTS.origin("origin-1"))
    assert submit.params.seed is not None  # ours, so that a resubmission draws the same tokens
    assert [t.request_id for t in stand_ins.tracked] == ["r"] and pipeline.in_flight == 1
    await stand_ins.send(submit.origin, RequestOutput("r", [10], "a", output_index=0))
    await stand_ins.send(
        submit.origin,
        RequestOutput("r", [10], "a", output_index=0),  # a repeat: dropped
        RequestOutput("r", [11, 12], "bc", "length", 3, output_index=1),
    )
    got = [(output.token_ids, output.text, output.finish_reason) async for _index, output in group]
    assert got == [([10], "a", None), ([11, 12], "bc", "length")]
    await group.close()
    assert pipeline.in_flight == 0


async def test_a_client_that_leaves_aborts_its_request_downstream(origin, stand_ins):
    """Which frees its KV blocks in the scheduler and its detokenizer in the tokenizer."""
    pipeline, _ = origin
    group = await pipeline.submit(GenerateRequest(text="hi"), request_id="left")
    assert isinstance(await stand_ins.next_to_scheduler(), Submit)
    await group.close()
    assert await stand_ins.next_to_scheduler() == Abort("left", "abort")
    assert await asyncio.wait_for(stand_ins.untracked.get(), 5) == Untrack("left")
    assert pipeline.in_flight == 0


async def test_a_new_scheduler_gets_the_request_as_the_client_has_it(origin, stand_ins):
    pipeline, _ = origin
    await stand_ins.heartbeat("scheduler", "scheduler-a")
    await until(lambda: not pipeline.not_ready(("scheduler",)))
    group = await pipeline.submit(GenerateRequest(text="hi", params=SamplingParams(max_tokens=4)), request_id="r")
    submit = await stand_ins.next_to_scheduler()
    outputs = aiter(group)
    await stand_ins.send(submit.origin, RequestOutput("r", [10, 11], "ab", output_index=0))
    assert (await anext(outputs))[1].token_ids == [10, 11]

    await stand_ins.heartbeat("scheduler", "scheduler-b")  # the first beat of a new scheduler
    assert await stand_ins.next_to_scheduler() == Abort("r", "migrate")
    resubmitted = await stand_ins.next_to_scheduler()
    assert (resubmitted.request_id, resubmitted.prompt_ids, resubmitted.output_ids) == ("r", ENCODED, [10, 11])
    assert resubmitted.params == submit.params  # the same seed: the same draw
    await stand_ins.send(submit.origin, RequestOutput("r", [12, 13], "cd", "length", 4, output_index=2))
    assert (await anext(outputs))[1].token_ids == [12, 13]
    await group.close()


async def test_a_session_turn_continues_its_parent_and_is_recorded_before_its_end(origin, stand_ins):
    pipeline, _ = origin
    request = GenerateRequest(messages=[ChatMessage("user", "and then?")], session=SessionTurn("s1"))
    group = await pipeline.submit(request, tenant=Tenant("tenant-a"), request_id="turn-2")
    assert await stand_ins.next_to_scheduler() == BeginTurn("s1", Tenant("tenant-a"), "turn-2", None)
    assert stand_ins.encoded[0].continuation and not stand_ins.encoded[0].add_special_tokens
    submit = await stand_ins.next_to_scheduler()
    assert submit.prompt_ids == EARLIER_TURN + ENCODED
    await stand_ins.send(submit.origin, RequestOutput("turn-2", [10], "a", "stop", 1, output_index=0))
    async for _index, output in group:
        assert output.finish_reason == "stop"
        assert stand_ins.scheduler.get_nowait() == RecordTurn(
            "s1", Tenant("tenant-a"), "turn-2", "turn-1", False, EARLIER_TURN + ENCODED + [10]
        )
    await group.close()


async def test_a_migration_that_fails_is_logged_and_fails_its_request(origin, stand_ins):
    """Here the origin's bus is closed under a migration: the client gets a retriable error at
    once, rather than waiting out its timeout, and the failure is in the log."""
    pipeline, bus = origin
    await stand_ins.heartbeat("scheduler", "scheduler-a", interval_s=0.05)
    await until(lambda: not pipeline.not_ready(("scheduler",)))
    request = GenerateRequest(input_ids=[5, 6], params=SamplingParams(detokenize=False))
    group = await pipeline.submit(request, request_id="r")
    await bus.close()
    watch = asyncio.create_task(pipeline.watch_liveness())  # finds the scheduler silent, and moves "r"
    try:
        with structlog.testing.capture_logs() as logs:
            [(_index, output)] = [item async for item in group]
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    assert (output.error.code, output.error.retriable) == ("internal", True)
    assert "could not be migrated" in output.error.message
    assert [entry["request_id"] for entry in logs if entry["event"] == "migration_failed"] == ["r"]
    await group.close()


async def test_an_aborted_request_ends_with_what_its_client_has_and_moves_no_more(origin, stand_ins):
    """Each of its n choices: one the scheduler ends (its end comes as a tokenizer's output), one
    it did not know, which the origin ends itself after its wait and aborts downstream. A new
    scheduler meanwhile gets neither again. Both are untracked when the client closes the group."""
    pipeline, _ = origin
    await stand_ins.heartbeat("scheduler", "scheduler-a")
    await until(lambda: not pipeline.not_ready(("scheduler",)))
    group = await pipeline.submit(GenerateRequest(text="hi", n=2, params=SamplingParams(max_tokens=9)), request_id="r")
    submits = [await stand_ins.next_to_scheduler() for _ in range(2)]
    origin_subject = submits[0].origin
    await stand_ins.send(origin_subject, RequestOutput("r-0", [10, 11], "ab", output_index=0))
    stand_ins.aborts_known = {"r-0"}
    assert await pipeline.abort_request("r", tenant=Tenant("someone-else")) == []
    assert await pipeline.abort_request("r") == ["r-0", "r-1"]
    assert {await stand_ins.next_to_scheduler() for _ in range(2)} == {
        Abort("r-0", keep_output=True),
        Abort("r-1", keep_output=True),
    }
    await stand_ins.heartbeat("scheduler", "scheduler-b")  # a migration of everything running
    await stand_ins.send(origin_subject, RequestOutput("r-0", [], "", "abort", 2, output_index=2))
    got = [(index, output.token_ids, output.finish_reason) async for index, output in group]
    assert got == [(0, [10, 11], None), (0, [], "abort"), (1, [], "abort")]
    assert await stand_ins.next_to_scheduler() == Abort("r-1")  # the run it may have missed
    assert stand_ins.scheduler.empty()  # and nothing was submitted again
    await group.close()
    assert {await asyncio.wait_for(stand_ins.untracked.get(), 5) for _ in range(2)} == {Untrack("r-0"), Untrack("r-1")}
    assert await pipeline.abort_request("r") == []  # ended


async def test_abort_all_asks_the_scheduler_for_every_request_of_the_tenant(origin, stand_ins):
    pipeline, _ = origin
    mine = await pipeline.submit(GenerateRequest(text="hi"), tenant=Tenant("a"), request_id="mine")
    theirs = await pipeline.submit(GenerateRequest(text="hi"), tenant=Tenant("b"), request_id="theirs")
    submits = [await stand_ins.next_to_scheduler() for _ in range(2)]
    stand_ins.aborts_known = {"mine", "at-another-origin"}
    assert await pipeline.abort_all(Tenant("a")) == ["at-another-origin", "mine"]
    assert await stand_ins.next_to_scheduler() == AbortAll(Tenant("a"))
    await stand_ins.send(submits[0].origin, RequestOutput("mine", [], "", "abort", 0, output_index=0))
    assert [output.finish_reason async for _index, output in mine] == ["abort"]
    assert theirs.choices[0].running and not theirs.choices[0].aborting
    await mine.close()
    await theirs.close()


async def test_a_request_is_held_until_its_path_is_ready_and_counts_while_held(nats_url, origin):
    """No actor has beaten yet (a server starting): the request waits, counted in flight (so the
    concurrency limit sees it), and goes on once the tokenizer, scheduler and executor are up."""
    pipeline, _ = origin
    submitted = asyncio.create_task(pipeline.submit(GenerateRequest(text="hi"), request_id="r"))
    await until(lambda: pipeline.in_flight == 1)
    await asyncio.sleep(0.2)
    assert not submitted.done()
    bus = await Bus.connect(nats_url, "stand-ins")
    actors = StandIns(bus)
    await actors.start()  # subscribes, then beats for the three actors
    group = await asyncio.wait_for(submitted, 5)
    assert (await actors.next_to_scheduler()).request_id == "r" and pipeline.in_flight == 1
    await group.close()
    await bus.close()


async def test_a_request_aborted_while_held_is_never_submitted_and_ends_aborted(nats_url, origin):
    pipeline, _ = origin
    submitted = asyncio.create_task(pipeline.submit(GenerateRequest(text="hi"), tenant=Tenant("a"), request_id="r"))
    await until(lambda: pipeline.in_flight == 1)
    assert await pipeline.abort_request("r", tenant=Tenant("b")) == []  # not theirs
    assert await pipeline.abort_request("r", tenant=Tenant("a")) == ["r"]
    bus = await Bus.connect(nats_url, "stand-ins")
    actors = StandIns(bus)
    await actors.start()
    group = await asyncio.wait_for(submitted, 5)
    got = [(output.token_ids, output.finish_reason) async for _index, output in group]
    assert got == [([], "abort")] and actors.scheduler.empty()  # nothing went downstream
    await group.close()
    assert pipeline.in_flight == 0
    await bus.close()
