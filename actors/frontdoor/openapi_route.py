"""One entry of /openapi.json's route list: a route's body (the Struct that parses it), its query
and path parameters, and the answers it gives, with their statuses and media types.
openapi_inference_routes.py and openapi_control_routes.py hold the entries; openapi.py renders them.
"""

from dataclasses import dataclass
from typing import Any

JSON = "application/json"


@dataclass(frozen=True)
class Parameter:
    """A query parameter, or a path one (`where`)."""

    name: str
    schema: dict
    description: str
    required: bool = False
    where: str = "query"  # or "path"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    ok: str  # what a 200 answers
    media: tuple[str, ...] = (JSON,)  # of the 200; () for an empty body
    body: Any = None  # the type that parses the body (a Struct, or Annotated with the rules it cannot see)
    body_required: bool = True
    errors: tuple[int, ...] = ()
    parameters: tuple[Parameter, ...] = ()
    ok_schema: Any = None  # the 200's body as a type, where one Struct gives it
    anthropic_errors: bool = False  # errors in Anthropic's shape, not OpenAI's
    # A rule of the server's state, not of the body (its 400 names no field): `x-beyond-schema`.
    rule: str | None = None
