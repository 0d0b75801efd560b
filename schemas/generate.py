"""The public generation API: what a client sends on `<ns>.generate` and what comes back.

The HTTP frontdoor translates OpenAI requests into these same messages, so the bus API and HTTP
share one pipeline. A streaming request gets `GenerateChunk`s at its reply inbox, in order, then
one `GenerateResult` (or an `Error`).
"""

from typing import Annotated

import msgspec

from schemas.errors import Error

# The ranges of the sampling fields, checked wherever a message is decoded: a bus client's request
# at the gateway, an HTTP body at the frontdoor (which declares its fields with these same types),
# and every actor downstream. msgspec's complaint names the field. The bounds also keep every
# number encodable downstream (msgpack, int32 and int64 tensors); msgspec alone takes any int.
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
TokenCount = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]  # -1 or 0: no top-k filter
MinP = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # int64
StopString = Annotated[str, msgspec.Meta(min_length=1)]
StopStrings = Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)]


# Fields at their defaults stay off the wire, so a request that leaves a new field alone still
# reaches an actor of an older build, which refuses fields it does not know. Building one in Python
# checks no range (msgspec checks on decoding): build them from decoded values.
class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    max_tokens: TokenCount | None = 16  # None: up to the end of the context window
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    min_p: MinP = 0.0  # drops tokens less likely than min_p times the most likely one; 0: off
    seed: Seed | None = None  # None: the server picks one, so the draw is still reproducible
    stop: StopStrings = []
    stop_token_ids: list[TokenId] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # False: the outputs carry token ids and no text. The origin takes them from the executor's step
    # outputs itself, a bus hop shorter than through a tokenizer; stop strings need text, so none.
    detokenize: bool = True


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    content: str


MAX_CHOICES = 128


class SessionTurn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Runs a request as the next turn of an open session (see schemas/session.py): its prompt is
    the parent turn's prompt and output, then its own, of which only the new part is computed."""

    session_id: str
    parent_turn: str | None = None  # the turn to continue (branching from it); None: the latest
    replace: bool = False  # once this turn is recorded, the turns that came after the parent are gone


class GenerateRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="generate"):
    """Exactly one of `text`, `input_ids` and `messages` carries the prompt. With `n` > 1 the
    prompt is computed once and n choices are drawn from it, each with its own randomness."""

    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    params: SamplingParams = SamplingParams()
    stream: bool = False
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] = 1
    model: str | None = None
    user: str = (
        ""  # the tenant, or with API keys a narrower scope within it; cached prefixes are shared only within one
    )
    # To resume a stream after a bus outage: its id (from its chunks, or chosen by the client when it
    # first sent the request) and the number of the next chunk the client expects.
    request_id: str | None = None
    resume_from: int = 0
    session: SessionTurn | None = None  # a turn of an open session; n must be 1


class GenerateChunk(msgspec.Struct, frozen=True, tag="chunk"):
    request_id: str
    sequence: int  # 0, 1, 2... over all choices, so a client can check that nothing was lost or repeated
    token_ids: list[int]
    text: str
    index: int = 0  # the choice


class GenerateResult(msgspec.Struct, frozen=True, tag="result"):
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    index: int = 0  # the choice; a request with n choices ends after n results


GenerateReply = GenerateChunk | GenerateResult | Error
