"""`JsonCodec` writes and reads exactly what `json.dumps`/`json.loads` do, shortcuts included.

A replayed step's input is compared with the recorded one byte for byte, so the codec's fast
paths (flat scalars and lists of them, single values without whitespace) must never write or
read anything else than the general JSON path would.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runfold import MemoryStore
from runfold.flow import Flow, JsonCodec, PayloadError, step, wait_for_event, workflow


class _Level(enum.IntEnum):
    HIGH = 1


class _Tag(str):
    pass


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(),
    st.just(_Level.HIGH),
    st.builds(_Tag, st.text()),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner) | st.tuples(inner, inner) | st.dictionaries(st.text(), inner),
    max_leaves=8,
)


def _reference(value: Any) -> bytes | None:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return text.encode()


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)  # NaN-safe, type-sensitive (1 vs true vs 1.0)


@settings(max_examples=500)
@given(_VALUES)
def test_encode_writes_what_json_dumps_writes(value: Any) -> None:
    expected = _reference(value)
    if expected is None:
        with pytest.raises(PayloadError):
            JsonCodec().encode(value)
    else:
        assert JsonCodec().encode(value) == expected


@settings(max_examples=500)
@given(_VALUES, st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\r\n"]))
def test_decode_reads_what_json_loads_reads(value: Any, before: str, after: str) -> None:
    encoded = _reference(value)
    if encoded is None:
        return
    payload = before.encode() + encoded + after.encode()
    assert _same(JsonCodec().decode(payload), json.loads(payload))


@pytest.mark.parametrize(
    "payload",
    [b"1 2", b"[1,", b"tru", b'"a" x', b"{}x", b"", b'"\xff"', b"\xef\xbb\xbf[1]", b"1\x00"],
)
def test_decode_fails_or_reads_as_json_loads_does(payload: bytes) -> None:
    try:
        expected = json.loads(payload)
    except ValueError:
        with pytest.raises(PayloadError):
            JsonCodec().decode(payload)
    else:
        assert _same(JsonCodec().decode(payload), expected)


_bodies_saw: list[str] = []
_workflow_saw: list[list[str]] = []


def _echo(*args: Any) -> Any:
    _bodies_saw.append(repr(args))
    return args[0] if len(args) == 1 else args


def _raw() -> bytes:
    return b"\x00raw"


@workflow(name="test-flow-codec-values")
async def _values(input: Any) -> list[str]:
    got = []
    for value in ("text", 7, 2.5, True, None, (1, "a"), ["x", 3], {"k": (1,)}):
        got.append(repr(await step(_echo, value)))
    got.append(repr(await step(_echo, (1, 2), "b")))
    got.append(repr(await step(_raw)))
    _workflow_saw.append(got)
    await wait_for_event("go", token="test-flow-codec-go")
    return got


async def test_steps_see_what_decoding_their_record_gives() -> None:
    """Arguments and results reach the body and the workflow as the codec decodes them (a
    tuple as a list), in the session that ran the steps exactly as in a replay."""
    store = MemoryStore()
    _bodies_saw.clear()
    _workflow_saw.clear()
    await Flow(store, [_values]).start(_values, None, run_id="v")
    done = await Flow(store, [_values]).deliver("test-flow-codec-go", None)  # a replay
    assert done.status == "completed"
    assert _bodies_saw == [
        "('text',)",
        "(7,)",
        "(2.5,)",
        "(True,)",
        "(None,)",
        "([1, 'a'],)",
        "(['x', 3],)",
        "({'k': [1]},)",
        "([1, 2], 'b')",
    ]
    expected = [
        "'text'",
        "7",
        "2.5",
        "True",
        "None",
        "[1, 'a']",
        "['x', 3]",
        "{'k': [1]}",
        "[[1, 2], 'b']",
        "b'\\x00raw'",
    ]
    assert _workflow_saw == [expected, expected]
