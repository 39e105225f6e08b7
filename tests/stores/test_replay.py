"""Replay reads what every runfold wrote: rows of schema version 1 (maps, written before the
positional form) and of version 2 decode, alone or together, through each SQL store, into the
same events and the same snapshots.

`tests/support/fixtures/histories_schema_v1.json` holds runs written by the runfold named in its
`written_by`, before schema version 2: each run's rows as that runfold stored them (payloads in
base64), the SHA-256 of the `repr` of its decoded events and of its snapshot, and the `repr` of
its index, all as that runfold computed them. The fixture covers every event type; its last run
is long enough (1,003 events) for the bulk paths.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sqlite3
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings

from runfold import EventStore, Snapshot
from runfold.conformance.strategies import valid_histories
from runfold.events import EVENT_TYPES, Envelope
from runfold.kernel import (
    Event,
    RunCreated,
    correlation_id,
    decode_event,
    encode_event,
    make_envelope,
    project_rows,
    project_run,
    run_index,
)
from runfold.kernel.wire import make_converter
from runfold.stores import SQLiteStore
from runfold.stores._sql import envelopes_from_rows
from runfold.stores.protocol import Replayer, replay_run
from runfold.stores.time_keys import time_key
from tests.support.postgres_support import SUITE_SCHEMA, admin, suite_store

FIXTURE = Path(__file__).parents[1] / "support" / "fixtures" / "histories_schema_v1.json"
RUNS: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["runs"]

Row = tuple[int, str, int, bytes, int]
"""(sequence, type, schema_version, payload, recorded_at key) of one stored event."""


def fixture_rows(run: dict[str, Any]) -> list[Row]:
    return [(s, t, v, base64.b64decode(p), key) for s, t, v, p, key in run["rows"]]


_NO_QUEUE = ", queue_name=None, priority=0, dedup_id=None"
"""How a run on no queue shows its queue fields since queues (events, snapshots, summaries)."""


def before_queues(text: str) -> str:
    """`text` as the fixture's runfold printed it: it had no queues, so its runs are on none
    and the fields are left out."""
    return text.replace(_NO_QUEUE, "")


def digest(value: object) -> str:
    return hashlib.sha256(before_queues(repr(value)).encode()).hexdigest()


def snapshot_digest(snapshot: Snapshot) -> str:
    """The digest of `snapshot` as the fixture's runfold printed it: it had no run owners, no
    ready time, no log ids, no step start ids and no queues, so a run of its rows has none, and
    those fields are left out of the text."""
    assert (snapshot.owner, snapshot.owner_epoch, snapshot.ready_at) == (None, 0, None)
    assert dict(snapshot.log_ids) == {}
    text = before_queues(repr(snapshot)).replace(
        ", owner=None, owner_epoch=0, ready_at=None", "", 1
    )
    text = text.replace(", log_ids={}", "", 1).replace(", start_id=None)", ")")
    return hashlib.sha256(text.encode()).hexdigest()


def replays_as_recorded(run: dict[str, Any], history: Sequence[Envelope]) -> None:
    """`history` decodes and folds into what the fixture's runfold made of the same rows."""
    assert digest([envelope.event for envelope in history]) == run["events_repr_sha256"]
    snapshot = project_run(history)
    assert snapshot_digest(snapshot) == run["snapshot_repr_sha256"], repr(snapshot)
    assert before_queues(repr(run_index(snapshot))) == run["index_repr"]


# --- the fixture of schema version 1 ------------------------------------------------------------


BORN_AT_VERSION_2 = {"run_claimed", "run_released"}
"""Event types added after the positional form: no row of schema version 1 ever held them."""


def test_the_fixture_is_of_version_1_and_covers_every_event_type() -> None:
    rows = [row for run in RUNS for row in fixture_rows(run)]
    assert {version for _, _, version, _, _ in rows} == {1}
    types = {event_type for _, event_type, _, _, _ in rows}
    assert types == set(EVENT_TYPES) - BORN_AT_VERSION_2
    assert all(type(cbor2.loads(payload)) is dict for _, _, _, payload, _ in rows)
    assert max(len(run["rows"]) for run in RUNS) >= 1_000


