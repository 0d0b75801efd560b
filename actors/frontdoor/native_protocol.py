"""The bodies of this server's own routes (`/admin/publish`, `/admin/flush_cache`, `POST /v1/sessions`), under the rule
of every body (request_fields.py): unknown fields are refused by name. SGLang's native `/generate`
is in `sglang_protocol`."""

from typing import Annotated

import msgspec

from actors.frontdoor.request_fields import decode_body, exactly_one, invalid
from schemas.admin import FlushTier
from schemas.errors import Error
from schemas.generate import GenerateRequest, TokenId
from schemas.session import IdleTimeout
from schemas.session import TokenCount as SessionTokens


class PublishBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`POST /admin/publish`: a prefix every tenant may read from the cache."""

    text: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    input_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)] | None = (
        None  # not checked: such a prefix is never met
    )


PUBLISH_BODY = Annotated[PublishBody, exactly_one(("text", "input_ids"))]  # as /openapi.json says it


def parse_publish_request(body: bytes) -> GenerateRequest | Error:
    """The prefix as a prompt to encode (text is encoded as a completions prompt is)."""
    req = decode_body(body, PublishBody)
    if isinstance(req, Error):
        return req
    if (req.text is None) == (req.input_ids is None):
        return invalid("give exactly one of text and input_ids", "text")
    return GenerateRequest(text=req.text, input_ids=req.input_ids)


class FlushBody(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /admin/flush_cache`, optional: the tier to empty ("gpu" without a body, as before tiers)."""

    tier: FlushTier = "gpu"


def parse_flush_body(body: bytes) -> FlushBody | Error:
    return decode_body(body, FlushBody) if body.strip() else FlushBody()


class SessionBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v1/sessions, all of it optional."""

    capacity_tokens: SessionTokens | None = None  # most KV tokens kept pinned for it; default: the global budget
    idle_timeout_s: IdleTimeout | None = None  # it closes itself after this long unused; default: 600
    user: str | None = None  # as in completions: the tenant without API keys, a narrower scope with them


def parse_session_body(body: bytes) -> SessionBody | Error:
    return decode_body(body, SessionBody) if body.strip() else SessionBody()
