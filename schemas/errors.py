"""The one error shape that crosses process boundaries.

Every request on the bus is answered with its typed reply or an `Error`; the frontdoor maps
`code` to an HTTP status, so the code names the kind of failure, not the actor that saw it.
"""

import msgspec

# The codes in use, with the HTTP status the frontdoor gives each.
HTTP_STATUS = {
    "invalid_request": 400,
    "context_length_exceeded": 400,
    "unauthorized": 401,
    "not_found": 404,
    "payload_too_large": 413,
    "overloaded": 429,
    "internal": 500,
    "unavailable": 503,
    "timeout": 504,
}


class Error(msgspec.Struct, frozen=True, tag="error"):
    code: str
    message: str
    retriable: bool = False
    param: str | None = None  # the request field at fault, when one is

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)