@pytest.mark.parametrize("run", RUNS, ids=[run["run_id"] for run in RUNS])
def test_version_1_rows_replay_to_the_snapshots_they_made(run: dict[str, Any]) -> None:
    rows = fixture_rows(run)
    events = [
        decode_event(event_type, version, payload) for _, event_type, version, payload, _ in rows
    ]
    assert digest(events) == run["events_repr_sha256"]
    together = envelopes_from_rows([(*row, None) for row in rows], run["run_id"])
    replays_as_recorded(run, together)
    # Written again today, the same events take the positional form and replay alike.
    again = [
        (s, *encode_event(event), key, None)
        for (s, _, _, _, key), event in zip(rows, events, strict=True)
    ]
    # Each at its type's version now: run_created is at 3 since queues, the others at 2.
    assert {(row[1], row[2]) for row in again} <= {
        (name, cls.schema_version) for name, cls in EVENT_TYPES.items()
    }
    replays_as_recorded(run, envelopes_from_rows(again, run["run_id"]))


def _stored_rows() -> list[tuple[Any, ...]]:
    """Every fixture row as a store's `events` table keeps it, with a feed position."""
    stored: list[tuple[Any, ...]] = []
    for run in RUNS:
        for sequence, event_type, version, payload, key in fixture_rows(run):
            correlation = correlation_id(decode_event(event_type, version, payload))
            position = len(stored) + 1
            stored.append(
                (run["run_id"], sequence, event_type, version, correlation, payload, key, position)
            )
    return stored


_INSERT = (
    "INSERT INTO {table} (run_id, sequence, type, schema_version, correlation_id, payload, "
    "recorded_at, position) VALUES ({marks})"
)


async def reads_as_recorded(store: EventStore) -> None:
    """Each fixture run, read from `store` (which holds its rows), replays as recorded."""
    for run in RUNS:
        replays_as_recorded(run, await store.read(run["run_id"]))
        replayed = await replay_run(store, run["run_id"])  # the store's own replay
        assert replayed is not None
        assert snapshot_digest(replayed.snapshot) == run["snapshot_repr_sha256"]
        newest = await store.read(run["run_id"], descending=True, limit=3)
        assert [e.sequence for e in newest] == [len(run["rows"]) - n for n in range(len(newest))]
    feed = await store.read_all(limit=10_000)
    assert [(e.run_id, e.sequence) for e in feed] == [(r[0], r[1]) for r in _stored_rows()]


async def test_version_1_rows_read_through_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path):
        pass  # the schema, as a runfold of today makes it
    with sqlite3.connect(path) as conn:
        conn.executemany(_INSERT.format(table="events", marks=", ".join("?" * 8)), _stored_rows())
    async with await SQLiteStore.open(path) as store:
        await reads_as_recorded(store)


@pytest.mark.postgres
async def test_version_1_rows_read_through_postgres() -> None:
    store = await suite_store()
    try:
        with admin().cursor() as cursor:
            table = f'"{SUITE_SCHEMA}".events'
            cursor.executemany(
                _INSERT.format(table=table, marks=", ".join(["%s"] * 8)), _stored_rows()
            )
        await reads_as_recorded(store)
    finally:
        await store.close()


# --- old and new paths agree --------------------------------------------------------------------


def _version_1_payload(event: Any) -> bytes:
    """An event's payload as runfold wrote it before the positional form: every field in a map
    (of those it had then: a run on a queue is written as today's runfold writes it)."""
    fields = make_converter().unstructure(event)
    if isinstance(event, RunCreated):
        for name in ("queue_name", "priority", "dedup_id"):
            del fields[name]
    return cbor2.dumps(fields)


def _on_queue(event: Event) -> bool:
    """Whether `event` puts a run on a queue, which no runfold before queues could write."""
    return isinstance(event, RunCreated) and _NO_QUEUE not in repr(event)


