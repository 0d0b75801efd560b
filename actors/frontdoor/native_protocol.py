"""The native request bodies (`/generate`, `/admin/publish`, `POST /v1/sessions`) in, our
`GenerateRequest` out. Our own API, so unknown fields are refused by name."""

import msgspec

from actors.frontdoor.request_fields import (
    Body,
    Id,
    ParsedRequest,
    SamplingFields,
    decode_body,
    invalid,
    sampling_params,
    session_turn,
)
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams, TokenCount, TokenId
from schemas.session import IdleTimeout
from schemas.session import TokenCount as SessionTokens


class NativeSampling(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    max_new_tokens: TokenCount | None = None  # SGLang's name for max_tokens
    detokenize: bool = True  # false: token ids out and no text, as vLLM's parameter (schemas/generate.py)


class GenerateBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The native `/generate` body. Our own API, so an unknown field is a mistake worth naming."""

    text: str | None = None
    input_ids: list[TokenId] | None = None
    sampling_params: NativeSampling = msgspec.field(default_factory=NativeSampling)
    stream: bool = False
    session_id: Id | None = None  # as in OpenAIFields
    session_parent: Id | None = None
    session_replace: bool = False


class PublishBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`POST /admin/publish`: a prefix every tenant may read from the cache."""

    text: str | None = None
    input_ids: list[TokenId] | None = None


def parse_publish_request(body: bytes) -> GenerateRequest | Error:
    """The prefix as a prompt to encode (text is encoded as a completions prompt is)."""
    req = _decode_tokens_body(body, PublishBody, "prefix")
    if isinstance(req, Error):
        return req
    return GenerateRequest(text=req.text, input_ids=req.input_ids)


def _decode_tokens_body(body: bytes, struct_type: type[Body], what: str) -> Body | Error:
    """Decodes a native body, which gives its tokens (the `what`) as text or as ids: exactly one,
    and not empty."""
    req = decode_body(body, struct_type)
    if isinstance(req, Error):
        return req
    if (req.text is None) == (req.input_ids is None):
        return invalid("give exactly one of text and input_ids", "text")
    if not (req.text or req.input_ids):
        return invalid(f"the {what} is empty", "text" if req.text is not None else "input_ids")
    return req


class SessionBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v1/sessions, all of it optional."""

    capacity_tokens: SessionTokens | None = None  # most KV tokens kept pinned for it; default: the global budget
    idle_timeout_s: IdleTimeout | None = None  # it closes itself after this long unused; default: 600
    user: str | None = None  # as in completions: the tenant without API keys, a narrower scope with them


def parse_session_body(body: bytes) -> SessionBody | Error:
    return decode_body(body, SessionBody) if body.strip() else SessionBody()


def parse_generate_request(body: bytes) -> ParsedRequest | Error:
    req = _decode_tokens_body(body, GenerateBody, "prompt")
    if isinstance(req, Error):
        return req
    sampling = req.sampling_params
    if sampling.max_tokens is not None and sampling.max_new_tokens not in (None, sampling.max_tokens):
        return invalid("give max_new_tokens or max_tokens, not both", "sampling_params.max_new_tokens")
    # The bus API's default, so one prompt behaves the same on either door.
    max_tokens = sampling.max_new_tokens or sampling.max_tokens or SamplingParams().max_tokens
    session = session_turn(req.session_id, req.session_parent, req.session_replace)
    if isinstance(session, Error):
        return session
    params = msgspec.structs.replace(sampling_params(sampling, max_tokens), detokenize=sampling.detokenize)
    request = GenerateRequest(
        text=req.text,
        input_ids=req.input_ids,
        params=params,
        stream=req.stream,
        session=session,
    )
    return ParsedRequest("generate", request, include_usage_in_stream=False)
