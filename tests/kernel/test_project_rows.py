"""`project_rows` folds stored rows into the snapshot `project_run` makes of their envelopes, or
raises what the ordinary path (decode the rows, build the envelopes, fold) raises: for valid
histories, histories that break a law, payloads with fields of any value, and old rows."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from itertools import repeat
from pathlib import Path
from typing import Any, ClassVar, cast

import attrs
import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runfold import Snapshot
from runfold.conformance.strategies import (
    INVALID_HISTORY_KINDS,
    InvalidHistory,
    invalid_histories,
    valid_histories,
)
from runfold.events import Envelope, RunClaimed, RunCreated, RunReleased, RunStarted
from runfold.kernel import (
    EVENT_TYPES,
    Event,
    HistoryError,
    decode_events,
    encode_event,
    make_envelopes,
    project_run,
    run_index,
)
from runfold.kernel.fast import compile_event_call, compile_unpacker
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.kernel.snapshot.replay import _fold_rows, project_rows
from runfold.stores.time_keys import time_key

FIXTURE = Path(__file__).parents[1] / "support" / "fixtures" / "histories_schema_v1.json"
RUN_ID = "run-rows"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Columns = tuple[list[int], list[str], list[int], list[bytes], list[int]]
"""(sequences, types, versions, payloads, times) of a run's stored rows."""


def columns_of(history: list[Envelope]) -> Columns:
    """The history as a store keeps it: encoded as today's runfold writes."""
    encoded = [encode_event(e.event) for e in history]
    return (
        [e.sequence for e in history],
        [row[0] for row in encoded],
        [row[1] for row in encoded],
        [row[2] for row in encoded],
        [time_key(e.recorded_at) for e in history],
    )


def ordinary(run_id: str, rows: Columns) -> Snapshot:
    """What runfold did before `project_rows`: decode the rows, build envelopes, fold."""
    sequences, types, versions, payloads, times = rows
    events = decode_events(types, versions, payloads)
    recorded = [_EPOCH + timedelta(0, 0, time) for time in times]
    count = len(payloads)
    return project_run(
        make_envelopes(count, repeat(run_id), sequences, events, recorded, repeat(None))
    )


def outcome(fold: Any, *args: Any) -> tuple[str, Any]:
    """A fold's snapshot (with its repr and index), or the class and arguments of its error."""
    try:
        snapshot = fold(*args)
    except Exception as exc:
        return type(exc).__name__, (str(exc), getattr(exc, "sequence", None))
    return "snapshot", (snapshot, repr(snapshot), repr(run_index(snapshot)))


@given(valid_histories(RUN_ID))
def test_valid_histories_fold_alike_and_on_the_fast_path(history: list[Envelope]) -> None:
    rows = columns_of(history)
    # Times come back from storage in UTC whatever zone they were written in: equal to the
    # snapshot of the history in memory, and shown alike by both paths that decoded them.
    assert outcome(project_rows, RUN_ID, *rows) == outcome(ordinary, RUN_ID, rows)
    assert project_rows(RUN_ID, *rows) == project_run(history)
    # The fast path alone, without the fallback: it reads every valid history of today.
    sequences, types, _, payloads, times = rows
    fast = _fold_rows(RUN_ID, sequences, types, payloads, times, DEFAULT_LIMITS)
    assert outcome(lambda: fast) == outcome(ordinary, RUN_ID, rows)


