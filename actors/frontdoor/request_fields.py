"""What every route's request body shares: the sampling fields (with the ranges of the bus's
`SamplingParams`), the per-token controls and their checks, and the decoding that turns msgspec's
complaints into an `Error` naming the field at fault.

The rule of every body the HTTP routes take: each field a Struct declares is honoured, or is
declared accepted-with-no-effect with the reason beside it (it carries no meaning for generation:
`metadata`, `store: false`, `service_tier`); every other field is refused with 400 naming it, the
fields of OpenAI's, vLLM's or SGLang's APIs that this server does not implement among them
(`NOT_IMPLEMENTED` says what to send instead). So every request Struct forbids unknown fields, and
/openapi.json, made from the same Structs, says `additionalProperties: false`.

Used by every route's body (openai_protocol, sglang_protocol, embedding_protocol, ...); no I/O.
"""

import re
from typing import Annotated, TypeVar

import msgspec

from actors.frontdoor.structured_output import (
    Choices,
    JsonSchema,
    ResponseFormat,
    StructuredOutputs,
    openai_constraint,
)
from schemas.errors import Error
from schemas.generate import (
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
    TopK,
    TopP,
)
from schemas.generate import TokenId as BusTokenId

Body = TypeVar("Body", bound=msgspec.Struct)

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
COMPONENT_REF = "#/components/schemas/{name}"  # where /openapi.json keeps the Structs' schemas
# A token id the scheduler checks against the vocabulary: openapi.py bounds it by the vocabulary
# the executor reports. (Stop token ids are not checked: one outside the vocabulary is never drawn.)
TokenId = Annotated[BusTokenId, msgspec.Meta(extra_json_schema={"x-token-id": True})]
TOKEN_ID_SCHEMA = msgspec.json.schema(TokenId)  # for schemas written by hand: lists msgspec cannot tell apart
# JSON keys are strings: a token id as its digits (the vocabulary is checked downstream).
TokenKey = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}$")]
IN_VOCABULARY = "token ids of the served model's vocabulary"
WINDOW = "with the prompt's tokens, within the model's context window"
StopRegexes = Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)]
REGEX = "Python regular expressions that compile"
GRAMMAR = "a constraint a tokenizer can compile (xgrammar's); one structured output field at most"
# Fields of OpenAI's, vLLM's and SGLang's APIs that this server does not implement, by their path
# (list indexes left out): refused as every unknown field is, with what to send instead.
NOT_IMPLEMENTED = {
    "functions": "OpenAI's deprecated functions: send `tools`",
    "function_call": "OpenAI's deprecated functions: send `tool_choice`",
    "suffix": "text insertion is not implemented",
    "best_of": "only one sequence is drawn per choice: send `n`",
    "reasoning_effort": 'send `chat_template_kwargs` {"enable_thinking": ...}',
    "messages.name": "the chat template receives no participant names",
    "sampling_params.structural_tag": "send `json_schema`, `regex` or `ebnf`",
    "session_params.offset": "a session continues after its parent turn's whole output",
    "session_params.drop_previous_output": "a session continues after its parent turn's whole output",
    "thinking.budget_tokens": 'thinking is not bounded on this server: send {"type": "adaptive"}',
    "previous_response_id": "this server keeps no responses: send the whole conversation in `input`",
    "reasoning.summary": "the thinking is given whole, never summarised",
    # SGLang's update-from-disk switches, taken only as false or null:
    "is_async": "every update is applied before the server answers",
    "keep_pause": "pause with /pause_generation before the update; an update leaves that pause in place",
    "manifest": "an update from disk loads the whole checkpoint of the directory",
    "lora_path": "LoRA adapters are not served",
    "custom_logit_processor": "custom logit processors are not run",
    "return_hidden_states": "hidden states are not returned",
}