def _old_path(history: list[Envelope]) -> list[Envelope]:
    """The history written at version 1 and decoded row by row, as runfold read it before."""
    return [
        make_envelope(
            e.run_id,
            e.sequence,
            decode_event(*encode_event(e.event))
            if _on_queue(e.event)
            else decode_event(e.event.event_type, 1, _version_1_payload(e.event)),
            e.recorded_at,
            None,
        )
        for e in history
    ]


def _new_path(history: list[Envelope]) -> list[Envelope]:
    """The history written as today's runfold writes it, and decoded as its stores read it."""
    rows = [(e.sequence, *encode_event(e.event), time_key(e.recorded_at), None) for e in history]
    return envelopes_from_rows(rows, history[0].run_id)


def _project_rows(history: list[Envelope]) -> Snapshot:
    """The history written as today's runfold writes it, and folded from its rows."""
    encoded = [encode_event(e.event) for e in history]
    return project_rows(
        history[0].run_id,
        [e.sequence for e in history],
        [row[0] for row in encoded],
        [row[1] for row in encoded],
        [row[2] for row in encoded],
        [time_key(e.recorded_at) for e in history],
    )


def _appends(history: list[Envelope]) -> list[tuple[datetime, list[Envelope]]]:
    """The history as the appends that wrote it: one per `recorded_at`."""
    appends: list[tuple[datetime, list[Envelope]]] = []
    for envelope in history:
        if appends and appends[-1][0] == envelope.recorded_at:
            appends[-1][1].append(envelope)
        else:
            appends.append((envelope.recorded_at, [envelope]))
    return appends


async def _through(store: EventStore, history: list[Envelope]) -> list[Snapshot]:
    """Append `history` to `store` as a runtime would, read it back and fold what was read, and
    replay it (`replay_run`: a SQL store folds its rows straight, `project_rows`)."""
    snapshot: Snapshot | None = None
    for at, batch in _appends(history):
        expected = snapshot.last_sequence if snapshot is not None else 0
        snapshot = project_run(history[: expected + len(batch)])
        await store.append_if_sequence(
            batch[0].run_id,
            expected,
            [e.event for e in batch],
            index=run_index(snapshot),
            recorded_at=at,
        )
    run_id = history[0].run_id
    replayed = await replay_run(store, run_id)
    assert replayed is not None
    return [project_run(await store.read(run_id)), replayed.snapshot]


async def _through_stores(history: list[Envelope]) -> list[Snapshot]:
    folded = []
    with tempfile.TemporaryDirectory(prefix="runfold-test-") as directory:
        async with await SQLiteStore.open(Path(directory) / "runfold.db") as sqlite:
            assert isinstance(sqlite, Replayer)
            folded += await _through(sqlite, history)
    postgres = await suite_store()
    try:
        assert isinstance(postgres, Replayer)
        folded += await _through(postgres, history)
    finally:
        await postgres.close()
    return folded


@pytest.mark.postgres
@settings(max_examples=25)
@given(valid_histories(max_commands=25))
def test_project_run_is_the_same_on_the_old_and_new_paths(history: list[Envelope]) -> None:
    expected = project_run(history)
    old = project_run(_old_path(history))
    # Equal to the snapshot of the history in memory; and, since times come back from storage
    # in UTC whatever zone they were written in, shown alike by every path that decoded them.
    assert old == expected
    assert run_index(old) == run_index(expected)
    folded = [
        project_run(_new_path(history)),
        _project_rows(history),
        *asyncio.run(_through_stores(history)),
    ]
    for new in folded:
        assert new == expected
        assert repr(new) == repr(old)
        assert repr(run_index(new)) == repr(run_index(old))


@pytest.mark.postgres
def test_a_long_history_is_the_same_on_the_old_and_new_paths() -> None:
    run = max(RUNS, key=lambda r: len(r["rows"]))
    history = envelopes_from_rows([(*row, None) for row in fixture_rows(run)], run["run_id"])
    expected = project_run(history)
    assert len(history) >= 1_000
    assert project_run(_old_path(history)) == expected
    assert project_run(_new_path(history)) == expected
    assert _project_rows(history) == expected
    assert all(folded == expected for folded in asyncio.run(_through_stores(history)))
