"""What every route's request body shares: the sampling fields (with the ranges of the bus's
`SamplingParams`), the parsed request, and the decoding that turns msgspec's complaints into an
`Error` naming the field at fault.

Used by the OpenAI routes (openai_protocol) and the native ones (native_protocol); no I/O.
"""

from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

import msgspec

from schemas.errors import Error
from schemas.generate import (
    GenerateRequest,
    MinP,
    SamplingParams,
    Seed,
    SessionTurn,
    StopString,
    StopStrings,
    Temperature,
    TokenCount,
    TokenId,
    TopK,
    TopP,
)

Body = TypeVar("Body", bound=msgspec.Struct)

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# A turn is named by its request id; the id of an OpenAI response is that with a prefix.
RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-")


class SamplingFields(msgspec.Struct, kw_only=True):
    """What every route accepts for sampling; None means "the default". The ranges are those of
    `SamplingParams` (schemas/generate.py), so HTTP and the bus refuse the same values."""

    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    stop: StopString | StopStrings | None = None  # OpenAI takes one string or a list
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """A valid request. For chat without max_tokens, `request.params.max_tokens` is None: the
    scheduler fills in what the context window leaves after the prompt."""

    kind: Literal["chat", "completion", "generate"]
    request: GenerateRequest
    include_usage_in_stream: bool  # stream_options.include_usage, and only when streaming
    user: str = ""  # the OpenAI `user` field: the tenant when no API keys are configured


def decode_body(body: bytes, struct_type: type[Body]) -> Body | Error:
    try:
        return msgspec.json.decode(body, type=struct_type)
    except msgspec.ValidationError as exc:
        return _validation_error(str(exc))
    except msgspec.DecodeError as exc:
        return invalid(f"The request body is not valid JSON: {exc}")
    except RecursionError:
        return invalid("The request body is nested too deeply")


def _validation_error(text: str) -> Error:
    """Rewrites msgspec's "Expected `int`, got `str` - at `$.max_tokens`" with the field as `param`."""
    detail, _, path = text.partition(" - at `$")
    path = path.rstrip("`").lstrip(".")
    for prefix, say in (
        ("Object missing required field `", "is required"),
        ("Object contains unknown field `", "is not a known field"),
    ):
        if detail.startswith(prefix):
            field = ".".join(filter(None, (path, detail.removeprefix(prefix).rstrip("`"))))
            return invalid(f"`{field}` {say}", field)
    if not path:
        return invalid(f"The request body must be a JSON object: {detail}")
    return invalid(f"Invalid value for `{path}`: {detail}", path)


def invalid(message: str, param: str | None = None) -> Error:
    return Error("invalid_request", message, param=param)


def session_turn(session_id: str | None, parent: str | None, replace: bool | None) -> SessionTurn | None | Error:
    if session_id is None:
        if parent is not None or replace:
            return invalid("session_parent and session_replace need a session_id", "session_id")
        return None
    if parent is not None:
        parent = next((parent.removeprefix(p) for p in RESPONSE_ID_PREFIXES if parent.startswith(p)), parent)
    return SessionTurn(session_id, parent, bool(replace))


def sampling_params(fields: SamplingFields, max_tokens: int | None) -> SamplingParams:
    """Ranges were checked while decoding; here an absent or null field takes our default."""
    default = SamplingParams()

    def given(value, fallback):
        return fallback if value is None else value

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given(fields.temperature, default.temperature),
        top_p=given(fields.top_p, default.top_p),
        top_k=given(fields.top_k, default.top_k),
        min_p=given(fields.min_p, default.min_p),
        seed=fields.seed,
        stop=[fields.stop] if isinstance(fields.stop, str) else given(fields.stop, []),
        stop_token_ids=given(fields.stop_token_ids, []),
        ignore_eos=given(fields.ignore_eos, default.ignore_eos),
        skip_special_tokens=given(fields.skip_special_tokens, default.skip_special_tokens),
    )
