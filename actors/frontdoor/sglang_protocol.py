"""SGLang's native bodies in (`/generate`, `/abort_request`), our `GenerateRequest`s out.

Clients written for SGLang send what SGLang takes: one prompt or a batch (`text` or `input_ids`,
with per-item lists for the other fields), and explicit nulls, which mean the default. The rule of
every body (request_fields.py) holds here too: a key is honoured, or accepted with no effect where
marked so (`image_data: null`), or refused naming it, SGLang's keys this server does not implement
among them (`lora_path`, `return_hidden_states`, ...). The field meanings follow SGLang's
`GenerateReqInput` (python/sglang/srt/managers/io_struct.py). No I/O.
"""

import uuid
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from actors.frontdoor.request_fields import TOKEN_ID_SCHEMA, beyond_schema, decode_body, exactly_one, integral, invalid
from actors.frontdoor.sglang_sampling import LogprobAsk, SGLangSampling, sampling_params
from schemas.errors import Error
from schemas.generate import MAX_LOGPROB_TOKEN_IDS, MAX_TOP_LOGPROBS, GenerateRequest, SessionTurn, TokenId


class SessionParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's `session_params`: the prompt continues a session (POST /v1/sessions) from its turn
    `rid` (default: the latest), dropping the turns after it with `replace`."""

    id: str
    rid: str | None = None
    replace: bool | None = None


Text = Annotated[str, msgspec.Meta(min_length=1)]
_IDS = {"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1}
_ASKED_IDS = {"type": "array", "items": TOKEN_ID_SCHEMA, "maxItems": MAX_LOGPROB_TOKEN_IDS}
PER_ITEM = "a list gives one value per prompt of the batch"
# [int] or [[int]]: msgspec cannot tell two array types apart, so `_prompts` checks the lists.
InputIds = Annotated[list[Any], msgspec.Meta(min_length=1, extra_json_schema={"anyOf": [_IDS, {"items": _IDS}]})]
TopLogprobsNum = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_LOGPROBS)]
LogprobStart = Annotated[int, msgspec.Meta(ge=-1)]


class GenerateBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: Text | Annotated[list[Text], msgspec.Meta(min_length=1)] | None = None
    input_ids: InputIds | None = None
    rid: Annotated[Text | list[Text] | None, beyond_schema(PER_ITEM + "; ids differ")] = None
    sampling_params: Annotated[
        SGLangSampling | list[SGLangSampling] | None,
        beyond_schema(PER_ITEM + ", each with the same n; n is 1 with max_new_tokens 0"),
    ] = None
    return_logprob: Annotated[bool | list[bool] | None, beyond_schema(PER_ITEM)] = None
    logprob_start_len: Annotated[
        LogprobStart | list[LogprobStart] | None,
        beyond_schema(PER_ITEM + "; -1 (the output's logprobs only) or a position of the prompt"),
    ] = None
    top_logprobs_num: Annotated[TopLogprobsNum | list[TopLogprobsNum] | None, beyond_schema(PER_ITEM)] = None
    token_ids_logprob: Annotated[
        list[Any] | None,
        msgspec.Meta(extra_json_schema={"anyOf": [_ASKED_IDS, {"items": _ASKED_IDS}]}),
        beyond_schema("[ids] for every prompt, or [[ids]], one list per prompt of the batch"),
    ] = None
    return_text_in_logprobs: bool | None = None
    stream: bool | None = None
    cache_salt: Annotated[
        str | list[str] | None, beyond_schema(PER_ITEM + "; not with session_params: a session reads its own prefix")
    ] = None
    session_params: Annotated[SessionParams | None, beyond_schema("one prompt, not a batch")] = None
    # Accepted as null alone (AReaL sends it for text prompts): the models served read no images.
    image_data: None = None


# /openapi.json's body: the Struct and the rule its decoder cannot see.
GENERATE_BODY = Annotated[GenerateBody, exactly_one(("text", "input_ids"))]


class AbortBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rid: str | list[str] | None = ""
    abort_all: bool | None = False


@dataclass(frozen=True)
class GenerateItem:
    rid: str
    request: GenerateRequest
    logprob: LogprobAsk
    max_new_tokens: int | None


@dataclass(frozen=True)
class GenerateBatch:
    items: list[GenerateItem]
    single: bool  # one prompt and one choice: the reply is one object, not a list
    stream: bool = False
    choices: int = 1  # n: each item gives this many replies


def parse_generate_request(body: bytes) -> GenerateBatch | Error:
    req = decode_body(body, GenerateBody)
    if isinstance(req, Error):
        return req
    prompts = _prompts(req)
    if isinstance(prompts, Error):
        return prompts
    single = req.text is None or isinstance(req.text, str)
    if req.input_ids is not None:
        single = not isinstance(req.input_ids[0], list)
    count = len(prompts)
    per_item = {
        name: _per_item(getattr(req, name), count, name, default)
        for name, default in (
            ("rid", None),
            ("sampling_params", SGLangSampling()),
            ("return_logprob", False),
            ("logprob_start_len", -1),
            ("top_logprobs_num", 0),
            ("cache_salt", ""),
        )
    }
    for values in per_item.values():
        if isinstance(values, Error):
            return values
    rids = _rids(req.rid, per_item["rid"], count, single)
    token_ids = _token_ids_logprob(req.token_ids_logprob, count)
    session = _session(req.session_params, count)
    for checked in (rids, token_ids, session):
        if isinstance(checked, Error):
            return checked
    items = []
    for i, prompt in enumerate(prompts):
        sampling = per_item["sampling_params"][i]
        ask = LogprobAsk(
            bool(per_item["return_logprob"][i]),
            per_item["logprob_start_len"][i] if per_item["logprob_start_len"][i] is not None else -1,
            per_item["top_logprobs_num"][i] or 0,
            token_ids[i],
            bool(req.return_text_in_logprobs),
        )
        item = _item(rids[i], prompt, sampling, ask, per_item["cache_salt"][i] or "", session, bool(req.stream))
        if isinstance(item, Error):
            return item
        items.append(item)
    choices = {item.request.n for item in items}
    if len(choices) > 1:
        return invalid("every item of a batch must ask for the same n", "sampling_params.n")
    (n,) = choices
    return GenerateBatch(items, single and n == 1, bool(req.stream), n)


def parse_abort_request(body: bytes) -> AbortBody | Error:
    return decode_body(body, AbortBody) if body.strip() else AbortBody()


def _prompts(req: GenerateBody) -> list[str] | list[list[int]] | Error:
    if (req.text is None) == (req.input_ids is None):
        return invalid("give exactly one of text and input_ids", "text")
    if req.text is not None:
        return [req.text] if isinstance(req.text, str) else req.text
    ids = req.input_ids
    batch = ids if isinstance(ids[0], list) else [ids]
    try:
        prompts = _token_lists(batch)
    except msgspec.ValidationError as exc:
        detail, _, where = str(exc).partition(" - at `$")
        return invalid(f"input_ids must be token ids, or a list of such lists: {detail}", f"input_ids{where[:-1]}")
    if not all(prompts):
        return invalid("a prompt of the batch is empty", "input_ids")
    return prompts


def _token_lists(batch: list) -> list[list[int]]:
    """`batch` as lists of token ids; msgspec.ValidationError if it is none. Ids written as floats
    of no fraction (2.0) are ids too: the slow walk over every id is taken only for them."""
    try:
        return msgspec.convert(batch, list[list[TokenId]])
    except msgspec.ValidationError as exc:
        if "got `float`" not in str(exc):
            raise
        return msgspec.convert(integral(batch), list[list[TokenId]])


def _per_item(value, count: int, param: str, default) -> list | Error:
    """A field given once for every item, or as a list with one value per item."""
    if value is None:
        return [default] * count
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        return invalid(f"{param} has {len(value)} values for a batch of {count}", param)
    return value


def _rids(rid: str | list[str] | None, given: list, count: int, single: bool) -> list[str] | Error:
    """SGLang's ids: as given; one string for a batch names item i `<rid>_<i>`; none: new ones."""
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(count)]
    elif isinstance(rid, str):
        rids = [rid] if single else [f"{rid}_{i}" for i in range(count)]
    else:
        rids = given
    if len(set(rids)) != len(rids):
        return invalid("the rids of a batch must differ", "rid")
    return rids


