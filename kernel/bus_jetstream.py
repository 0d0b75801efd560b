"""What JetStream's key-value buckets (kernel/bus_kv.py) and object buckets (kernel/bus_objects.py)
share: their errors, which are never nats exceptions, and the raw API calls both make where
nats-py's own helpers fall short."""

import json

import nats.errors
import nats.js.errors
from nats.aio.client import Client

REQUEST_TIMEOUT_S = 5.0  # of one JetStream API call; a healthy server answers in milliseconds
JS_API = "$JS.API"  # JetStream's API subjects without a domain, as nc.jetstream() uses them


class JetStreamError(Exception):
    """A bucket operation that failed: the server refused it, or did not answer in time."""


class JetStreamUnavailable(JetStreamError):
    """JetStream cannot be reached now: the server has none, or the connection is closed."""


class NoJetStream(JetStreamUnavailable):
    """The NATS server has no JetStream at all (started without `-js`)."""


async def api_call(nc: Client, call: str, request: dict, what: str) -> dict:
    """A JetStream API call's JSON reply; raises `JetStreamError` where it failed. `what` says
    what was being done, for the error."""
    try:
        message = await nc.request(f"{JS_API}.{call}", json.dumps(request).encode(), REQUEST_TIMEOUT_S)
        reply = json.loads(message.data)
    except (nats.errors.Error, TimeoutError, ValueError) as exc:
        raise jetstream_error(f"cannot {what}", exc) from None
    if (error := reply.get("error")) is not None:
        raise JetStreamError(f"cannot {what}: {error.get('description', error)}")
    return reply


async def stream_subjects(nc: Client, stream: str, prefix: str, what: str) -> list[str]:
    """The subjects under `prefix` (which ends with a dot) that `stream` holds a message of, read
    from the stream's own books (STREAM.INFO with a subjects filter, page by page): a consumer's
    replay, which nats-py's listings follow, can end before it has delivered everything."""
    subjects: list[str] = []
    while True:
        request = {"subjects_filter": f"{prefix}>", "offset": len(subjects)}
        info = await api_call(nc, f"STREAM.INFO.{stream}", request, what)
        page = (info.get("state") or {}).get("subjects") or {}
        subjects += list(page)
        # A server pages past its limit of subjects a reply (`total` counts them all).
        if not page or len(subjects) >= info.get("total", 0):
            return subjects


def jetstream_error(what: str, exc: Exception) -> JetStreamError:
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.errors.NoRespondersError):
        return NoJetStream(f"{what}: the NATS server has no JetStream (start it with -js)")
    if isinstance(exc, nats.errors.ConnectionClosedError):
        return JetStreamUnavailable(f"{what}: the bus connection is closed")
    return JetStreamError(f"{what}: {exc!r}")
