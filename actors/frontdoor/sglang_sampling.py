"""SGLang's `sampling_params` and logprob fields, mapped to our `SamplingParams`: SGLang's names
(`max_new_tokens`, `min_new_tokens`, `no_stop_trim`, `sampling_seed`) and defaults (128 new tokens;
top_k of -1, 0 or past any vocabulary is off), explicit nulls taken as the default. The rule of
every body (request_fields.py) holds: a key is honoured, accepted with no effect where marked so,
or refused naming it. No I/O.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.request_fields import (
    GRAMMAR,
    IN_VOCABULARY,
    REGEX,
    WINDOW,
    StopRegexes,
    TokenId,
    TokenKey,
    beyond_schema,
    logit_bias_ids,
    stop_regexes,
)
from actors.frontdoor.structured_output import JsonSchema, sglang_constraint
from schemas.errors import Error
from schemas.generate import (
    INT32_MAX,
    MAX_CHOICES,
    Bias,
    Count,
    MinP,
    Penalty,
    RepetitionPenalty,
    SamplingParams,
    Seed,
    StopString,
    StopStrings,
    Temperature,
    TopP,
)
from schemas.generate import TokenId as BusTokenId

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class SGLangSampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's `sampling_params`; absent and null both mean the default, except max_new_tokens."""

    # null: up to the context window
    max_new_tokens: Annotated[Count | None | msgspec.UnsetType, beyond_schema(WINDOW)] = msgspec.UNSET
    min_new_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: int | None = None  # -1, 0, or more than any vocabulary (1 << 30, say): no top-k filter
    min_p: MinP | None = None
    stop: StopString | StopStrings | None = None
    stop_token_ids: list[BusTokenId] | None = None  # never checked: one outside the vocabulary is never drawn
    stop_regex: Annotated[StopString | StopRegexes | None, beyond_schema(REGEX)] = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None  # keep the matched stop string in the text
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: Annotated[dict[TokenKey, Bias] | None, beyond_schema(IN_VOCABULARY)] = None
    sampling_seed: Seed | None = None
    seed: Seed | None = None  # an older name of sampling_seed
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] | None = None
    # This server's own, as on its OpenAI routes.
    allowed_token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)] | None = None  # never empty
    disallowed_token_ids: Annotated[list[TokenId] | None, beyond_schema("leaving a token to draw")] = None
    final_temperature: Temperature | None = None
    temperature_schedule_tokens: Count | None = None
    detokenize: bool | None = None  # false: token ids out and no text (schemas/generate.py)
    # vLLM's names: logprobs of the raw logits (the default), or of the distribution drawn from.
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] | None = None
    # Structured output: one of a JSON schema (its JSON text), a regex, or an EBNF grammar.
    json_schema: Annotated[str | JsonSchema | None, beyond_schema(GRAMMAR)] = None  # SGLang's: the JSON text
    regex: Annotated[str | None, beyond_schema(GRAMMAR)] = None
    ebnf: Annotated[str | None, beyond_schema(GRAMMAR)] = None
    # Decoding never puts spaces between special tokens (as the fast tokenizers decode them), so
    # false is what happens and true is refused.
    spaces_between_special_tokens: Literal[False] | None = None
    # No effect: SGLang hands these to a custom logit processor alone, and none is run here
    # (`custom_logit_processor` is refused); slime sends them whatever its processors.
    custom_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class LogprobAsk:
    """What one item asked of the logprobs, for the reply's `meta_info`."""

    return_logprob: bool = False
    start_len: int = -1  # prompt positions from here on; -1: none (the output's only)
    top_n: int = 0
    token_ids: list[int] | None = None
    return_text: bool = False


def sampling_params(s: SGLangSampling, ask: LogprobAsk) -> SamplingParams | Error:
    """Ours, from SGLang's names and defaults; the checks a range cannot make are made here."""
    regexes = stop_regexes(s.stop_regex, "sampling_params.stop_regex")
    constraint = sglang_constraint(s.json_schema, s.regex, s.ebnf)
    for checked in (regexes, constraint):
        if isinstance(checked, Error):
            return checked
    max_tokens = DEFAULT_MAX_NEW_TOKENS if s.max_new_tokens is msgspec.UNSET else s.max_new_tokens
    top_k = s.top_k if s.top_k is not None and 0 < s.top_k <= INT32_MAX else 0

    def given(value, fallback):
        return fallback if value is None else value

    scores_prompt = ask.return_logprob and ask.start_len >= 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=given(s.temperature, 1.0),
        top_p=given(s.top_p, 1.0),
        top_k=top_k,
        min_p=given(s.min_p, 0.0),
        seed=given(s.sampling_seed, s.seed),
        stop=[s.stop] if isinstance(s.stop, str) else given(s.stop, []),
        stop_token_ids=given(s.stop_token_ids, []),
        ignore_eos=given(s.ignore_eos, False),
        skip_special_tokens=given(s.skip_special_tokens, True),
        detokenize=given(s.detokenize, True),
        min_tokens=given(s.min_new_tokens, 0),
        presence_penalty=given(s.presence_penalty, 0.0),
        frequency_penalty=given(s.frequency_penalty, 0.0),
        repetition_penalty=given(s.repetition_penalty, 1.0),
        logit_bias=logit_bias_ids(s.logit_bias),
        allowed_token_ids=s.allowed_token_ids,
        disallowed_token_ids=given(s.disallowed_token_ids, []),
        final_temperature=s.final_temperature,
        temperature_schedule_tokens=given(s.temperature_schedule_tokens, 0),
        stop_regex=regexes,
        include_stop_str_in_output=given(s.no_stop_trim, False),
        logprobs=ask.return_logprob,
        top_logprobs=ask.top_n if ask.return_logprob else 0,
        prompt_logprobs_from=ask.start_len if scores_prompt else None,
        logprob_token_ids=(ask.token_ids or []) if ask.return_logprob else [],
        processed_logprobs=s.logprobs_mode == "processed_logprobs",
        constraint=constraint,
    )