def _token_ids_logprob(value: list | None, count: int) -> list[list[int] | None] | Error:
    if not value:
        return [None] * count
    lists = value if isinstance(value[0], list) else [value] * count
    if len(lists) != count:
        return invalid(f"token_ids_logprob has {len(lists)} lists for a batch of {count}", "token_ids_logprob")
    try:
        checked = msgspec.convert(
            integral(lists), list[Annotated[list[TokenId], msgspec.Meta(max_length=MAX_LOGPROB_TOKEN_IDS)]]
        )
    except msgspec.ValidationError as exc:
        return invalid(f"token_ids_logprob must be token ids: {exc}", "token_ids_logprob")
    return [ids or None for ids in checked]


def _session(params: SessionParams | None, count: int) -> SessionTurn | None | Error:
    if params is None:
        return None
    if count > 1:
        return invalid("a batch cannot continue a session", "session_params")
    return SessionTurn(params.id, params.rid, bool(params.replace))


def _item(
    rid: str,
    prompt: str | list[int],
    sampling: SGLangSampling,
    ask: LogprobAsk,
    cache_salt: str,
    session: SessionTurn | None,
    stream: bool,
) -> GenerateItem | Error:
    if isinstance(prompt, list) and ask.return_logprob and ask.start_len >= len(prompt):
        return invalid(f"logprob_start_len {ask.start_len} is past the prompt's last token", "logprob_start_len")
    params = sampling_params(sampling, ask)
    if isinstance(params, Error):
        return params
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
    request = GenerateRequest(
        text=text,
        input_ids=ids,
        params=params,
        stream=stream,
        n=sampling.n or 1,
        session=session,
        cache_salt=cache_salt,
    )
    return GenerateItem(rid, request, ask, params.max_tokens)
