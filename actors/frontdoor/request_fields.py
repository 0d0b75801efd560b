"""What every route's request body shares: the sampling fields (with the ranges of the bus's
`SamplingParams`), the per-token controls and their checks, and the decoding that turns msgspec's
complaints into an `Error` naming the field at fault.

Used by the OpenAI routes (openai_protocol) and SGLang's (sglang_protocol); no I/O.
"""

import re
from typing import Annotated, Any, TypeVar

import msgspec

from actors.frontdoor.structured_output import ResponseFormat, StructuredOutputs, openai_constraint
from schemas.errors import Error
from schemas.generate import (
    INT32_MAX,
    MAX_STOP_STRINGS,
    Bias,
    Count,
    MinP,
    Penalty,
    RepetitionPenalty,
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
StopRegexes = Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)]


class SamplingFields(msgspec.Struct, kw_only=True):
    """What the OpenAI routes accept for sampling, with vLLM's extras; None means "the default".
    The ranges are those of `SamplingParams` (schemas/generate.py), so HTTP and the bus refuse the
    same values."""

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
    min_tokens: Count | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, Bias] | None = None  # token id (as JSON keys are strings) -> bias
    allowed_token_ids: list[TokenId] | None = None
    disallowed_token_ids: list[TokenId] | None = None
    final_temperature: Temperature | None = None  # with temperature_schedule_tokens: a schedule
    temperature_schedule_tokens: Count | None = None
    stop_regex: StopString | StopRegexes | None = None
    include_stop_str_in_output: bool | None = None
    # Structured output (structured_output.py): OpenAI's, then vLLM's newer and older fields; one at most.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: Any = None  # a JSON schema, as an object or as its JSON text
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


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
    path = path.rstrip("`").lstrip(".").removesuffix("[...]")  # "[...]": a value of a dict
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


def logit_bias_ids(bias: dict[str, float] | None, param: str = "logit_bias") -> dict[int, float] | Error:
    """JSON keys are strings: each must be a token id. Whether it is in the vocabulary, the
    scheduler checks (it knows the model)."""
    ids = {}
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit() and int(key) <= INT32_MAX):
            return invalid(f"logit_bias keys must be token ids, not {key!r}", param)
        ids[int(key)] = value
    return ids


def stop_regexes(patterns: str | list[str] | None, param: str = "stop_regex") -> list[str] | Error:
    """Compiled here, at the edge, so a bad pattern is the client's 400 and never a tokenizer's error."""
    patterns = [patterns] if isinstance(patterns, str) else patterns or []
    for pattern in patterns:
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            return invalid(f"stop_regex {pattern!r} is not a valid regular expression: {exc}", param)
    return patterns


def allowed_ids(ids: list[int] | None, param: str = "allowed_token_ids") -> list[int] | None | Error:
    if ids is not None and not ids:
        return invalid("allowed_token_ids must not be empty: nothing could be drawn", param)
    return ids


def sampling_params(fields: SamplingFields, max_tokens: int | None) -> SamplingParams | Error:
    """Ranges were checked while decoding; here an absent or null field takes our default, and the
    checks that need more than a range are made."""
    default = SamplingParams()

    def given(value, fallback):
        return fallback if value is None else value

    bias = logit_bias_ids(fields.logit_bias)
    regexes = stop_regexes(fields.stop_regex)
    allowed = allowed_ids(fields.allowed_token_ids)
    guided = {
        "guided_json": fields.guided_json,
        "guided_regex": fields.guided_regex,
        "guided_choice": fields.guided_choice,
        "guided_grammar": fields.guided_grammar,
    }
    constraint = openai_constraint(fields.response_format, fields.structured_outputs, guided)
    for checked in (bias, regexes, allowed, constraint):
        if isinstance(checked, Error):
            return checked
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
        min_tokens=given(fields.min_tokens, 0),
        presence_penalty=given(fields.presence_penalty, 0.0),
        frequency_penalty=given(fields.frequency_penalty, 0.0),
        repetition_penalty=given(fields.repetition_penalty, 1.0),
        logit_bias=bias,
        allowed_token_ids=allowed,
        disallowed_token_ids=given(fields.disallowed_token_ids, []),
        final_temperature=fields.final_temperature,
        temperature_schedule_tokens=given(fields.temperature_schedule_tokens, 0),
        stop_regex=regexes,
        include_stop_str_in_output=given(fields.include_stop_str_in_output, False),
        constraint=constraint,
    )
