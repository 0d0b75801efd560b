"""What every route's request body shares: number bounds, the sampling fields, the parsed request,
and the decoding that turns msgspec's complaints into an `Error` naming the field at fault.

Used by the OpenAI routes (openai_protocol) and the native ones (native_protocol); no I/O.
"""

from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

import msgspec

from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams, SessionTurn

# Bounds keep every number encodable downstream (msgpack, int32 tensors); msgspec alone takes any int.
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
Body = TypeVar("Body", bound=msgspec.Struct)

TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
TokenCount = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
StopString = Annotated[str, msgspec.Meta(min_length=1)]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# A turn is named by its request id; the id of an OpenAI response is that with a prefix.
RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-")
Stop = StopString | Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)] | None


class SamplingFields(msgspec.Struct, kw_only=True):
    """What every route accepts for sampling; None means "the default"."""

    max_tokens: TokenCount | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None  # -1 or 0: off
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None  # 0: off
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # int64
    stop: Stop = None
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
    user: str = ""  # the OpenAI `user` field: the prefix-cache namespace when no API keys are configured


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
