"""How a message crosses the bus: a msgspec Struct as msgpack, with an encoder and a decoder per
type built once and reused. kernel/bus.py sends and receives with it; tests and tools that handle
raw bytes use the same two functions.
"""

from typing import Any

import msgspec

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes, message_type: Any) -> Any:
    decoder = _decoders.get(message_type)
    if decoder is None:
        decoder = _decoders[message_type] = msgspec.msgpack.Decoder(message_type)
    return decoder.decode(data)


def field_at_fault(exc: msgspec.DecodeError) -> str | None:
    """The field that msgspec's complaint ends with ("... - at `$.params.top_p`"): "params.top_p"."""
    _, _, path = str(exc).partition(" - at `$")
    return path.rstrip("`").lstrip(".") or None


class PayloadTooLarge(Exception):
    """A message over the server's payload limit (nats-server's `max_payload`, 1 MB by default),
    which NATS refuses whole: nothing was sent."""

    def __init__(self, message: msgspec.Struct, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"{type(message).__name__} of {size} bytes on {subject} is over the bus's max_payload of "
            f"{limit} (--bus-max-payload-bytes for the embedded server)"
        )


def encode_within(subject: str, message: msgspec.Struct, limit_bytes: int) -> bytes:
    """`message` encoded, or `PayloadTooLarge` if that is over `limit_bytes`."""
    data = encode(message)
    if len(data) > limit_bytes:
        raise PayloadTooLarge(message, subject, len(data), limit_bytes)
    return data
