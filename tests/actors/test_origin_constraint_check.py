"""A constraint check waits longer than the origin's other requests to the tokenizers: a tokenizer's
first check imports the grammar library, which took over the 10 s those get on a loaded machine,
and the first structured request failed with a 504 (on a real nats-server, a stand-in tokenizer that
answers a check later than the control timeout, both timeouts scaled down)."""

import asyncio

from actors.lib.origin import downstream
from actors.lib.origin.downstream import Downstream
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.generate import Constraint
from schemas.tokenizer import CheckConstraint, ConstraintChecked, TokenizerRequest


async def test_a_slow_first_check_is_waited_for_past_the_control_timeout(nats_url, monkeypatch):
    monkeypatch.setattr(downstream, "CONTROL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(downstream, "CONSTRAINT_TIMEOUT_S", 5.0)
    subjects = Subjects()
    tokenizer_bus = await Bus.connect(nats_url, "tokenizer")
    origin_bus = await Bus.connect(nats_url, "frontdoor")

    async def slow_first_check(message: TokenizerRequest, _reply_to) -> ConstraintChecked:
        assert isinstance(message, CheckConstraint)
        await asyncio.sleep(0.6)  # three control timeouts: the grammar library being imported
        return ConstraintChecked()

    await tokenizer_bus.subscribe(subjects.tokenizer, TokenizerRequest, slow_first_check)
    try:
        reply = await Downstream(origin_bus, subjects, "origin").check_constraint(Constraint("json_object"))
        assert reply == ConstraintChecked()
    finally:
        await origin_bus.close()
        await tokenizer_bus.close()
