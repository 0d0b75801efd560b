"""The public generation API: what a client sends on `<ns>.generate` and what comes back.

The HTTP frontdoor translates OpenAI requests into these same messages, so the bus API and HTTP
share one pipeline. A streaming request gets `GenerateChunk`s at its reply inbox, in order, then
one `GenerateResult` (or an `Error`).
"""

from typing import Annotated

import msgspec

from schemas.errors import Error


# Fields at their defaults stay off the wire, so a request that leaves a new field alone still
# reaches an actor of an older build, which refuses fields it does not know.
class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    max_tokens: int | None = 16  # None: up to the end of the context window
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or less: no top-k filter
    # Drops tokens less likely than min_p times the most likely one; 0: off. The range is checked on decoding.
    min_p: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    seed: int | None = None  # None: the server picks one, so the draw is still reproducible
    stop: list[str] = []
    stop_token_ids: list[int] = []
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
    user: str = ""  # the tenant, or with API keys a narrower scope within it; cached prefixes are shared only within one
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