@given(
    invalid_histories(
        RUN_ID,
        kinds=[k for k in INVALID_HISTORY_KINDS if k not in ("foreign_run", "not_an_event")],
    )
)
def test_histories_that_break_a_law_raise_as_project_run_does(case: InvalidHistory) -> None:
    with pytest.raises(HistoryError) as expected:
        project_run(case.history)
    with pytest.raises(HistoryError) as caught:
        project_rows(RUN_ID, *columns_of(case.history))
    assert (caught.value.run_id, caught.value.sequence, caught.value.reason) == (
        expected.value.run_id,
        expected.value.sequence,
        expected.value.reason,
    )


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.sampled_from(["info", "error", "step-1", "hook-1", "wait-1"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=200)
@given(valid_histories(RUN_ID, max_commands=12), st.data())
def test_any_payload_folds_or_fails_as_on_the_ordinary_path(
    history: list[Envelope], data: st.DataObject
) -> None:
    rows = columns_of(history)
    payloads = rows[3]
    for _ in range(data.draw(st.integers(1, 3))):
        n = data.draw(st.integers(0, len(payloads) - 1))
        wire = cbor2.loads(payloads[n])
        width = len(wire) if type(wire) is list else 0
        if data.draw(st.booleans()) and width:  # one field changed
            wire[data.draw(st.integers(0, width - 1))] = data.draw(wire_values)
        else:  # fields added, dropped or replaced, or not an array
            wire = data.draw(st.lists(wire_values, max_size=width + 1) | wire_values)
        payloads[n] = cbor2.dumps(wire)
    assert outcome(project_rows, RUN_ID, *rows) == outcome(ordinary, RUN_ID, rows)


@given(valid_histories(RUN_ID, max_commands=12), st.data())
def test_odd_columns_fold_or_fail_as_on_the_ordinary_path(
    history: list[Envelope], data: st.DataObject
) -> None:
    sequences, types, versions, payloads, times = columns_of(history)
    n = data.draw(st.integers(0, len(history) - 1))
    column = data.draw(st.sampled_from(["sequence", "type", "version", "time"]))
    if column == "sequence":
        sequences[n] = data.draw(st.integers(-1, len(history) + 1))
    elif column == "type":
        types[n] = data.draw(st.sampled_from([*EVENT_TYPES, "no_such_type"]))
    elif column == "version":
        versions[n] = data.draw(st.integers(0, 3))
    else:
        drawn: Any = data.draw(st.integers(-(2**64), 2**64) | st.floats(0, 2**40))
        times[n] = drawn  # a float, say, as SQLite's loose typing may hold
    rows = (sequences, types, versions, payloads, times)
    if all(type(time) is int for time in times):
        assert outcome(project_rows, RUN_ID, *rows) == outcome(ordinary, RUN_ID, rows)
    else:  # the ordinary path would round it: a time is integer microseconds or corrupt
        with pytest.raises(TypeError, match="not integer microseconds"):
            project_rows(RUN_ID, *rows)


PROBES: list[Any] = [None, True, 0, -1, 2**64, 1.5, "", "info", "x", b"", [], {}, [1], {"k": 1}]
PROBES += [253_402_300_800_000_000, -62_135_596_800_000_001]  # times past year 9999, before 1
"""Values put in place of each field: of every wire type, a level, times out of range."""


def fixture_runs() -> list[tuple[str, Columns]]:
    """The fixture's runs, written again as today's runfold writes them."""
    runs: list[tuple[str, Columns]] = []
    for run in json.loads(FIXTURE.read_text())["runs"]:
        rows = run["rows"]
        payloads = [base64.b64decode(row[3]) for row in rows]
        events = decode_events([row[1] for row in rows], [row[2] for row in rows], payloads)
        encoded = [encode_event(event) for event in events]
        runs.append(
            (
                run["run_id"],
                (
                    [row[0] for row in rows],
                    [row[0] for row in encoded],
                    [row[1] for row in encoded],
                    [row[2] for row in encoded],
                    [row[4] for row in rows],
                ),
            )
        )
    return runs


def owned_run() -> tuple[str, Columns]:
    """A run claimed and released, of the event types born after the fixture was written."""
    events = [
        RunCreated(workflow_name="w", input=b""),
        RunStarted(),
        RunClaimed(owner_id="worker-a", epoch=1),
        RunReleased(owner_id="worker-a", epoch=1),
    ]
    encoded = [encode_event(event) for event in events]
    sequences = list(range(1, len(events) + 1))
    times = [1_767_268_800_000_000 + n for n in sequences]
    types = [row[0] for row in encoded]
    versions = [row[1] for row in encoded]
    payloads = [row[2] for row in encoded]
    return "owned", (sequences, types, versions, payloads, times)


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_any_value_of_any_field_folds_or_fails_as_on_the_ordinary_path(event_type: str) -> None:
    # The first row of the type in the fixture (or the owned run), each of its fields (and one
    # past them) set to each probe, alone in the run's history.
    runs = [*fixture_runs(), owned_run()]
    run_id, rows = next((r, rows) for r, rows in runs if event_type in rows[1])
    n = rows[1].index(event_type)
    width = len(attrs.fields(cast(Any, EVENT_TYPES[event_type])))
    for position in range(width + 1):
        for probe in PROBES:
            wire = cbor2.loads(rows[3][n])
            wire += [None] * (position + 1 - len(wire))  # fields left out at their defaults
            wire[position] = probe
            payloads = [*rows[3][:n], cbor2.dumps(wire), *rows[3][n + 1 :]]
            probed = (rows[0], rows[1], rows[2], payloads, rows[4])
            assert outcome(project_rows, run_id, *probed) == outcome(ordinary, run_id, probed)


def test_an_empty_history_and_uneven_columns_are_refused() -> None:
    with pytest.raises(HistoryError, match="empty history"):
        project_rows(RUN_ID, [], [], [], [], [])
    name, version, payload = encode_event(EVENT_TYPES["run_started"]())
    with pytest.raises(ValueError, match="per row"):
        project_rows(RUN_ID, [1, 2], [name], [version], [payload], [0])


_NO_QUEUE = ", queue_name=None, priority=0, dedup_id=None"
"""How a `RunSummary` on no queue ends its repr since queues."""


def test_rows_of_schema_version_1_fold_as_they_did() -> None:
    runs = json.loads(FIXTURE.read_text())["runs"]
    for run in runs:
        rows = [(s, t, v, base64.b64decode(p), key) for s, t, v, p, key in run["rows"]]
        sequences, types, versions, payloads, times = (list(c) for c in zip(*rows, strict=True))
        snapshot = project_rows(run["run_id"], sequences, types, versions, payloads, times)
        # The fixture's index is from before queues: runs on none, their fields at the defaults.
        now = repr(run_index(snapshot)).replace(_NO_QUEUE, "")
        assert _NO_QUEUE not in run["index_repr"] and now == run["index_repr"]
        assert snapshot == ordinary(run["run_id"], (sequences, types, versions, payloads, times))


# --- the generated unpackers --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Sample(Event):
    """A test event with a field of every kind an unpacker reads."""

    event_type: ClassVar[str] = "test_sample"
    name: str
    count: int = 0
    when: datetime | None = None


def test_an_unpacker_passes_the_fields_its_call_names() -> None:
    def call(state: list[Any], at: str, when: datetime | None, name: str) -> None:
        state.append((at, when, name))

    def fallback(state: list[Any], payload: Any, at: str) -> None:
        state.append(("fallback", payload))

    unpack = compile_unpacker(Sample, call, fallback)
    state: list[Any] = []
    unpack(state, ["n", 1, 1_000_000], "at")
    unpack(state, ["n"], "at")
    unpack(state, ["n", True], "at")  # a bool is not an int
    unpack(state, [], "at")
    assert state == [
        ("at", _EPOCH + timedelta(seconds=1), "n"),
        ("at", None, "n"),
        ("fallback", ["n", True]),
        ("fallback", []),
    ]
    handle = compile_event_call(Sample, call)
    handle(state, Sample(name="m"), "later")
    assert state[-1] == ("later", None, "m")


def test_unpackers_refuse_what_they_cannot_read() -> None:
    def ignore(*_: Any) -> None:
        return None

    def wrong(state: Any, at: Any, nmae: str) -> None:
        return None

    with pytest.raises(TypeError, match="not fields of Sample"):
        compile_unpacker(Sample, wrong, ignore)
    with pytest.raises(TypeError, match="not fields of Sample"):
        compile_event_call(Sample, wrong)
    cls = cast(Any, EVENT_TYPES["attributes_set"])  # a required tuple of changes
    with pytest.raises(TypeError, match="cannot unpack"):
        compile_unpacker(cls, ignore, ignore)
