"""Sessions for multi-turn work: opening and closing them, and the turns an origin runs in one.

The scheduler owns the sessions table. Anyone may open and close a session on the public
`<ns>.sessions` (with API keys, a tenant on `<ns>.sessions.<tenant>`); the frontdoor passes its
HTTP clients' on the scheduler's request subject (`AsTenant`). The turns come from the origins
(the frontdoor, the gateway) on that subject too: `BeginTurn` before a turn's request is
submitted, to learn what its prompt continues, and `RecordTurn` when it has finished, with exactly
the tokens its client got.
A session unknown to the scheduler, or opened by another tenant, is answered `Error("not_found")`.
"""

from typing import Annotated

import msgspec

from schemas.errors import Error
from schemas.requests import Tenant

MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600.0
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
IdleTimeout = Annotated[float, msgspec.Meta(gt=0, le=MAX_IDLE_TIMEOUT_S)]


class OpenSession(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="open_session"):
    user: str = (
        ""  # as `GenerateRequest.user`: the tenant, or with API keys a narrower one; only its requests may use it
    )
    capacity_tokens: TokenCount | None = None  # most KV tokens kept pinned for it; None: the global budget
    idle_timeout_s: IdleTimeout | None = None  # it closes itself after this long unused; None: the default


class SessionOpened(msgspec.Struct, frozen=True, tag="session_opened"):
    session_id: str
    capacity_tokens: int  # as granted: never more than the budget all sessions share
    idle_timeout_s: float


class CloseSession(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="close_session"):
    session_id: str
    user: str = ""


class SessionClosed(msgspec.Struct, frozen=True, tag="session_closed"):
    session_id: str


class AsTenant(msgspec.Struct, frozen=True, tag="as_tenant"):
    """A client's `OpenSession` or `CloseSession` as the frontdoor passes it on, with the tenant it
    took from the API key: the scheduler reads the tenant from here, not from `request.user`."""

    tenant: Tenant
    request: OpenSession | CloseSession


class BeginTurn(msgspec.Struct, frozen=True, tag="begin_turn"):
    """A turn is about to be submitted as request `turn_id`: what does its prompt continue?"""

    session_id: str
    tenant: Tenant  # the tenant of the turn's request: only the session's own may take a turn
    turn_id: str  # the request id of the new turn, which names it from now on
    parent_turn: str | None = None  # the turn it continues; None: the session's latest


class TurnTokens(msgspec.Struct, frozen=True, tag="turn_tokens"):
    """The tokens the new turn's prompt starts with: the parent's prompt and output."""

    session_id: str
    parent_turn: str | None  # as resolved; None when the session has no turns yet
    token_ids: list[int]


class RecordTurn(msgspec.Struct, frozen=True, tag="record_turn"):
    """A turn finished: `token_ids` is its prompt and the output its client received."""

    session_id: str
    tenant: Tenant
    turn_id: str
    parent_turn: str | None  # as `TurnTokens` resolved it
    replace: bool  # drop the turns that came after the parent first (the branch this one replaces)
    token_ids: list[int]


class TurnRecorded(msgspec.Struct, frozen=True, tag="turn_recorded"):
    session_id: str
    turn_id: str


PublicSessionRequest = OpenSession | CloseSession  # on `<ns>.sessions`
SessionRequest = AsTenant | BeginTurn | RecordTurn  # on the scheduler's request subject
SessionReply = SessionOpened | SessionClosed | TurnTokens | TurnRecorded | Error
