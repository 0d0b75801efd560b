"""The public generation API: what a client sends on `<ns>.generate` and what comes back.

The HTTP frontdoor translates OpenAI requests into these same messages, so the bus API and HTTP
share one pipeline. A streaming request gets `GenerateChunk`s at its reply inbox, in order, then
one `GenerateResult` (or an `Error`).
"""

from typing import Annotated, Any, Literal

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
Count = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
TopK = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]  # -1 or 0: no top-k filter
MinP = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # int64
StopString = Annotated[str, msgspec.Meta(min_length=1)]
StopStrings = Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)]
MAX_TOP_LOGPROBS = 20
MAX_LOGPROB_TOKEN_IDS = 64
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0.0, le=10.0)]
Bias = Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]
MAX_CONSTRAINT_CHARS = 1 << 20


class Constraint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Structured output: every token drawn keeps the output a prefix of a sentence of this language
    (xgrammar's masks), and the request ends with "stop" once the sentence is whole and the model
    draws its end (EOS), or when nothing may follow. A tokenizer checks it when the request arrives
    (an `Error` naming `param`); the executor compiles it for the served vocabulary."""

    # json_schema: `text` is a JSON schema (JSON text), followed strictly (no properties it does not
    # name), written on one line with ", " and ": " between items; json_object: any JSON object, so
    # written (no `text`); regex: `text` is a regular expression the whole output matches; grammar:
    # `text` is an EBNF grammar in xgrammar's dialect (`root ::= ...`), or a Lark grammar when it has
    # no `::=`; structural_tag: `text` is an xgrammar structural tag (JSON): a demanded tool call in
    # its model family's own text, each call's arguments under its tool's schema.
    kind: Literal["json_schema", "json_object", "regex", "grammar", "structural_tag"]
    text: Annotated[str, msgspec.Meta(max_length=MAX_CONSTRAINT_CHARS)] = ""
    param: str = "params.constraint"  # the request field it came from, which an error about it names


# Fields at their defaults stay off the wire, so a request that leaves a new field alone still
# reaches an actor of an older build, which refuses fields it does not know. Building one in Python
# checks no range (msgspec checks on decoding): build them from decoded values.
class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    # None: up to the end of the context window; 0: none, the prompt alone is computed (scoring,
    # with prompt logprobs)
    max_tokens: Count | None = 16
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

    # Per-token controls, applied on the device to the whole batch before the draw.
    min_tokens: Count = 0  # the end tokens (EOS, stop_token_ids) cannot be drawn before this many outputs
    presence_penalty: Penalty = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: Penalty = 0.0  # subtracted per occurrence among the generated tokens
    # Divides a positive logit (multiplies a negative one) of every token in the prompt or generated
    repetition_penalty: RepetitionPenalty = 1.0
    logit_bias: dict[TokenId, Bias] = {}  # added to those tokens' logits
    allowed_token_ids: list[TokenId] | None = None  # only these may be drawn (an action mask); never empty
    disallowed_token_ids: list[TokenId] = []  # never drawn
    # A temperature schedule: from `temperature` at the first output to `final_temperature` at output
    # `temperature_schedule_tokens`, linearly, and `final_temperature` after. None: constant.
    final_temperature: Temperature | None = None
    temperature_schedule_tokens: Count = 0
    stop_regex: Annotated[list[StopString], msgspec.Meta(max_length=MAX_STOP_STRINGS)] = []  # Python regexes
    include_stop_str_in_output: bool = False  # keep a matched stop string (or regex match) in the text
    constraint: Constraint | None = None  # structured output: the tokens drawn follow this grammar

    # Logprobs. By default of the model's own distribution (log-softmax of the raw logits; under a
    # constraint, of those the grammar allows, as vLLM gives them); `processed_logprobs`: of the one
    # drawn from, after the controls above, temperature and filters.
    logprobs: bool = False  # the logprob of each generated token
    top_logprobs: TopLogprobs = 0  # and this many most likely alternatives (at prompt positions too)
    # Logprobs of the prompt's tokens from this position on (0 and 1: all but the first, which has none).
    prompt_logprobs_from: Count | None = None
    logprob_token_ids: Annotated[
        list[TokenId], msgspec.Meta(max_length=MAX_LOGPROB_TOKEN_IDS)
    ] = []  # at every position
    processed_logprobs: bool = False


class ToolCallFunction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    # Decoded from OpenAI's JSON string, as chat templates read arguments (`arguments | tojson`).
    arguments: Any


class ChatToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A call an assistant turn made, in OpenAI's shape."""

    id: str
    function: ToolCallFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    role: str  # system, user, assistant or tool
    content: str
    tool_calls: list[ChatToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's result: the call it answers


# What apply_chat_template takes for itself: a template kwarg may not stand in for one.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class FunctionChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionChoice


# OpenAI's `tool_choice`: "none" offers no tools and reads no calls; "auto" offers them and reads the
# calls the model makes; "required" or a named function (one of the tools) demands a call, decoded
# under a grammar so that it parses and its arguments match the tool's `parameters`.
ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatTemplateArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A chat's tools and the template's variables. What the template renders beside the messages,
    as transformers' apply_chat_template takes it: the function tools (OpenAI's `tools`, each
    `{"type": "function", "function": {"name", "description", "parameters"}}`) and the template's own
    variables (`chat_template_kwargs`, e.g. `enable_thinking`). `tool_choice` and
    `parallel_tool_calls` mean what they mean over HTTP: the door that takes the request reads them
    (actors/lib/chat_tools.py) into the tools the template shows, how the reply is read and a
    demanded call's grammar (`SamplingParams.constraint`), so what goes on downstream has them unset."""

    tools: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    tool_choice: ToolChoice | None = None  # None: "auto"
    parallel_tool_calls: bool = True  # False: only a reply's first call is kept (and demanded)


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
    # Separates prefix caching: a request reads cached prefixes only of requests with the same salt
    # (and tenant); a salted request never reads public prefixes.
    cache_salt: str = ""
    chat_template: ChatTemplateArgs | None = None  # with `messages`: the tools and template variables


class AbortGenerate(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="abort"):
    """Sent on the subject of the requests it aborts (`<ns>.generate`, or with API keys the tenant's
    own): each ends with finish_reason "abort", every token it generated and their logprobs.
    Answered with `schemas.requests.Aborted`. Give `request_id` or `abort_all`."""

    request_id: str | None = None  # a GenerateRequest's request_id: all its n choices
    abort_all: bool = False  # every request of the tenant (without API keys, every request)


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """Logprobs at consecutive positions, compactly: entry i is the token at position `start + i`
    (of the outputs, or of the prompt). Empty lists where not asked for."""

    start: int
    logprobs: list[float]  # [N] each token's logprob
    top_ids: list[list[int]] = []  # [N][top_logprobs] the most likely tokens, most likely first
    top_logprobs: list[list[float]] = []  # [N][top_logprobs] their logprobs
    id_logprobs: list[list[float]] = []  # [N][len(logprob_token_ids)] the logprobs of the asked ids


class ChatToolCallDelta(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A piece of a streamed tool call: a call's first piece has its `id` and `name`, the later ones
    fragments of its arguments' JSON text, which joined in order make the whole."""

    index: int  # the call's place among the reply's calls
    id: str | None = None
    name: str | None = None
    arguments: str = ""


# A chat request (`messages`) has its reply read as the HTTP chat route reads it, when the server
# reads something out of it (the tools of `chat_template`, or --reasoning-parser): `text` is then
# the answer alone, the thinking is in `reasoning_content` and the calls in `tool_calls`;
# `token_ids` are still every token drawn.
class GenerateChunk(msgspec.Struct, frozen=True, tag="chunk"):
    request_id: str
    sequence: int  # 0, 1, 2... over all choices, so a client can check that nothing was lost or repeated
    token_ids: list[int]
    text: str
    index: int = 0  # the choice
    logprobs: TokenLogprobs | None = None  # of token_ids, when asked for
    weight_version: str = "default"  # of the weights that computed token_ids
    reasoning_content: str = ""  # chat: the thinking that came with these tokens
    tool_calls: list[ChatToolCallDelta] = []  # chat: pieces of calls that came with these tokens


class GenerateResult(msgspec.Struct, frozen=True, tag="result"):
    request_id: str
    text: str
    token_ids: list[int]
    # "stop", "length" or "abort" (token_ids: every token generated before the abort); "tool_calls"
    # for a chat reply that called and ended by itself
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    index: int = 0  # the choice; a request with n choices ends after n results
    logprobs: TokenLogprobs | None = None  # of every token in token_ids, when asked for
    prompt_logprobs: TokenLogprobs | None = None  # from `prompt_logprobs_from`, when asked for
    prompt_ids: list[int] = []  # the prompt's tokens, when logprobs of the prompt were asked for
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    created: float = 0.0  # when the request was received, in seconds since the epoch
    weight_version: str = "default"  # of the weights that computed the last token
    # [[first output index, version], ...]: output tokens from each index on, up to the next span's,
    # were computed by that version's weights (more than one span when weights changed mid-request).
    version_spans: list[tuple[int, str]] = []
    reasoning_content: str = ""  # chat: the reply's thinking
    # chat: the reply's calls, `arguments` decoded from the JSON the model wrote (so the calls go back
    # in the next request's assistant message as they are); a call cut short (finish_reason
    # "length") keeps the text it got as a string
    tool_calls: list[ChatToolCall] = []


GenerateReply = GenerateChunk | GenerateResult | Error
BusRequest = GenerateRequest | AbortGenerate  # what `<ns>.generate` takes
