"""Values in PostgreSQL's binary format: the composite `append_request` and its arrays.

The store sends each append as one value of its composite type, encoded here: cheaper than its
23 fields adapted one by one. `Wire` is such a value, which `WireDumper` passes through as it is.
"""

# Why by hand: psycopg's own adaptation of composites (`CompositeInfo.fetch`, then
# `register_composite`, dumping in binary) makes the same bytes (a test compares them on the
# server), but its generic per-field dumping takes nearly twice the client time of this encoder
# for the common append of one event, and more for every append of a group commit.

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper
from psycopg.postgres import types as pg_types
from psycopg.pq import Format

from runfold.kernel import HookClaim, Wakeup
from runfold.stores.time_keys import time_key

__all__ = [
    "BYTEA",
    "I4",
    "I4_MAX",
    "I8",
    "I8_MAX",
    "INT4",
    "INT8",
    "NO_CLAIMS",
    "NO_WAKEUPS",
    "TEXT",
    "Wire",
    "WireDumper",
    "array",
    "array_field",
    "claims_fields",
    "i8",
    "int4_field",
    "int8_field",
    "record",
    "text_field",
    "time_field",
    "utf8",
    "wakeups_fields",
]


class Wire(bytes):
    """A value already in PostgreSQL's binary format; subclasses name its type (`oid`)."""

    oid: ClassVar[int]


class WireDumper(Dumper):
    """Passes a `Wire` value through as it is, typed as its class says."""

    format = Format.BINARY

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        assert issubclass(cls, Wire)
        self.oid = cls.oid

    def dump(self, obj: Any) -> Buffer:
        """The value's bytes, as they are."""
        return memoryview(obj)


TEXT = pg_types["text"].oid
"""The type of `text` values."""
BYTEA = pg_types["bytea"].oid
"""The type of `bytea` values."""
INT4 = pg_types["int4"].oid
"""The type of `integer` values."""
INT8 = pg_types["int8"].oid
"""The type of `bigint` values."""
_ARRAY = {
    pg_types[name].oid: pg_types[name].array_oid for name in ("text", "bytea", "int4", "int8")
}
I4 = struct.Struct(">i")
"""An `integer` in binary."""
I8 = struct.Struct(">q")
"""A `bigint` in binary."""
I4_MAX = 2**31 - 1
"""The largest `integer`."""
I8_MAX = 2**63 - 1
"""The largest `bigint`."""
_HEADER = struct.Struct(">iiIii")  # dimensions, has NULLs, element type, length, lower bound
_ONE = struct.Struct(">iiIiii")  # the header of an array of one element, and its length
_EMPTY = struct.Struct(">iiI")  # no dimensions, no NULLs, element type
_FIELD = struct.Struct(">Ii")  # type, length (-1: NULL)
_INT4_FIELD = struct.Struct(">Iii")  # type, length, value
_INT8_FIELD = struct.Struct(">Iiq")
_NULL = I4.pack(-1)
_NULL_TEXT = _FIELD.pack(TEXT, -1)
_NULL_INT8 = _FIELD.pack(INT8, -1)

# A composite value is its count of fields, then each field as its type, its length (-1 for
# NULL) and its bytes; each function below gives one whole field, for `record` to join.


def array(element_oid: int, elements: Sequence[bytes | None]) -> bytes:
    """A one-dimensional array of `elements`, each in its type's binary form (None: NULL)."""
    if len(elements) == 1 and (element := elements[0]) is not None:
        return _ONE.pack(1, 0, element_oid, 1, 1, len(element)) + element
    if not elements:
        return _EMPTY.pack(0, 0, element_oid)
    parts = [_HEADER.pack(1, None in elements, element_oid, len(elements), 1)]
    for element in elements:
        if element is None:
            parts.append(_NULL)
        else:
            parts += (I4.pack(len(element)), element)
    return b"".join(parts)


def array_field(element_oid: int, elements: Sequence[bytes | None]) -> bytes:
    """An array field of a composite."""
    body = array(element_oid, elements)
    return _FIELD.pack(_ARRAY[element_oid], len(body)) + body


def text_field(value: str | None) -> bytes:
    """A `text` field of a composite, None for NULL."""
    if value is None:
        return _NULL_TEXT
    data = value.encode()
    return _FIELD.pack(TEXT, len(data)) + data


def int4_field(value: int) -> bytes:
    """An `integer` field of a composite."""
    return _INT4_FIELD.pack(INT4, 4, value)


def int8_field(value: int | None) -> bytes:
    """A `bigint` field of a composite, None for NULL."""
    return _NULL_INT8 if value is None else _INT8_FIELD.pack(INT8, 8, value)


def time_field(value: datetime | None) -> bytes:
    """`value`'s `time_key` as a `bigint` field of a composite, None for NULL."""
    return _NULL_INT8 if value is None else _INT8_FIELD.pack(INT8, 8, time_key(value))


def record(fields: Sequence[bytes]) -> bytes:
    """A composite value of `fields`, each a whole field (`text_field`, …) in column order."""
    return I4.pack(len(fields)) + b"".join(fields)


def utf8(text: str | None) -> bytes | None:
    """`text` in UTF-8, None passed through."""
    return None if text is None else text.encode()


def i8(value: datetime | None) -> bytes | None:
    """`value`'s `time_key` as a binary `bigint`, None passed through."""
    return None if value is None else I8.pack(time_key(value))


def claims_fields(claims: Sequence[HookClaim]) -> tuple[bytes, bytes, bytes]:
    """`append_request`'s tokens, hook_ids and retained_until."""
    return (
        array_field(BYTEA, [c.token.encode() for c in claims]),
        array_field(TEXT, [c.hook_id.encode() for c in claims]),
        array_field(INT8, [i8(c.retained_until) for c in claims]),
    )


def wakeups_fields(wakeups: Sequence[Wakeup]) -> tuple[bytes, bytes, bytes]:
    """`append_request`'s wakeup_kinds, wakeup_subjects and wakeup_due."""
    return (
        array_field(TEXT, [w.kind.encode() for w in wakeups]),
        array_field(TEXT, [w.subject_id.encode() for w in wakeups]),
        array_field(INT8, [i8(w.due_at) for w in wakeups]),
    )


NO_CLAIMS = claims_fields(())
"""`claims_fields` of no claims."""
NO_WAKEUPS = wakeups_fields(())
"""`wakeups_fields` of no wakeups."""
