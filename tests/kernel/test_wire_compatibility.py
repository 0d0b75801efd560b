"""New fields get defaults (docs/design.md, "Subjects"), so a restarted actor of a newer build still
talks to the others: sampling parameters at their defaults are left off the wire."""

import msgspec

from schemas.generate import SamplingParams


class SamplingParamsBeforeDetokenize(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """SamplingParams as an older build knows them."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True


def test_an_older_build_reads_parameters_that_leave_the_new_fields_alone():
    sent = SamplingParams(max_tokens=8, temperature=0.5, top_k=20, seed=7, stop=["\n"])
    received = msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=SamplingParamsBeforeDetokenize)
    old_fields = msgspec.structs.asdict(received)
    assert old_fields == {name: getattr(sent, name) for name in old_fields}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=SamplingParams) == sent