def beyond_schema(rule: str) -> msgspec.Meta:
    """Marks a field with a rule JSON Schema cannot state (it needs the model, a compiler, or another
    field's value): /openapi.json says the rule in words, as `x-beyond-schema`, and the server's 400
    for a body the schema allows names such a field (tests/e2e/test_openapi_fuzz.py holds it to that)."""
    return msgspec.Meta(extra_json_schema={"x-beyond-schema": rule})


def exactly_one(*groups: tuple[str, ...]) -> msgspec.Meta:
    """For a body Struct: of each group of fields, exactly one is given and not null (a null counts
    as absent, as every optional field's null does), in /openapi.json as the server checks it."""
    rules = [
        {"oneOf": [{"required": [f], "properties": {f: {"not": {"type": "null"}}}} for f in group]} for group in groups
    ]
    return msgspec.Meta(extra_json_schema={"allOf": rules})


# A turn is named by its request id; the id of an OpenAI response is that with a prefix.
RESPONSE_ID_PREFIXES = ("chatcmpl-", "cmpl-")


class SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the OpenAI routes accept for sampling, with vLLM's extras; None means "the default".
    The ranges are those of `SamplingParams` (schemas/generate.py), so HTTP and the bus refuse the
    same values."""

    max_tokens: Annotated[TokenCount | None, beyond_schema(WINDOW)] = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    stop: StopString | StopStrings | None = None  # OpenAI takes one string or a list
    stop_token_ids: list[BusTokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    min_tokens: Count | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: Annotated[dict[TokenKey, Bias] | None, beyond_schema(IN_VOCABULARY)] = None  # token id -> bias
    allowed_token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)] | None = None  # never empty
    disallowed_token_ids: Annotated[
        list[TokenId] | None, beyond_schema("leaving a token to draw (one of allowed_token_ids, if given)")
    ] = None
    final_temperature: Temperature | None = None  # with temperature_schedule_tokens: a schedule
    temperature_schedule_tokens: Count | None = None
    stop_regex: Annotated[StopString | StopRegexes | None, beyond_schema(REGEX)] = None
    include_stop_str_in_output: bool | None = None
    # Structured output (structured_output.py): OpenAI's, then vLLM's newer and older fields; one at most.
    response_format: Annotated[ResponseFormat | None, beyond_schema(GRAMMAR)] = None
    structured_outputs: Annotated[StructuredOutputs | None, beyond_schema(GRAMMAR)] = None
    guided_json: Annotated[JsonSchema | str | None, beyond_schema(GRAMMAR)] = None  # a JSON schema, or its JSON text
    guided_regex: Annotated[str | None, beyond_schema(GRAMMAR)] = None
    guided_choice: Annotated[Choices | None, beyond_schema(GRAMMAR)] = None
    guided_grammar: Annotated[str | None, beyond_schema(GRAMMAR)] = None


def decode_body(body: bytes, struct_type: type[Body]) -> Body | Error:
    try:
        return msgspec.json.decode(body, type=struct_type)
    except msgspec.ValidationError as exc:
        if "got `float`" in str(exc):
            return _decode_integral(body, struct_type)
        return _with_choices(validation_error(str(exc)), struct_type)
    except msgspec.DecodeError as exc:
        return invalid(f"The request body is not valid JSON: {exc}")
    except RecursionError:
        return invalid("The request body is nested too deeply")


def _with_choices(error: Error, struct_type: type[Body]) -> Error:
    """A value outside a top-level field's choices: the error lists them."""
    if "Invalid enum value" not in error.message or not error.param:
        return error
    fields = msgspec.inspect.type_info(struct_type).fields
    kind = next((f.type for f in fields if f.encode_name == error.param), None)
    options = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
    choices = [v for t in options if isinstance(t, msgspec.inspect.LiteralType) for v in t.values]
    if not choices:
        return error
    listed = ", ".join(repr(choice) for choice in choices)
    return Error(error.code, f"{error.message} (one of {listed})", param=error.param)


