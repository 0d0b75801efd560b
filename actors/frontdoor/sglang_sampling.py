"""SGLang's `sampling_params` and logprob fields, mapped to our `SamplingParams`: SGLang's names
(`max_new_tokens`, `min_new_tokens`, `no_stop_trim`, `sampling_seed`) and defaults (128 new tokens;
top_k of -1, 0 or past any vocabulary is off), explicit nulls taken as the default. No I/O.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.request_fields import StopRegexes, allowed_ids, invalid, logit_bias_ids, stop_regexes
from actors.frontdoor.structured_output import sglang_constraint
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
    TokenId,
    TopP,
)

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class SGLangSampling(msgspec.Struct, kw_only=True):
    """SGLang's `sampling_params`; absent and null both mean the default, except max_new_tokens."""

    max_new_tokens: Count | None | msgspec.UnsetType = msgspec.UNSET  # null: up to the context window
    min_new_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: int | None = None  # -1, 0, or more than any vocabulary (1 << 30, say): no top-k filter
    min_p: MinP | None = None
    stop: StopString | StopStrings | None = None
    stop_token_ids: list[TokenId] | None = None
    stop_regex: StopString | StopRegexes | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None  # keep the matched stop string in the text
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, Bias] | None = None
    sampling_seed: Seed | None = None
    seed: Seed | None = None  # an older name of sampling_seed
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHOICES)] | None = None
    # This server's own, as on its OpenAI routes.
    allowed_token_ids: list[TokenId] | None = None
    disallowed_token_ids: list[TokenId] | None = None
    final_temperature: Temperature | None = None
    temperature_schedule_tokens: Count | None = None
    detokenize: bool | None = None  # false: token ids out and no text (schemas/generate.py)
    # vLLM's names: logprobs of the raw logits (the default), or of the distribution drawn from.
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] | None = None
    # Structured output: one of a JSON schema (its JSON text), a regex, or an EBNF grammar. SGLang's
    # structural_tag is refused when given.
    json_schema: str | dict[str, Any] | None = None  # SGLang's is the schema's JSON text
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: Any = None


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
    if s.structural_tag is not None:
        return invalid("structural_tag is not supported", "sampling_params.structural_tag")
    bias = logit_bias_ids(s.logit_bias, "sampling_params.logit_bias")
    regexes = stop_regexes(s.stop_regex, "sampling_params.stop_regex")
    allowed = allowed_ids(s.allowed_token_ids, "sampling_params.allowed_token_ids")
    constraint = sglang_constraint(s.json_schema, s.regex, s.ebnf)
    for checked in (bias, regexes, allowed, constraint):
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
        logit_bias=bias,
        allowed_token_ids=allowed,
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
