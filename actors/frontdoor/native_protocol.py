"""The bodies of this server's own routes (`/admin/publish`, `POST /v1/sessions`). Our own API, so
unknown fields are refused by name. SGLang's native `/generate` is in `sglang_protocol`."""

import msgspec

from actors.frontdoor.request_fields import Body, decode_body, invalid
from schemas.errors import Error
from schemas.generate import GenerateRequest, TokenId
from schemas.session import IdleTimeout
from schemas.session import TokenCount as SessionTokens


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