def _decode_integral(body: bytes, struct_type: type[Body]) -> Body | Error:
    """JSON has one kind of number: `2.0` is the integer 2 to JSON Schema (and so to /openapi.json)
    and to clients that write every number as a float; msgspec wants `2`. The slow way, taken only
    when the fast one met a float."""
    try:
        return msgspec.convert(integral(msgspec.json.decode(body)), struct_type)
    except msgspec.ValidationError as exc:
        return validation_error(str(exc))
    except RecursionError:
        return invalid("The request body is nested too deeply")


def integral(value):
    """`value` with every float of no fraction an int (floats stay floats where a float is
    wanted: msgspec takes an int for a float)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(item) for item in value]
    if isinstance(value, dict):
        return {key: integral(item) for key, item in value.items()}
    return value


def validation_error(text: str, at: str = "") -> Error:
    """Rewrites msgspec's "Expected `int`, got `str` - at `$.max_tokens`" with the field as `param`;
    `at`: where in the body the decoded value was (a piece decoded on its own)."""
    detail, _, where = text.partition(" - at `")
    where = where.removeprefix("key` in `")  # a dict's key: the dict is the field at fault
    path = (at + where.removeprefix("$").rstrip("`").removesuffix("[...]")).lstrip(".")  # "[...]": a dict's value
    if detail.startswith("Object missing required field `"):
        field = ".".join(filter(None, (path, detail.removeprefix("Object missing required field `").rstrip("`"))))
        return invalid(f"`{field}` is required", field)
    if detail.startswith("Object contains unknown field `"):
        name = detail.removeprefix("Object contains unknown field `").rstrip("`")
        field = ".".join(filter(None, (path, name)))
        why = NOT_IMPLEMENTED.get(re.sub(r"\[\d+\]", "", field), "this route takes no such field (docs/api.md)")
        return invalid(f"`{field}` is not supported: {why}", field)
    if why := NOT_IMPLEMENTED.get(re.sub(r"\[\d+\]", "", path)):  # a field taken as its no-op value alone
        return invalid(f"`{path}` is not supported: {why}", path)
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


def logit_bias_ids(bias: dict[str, float] | None) -> dict[int, float]:
    """JSON keys are strings, decoded as `TokenKey`s: digits. Whether each is in the vocabulary,
    the scheduler checks (it knows the model)."""
    return {int(key): value for key, value in (bias or {}).items()}


def stop_regexes(patterns: str | list[str] | None, param: str = "stop_regex") -> list[str] | Error:
    """Compiled here, at the edge, so a bad pattern is the client's 400 and never a tokenizer's error."""
    patterns = [patterns] if isinstance(patterns, str) else patterns or []
    for pattern in patterns:
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            return invalid(f"stop_regex {pattern!r} is not a valid regular expression: {exc}", param)
    return patterns


def sampling_params(fields: SamplingFields, max_tokens: int | None) -> SamplingParams | Error:
    """Ranges were checked while decoding; here an absent or null field takes our default, and the
    checks that need more than a range are made."""
    default = SamplingParams()

    def given(value, fallback):
        return fallback if value is None else value

    regexes = stop_regexes(fields.stop_regex)
    guided = {
        "guided_json": fields.guided_json,
        "guided_regex": fields.guided_regex,
        "guided_choice": fields.guided_choice,
        "guided_grammar": fields.guided_grammar,
    }
    constraint = openai_constraint(fields.response_format, fields.structured_outputs, guided)
    for checked in (regexes, constraint):
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
        logit_bias=logit_bias_ids(fields.logit_bias),
        allowed_token_ids=fields.allowed_token_ids,
        disallowed_token_ids=given(fields.disallowed_token_ids, []),
        final_temperature=fields.final_temperature,
        temperature_schedule_tokens=given(fields.temperature_schedule_tokens, 0),
        stop_regex=regexes,
        include_stop_str_in_output=given(fields.include_stop_str_in_output, False),
        constraint=constraint,
    )
