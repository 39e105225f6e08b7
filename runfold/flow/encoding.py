"""How `runfold.flow` turns Python values into the bytes a run records, and back.

A `PayloadCodec` encodes workflow inputs and outputs, step arguments and results, and hook
payloads. `JsonCodec`, the default, writes JSON text and passes `bytes` through: they are stored
as one marker byte (0x00, which never starts JSON text) followed by the bytes unchanged, so
binary payloads are neither base64-inflated nor confused with JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from json.scanner import make_scanner
from typing import Any, Protocol

from runfold.engine.raised import error_text
from runfold.flow.errors import PayloadError

__all__ = ["ROUND_TRIP_TYPES", "JsonCodec", "PayloadCodec", "payload_error", "round_trips"]

_RAW = b"\x00"
_BINARY = (bytes, bytearray)
# One encoder for every payload: `json.dumps` with these options builds a new one per call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()
# Reads one JSON value at an index: what `JSONDecoder.decode` runs once it skipped whitespace.
# (typeshed gives `make_scanner` the wrong argument type.)
_SCAN = make_scanner(_DECODER)  # type: ignore[arg-type]

# The JSON text `json.dumps` writes for a value of exactly these types (a subclass, an enum
# say, takes the general path): what a step's arguments and result most often are.
_SCALARS: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    bool: lambda flag: "true" if flag else "false",
    type(None): lambda _: "null",
}


ROUND_TRIP_TYPES = frozenset({str, bytes, int, float, bool, type(None)})
"""The types whose values `JsonCodec` decodes back as themselves, as far as code can tell.

Immutable, and exactly these types (a subclass may not round-trip); a float that encodes is
finite."""


def round_trips(value: Any) -> bool:
    """Whether `JsonCodec` gives `value` back as itself (its type is in `ROUND_TRIP_TYPES`)."""
    return type(value) in ROUND_TRIP_TYPES


def _flat_json(value: Any) -> str | None:
    """`value`'s JSON text if it is a scalar of `_SCALARS`, or a list or tuple of them; else
    None (for `json.dumps` to write it)."""
    kind = type(value)
    write = _SCALARS.get(kind)
    if write is not None:
        return write(value)
    if kind is not list and kind is not tuple:
        return None
    parts = []
    for item in value:
        write = _SCALARS.get(type(item))
        if write is None:
            return None
        parts.append(write(item))
    return f"[{','.join(parts)}]"


class PayloadCodec(Protocol):
    """Encodes values to the bytes a run records, and decodes them back.

    `decode(encode(v))` must equal `v` for every value a workflow uses, and `encode` must be
    deterministic: a replayed step's input is compared with the recorded one byte for byte.
    """

    def encode(self, value: Any) -> bytes:
        """The bytes to record for `value`; raise `PayloadError` for a value it cannot take."""
        ...

    def decode(self, payload: bytes) -> Any:
        """The value `payload` was encoded from; raise `PayloadError` for bytes it cannot read."""
        ...


class JsonCodec:
    """JSON text (sorted keys, compact) for JSON values; `bytes` passed through behind 0x00.

    Tuples come back as lists, as JSON has no tuple.
    """

    def encode(self, value: Any) -> bytes:
        """JSON text for a JSON value; 0x00 and the bytes themselves for `bytes`."""
        write = _SCALARS.get(type(value))
        if write is not None:  # a step's result, most often: no call to `_flat_json`
            return write(value).encode()
        if isinstance(value, _BINARY):
            return _RAW + bytes(value)
        try:
            text = _flat_json(value)
            if text is None:
                text = _ENCODER.encode(value)
        except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise PayloadError(f"cannot encode a {type(value).__name__} as JSON: {exc}") from exc
        return text.encode()

    def decode(self, payload: bytes) -> Any:
        """The bytes behind a leading 0x00, else the JSON value."""
        if payload.startswith(_RAW):
            return payload[1:]
        try:
            # A first byte in 0x01-0x7f and a second not 0x00 is what `json.loads` reads as
            # UTF-8 (no byte-order mark, not UTF-16/32): decode it so without detecting.
            if b"\x00" < payload[:1] < b"\x80" and payload[1:2] != b"\x00":
                text = payload.decode("utf-8", "surrogatepass")
                try:  # one value, no whitespace around it: what `encode` writes
                    value, end = _SCAN(text, 0)
                except StopIteration:
                    pass
                else:
                    if end == len(text):
                        return value
                return _DECODER.decode(text)
            return json.loads(payload)
        except ValueError as exc:
            raise PayloadError(f"recorded payload is not JSON: {exc}") from exc


def payload_error(what: str, exc: Exception) -> PayloadError:
    """The `PayloadError` for `what`, which the codec could not encode (it raised `exc`)."""
    if isinstance(exc, PayloadError):
        return PayloadError(f"{what} cannot be encoded: {exc}")
    return PayloadError(f"{what} cannot be encoded: {error_text(exc)}")
