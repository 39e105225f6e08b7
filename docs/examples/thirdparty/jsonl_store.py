"""A JSON-lines runfold store: a worked example of a third-party `EventStore`.

Written the way someone outside the project would write one, from
`docs/reference/conformance.md` and the store contract alone, using only runfold's public API.
It is small on purpose:

- **The file** holds one JSON object per line. An append is one line (the run, `recorded_at`, the
  encoded events with their feed positions, and the index rows the kernel computed); retention is
  a line naming the runs it deleted. A line is flushed and fsync'd before the call returns; a torn
  last line (a crash mid-write) was never acknowledged, so opening the file drops it.
- **The state** (events, index rows, token holders, the feed) lives in memory, rebuilt from the
  file at open; every call runs under one `asyncio.Lock`, and file I/O is plain blocking I/O
  inside it (no await between the checks and the write, so an append is all or nothing).
- **Feed positions** only grow: opening the file resumes after the highest position any line ever
  used, deleted runs included, so a position is never handed out twice.
- **Arguments** are checked first thing in every method by runfold's shared checks
  (`runfold.stores.arguments`), so this store refuses exactly what every store refuses; its own
  cursors are refused with `InvalidArgument` when they are not ones it made.

The proof that it honours the contract is `JsonlStoreConformance` at the bottom: five lines of
`StoreConformance` (plus the two optional hooks a file store can offer). Run it with pytest, or:

    python -m runfold.conformance docs.examples.thirdparty.jsonl_store:JsonlStoreConformance
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import os
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

import attrs

from runfold import EventStore
from runfold.conformance import Capabilities, StoreConformance
from runfold.errors import (
    CorruptEvent,
    EventDecodeError,
    InvalidArgument,
    SequenceConflict,
    StoreClosed,
    TokenConflict,
)
from runfold.events import Envelope, Event
from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    HookClaim,
    HookHolder,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    Wakeup,
    correlation_id,
    decode_event,
    encode_event,
)
from runfold.stores import arguments

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(value: datetime) -> int:
    return (value - EPOCH) // timedelta(microseconds=1)


def _time(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def _maybe_micros(value: datetime | None) -> int | None:
    return None if value is None else _micros(value)


def _maybe_time(micros: int | None) -> datetime | None:
    return None if micros is None else _time(micros)


def _cursor(*parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode()


def _uncursor(cursor: str) -> list[Any]:
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError:
        parts = None
    if not isinstance(parts, list) or len(parts) != 2:
        raise InvalidArgument("cursor", "is malformed: not a cursor this store made")
    return parts


@attrs.frozen
class Row:
    """One stored event, encoded."""

    run_id: str
    sequence: int
    type: str
    version: int
    correlation: str | None
    payload: bytes
    recorded_at: datetime
    position: int


# --- index rows as JSON -------------------------------------------------------------------------


def index_to_json(index: RunIndex) -> dict[str, Any]:
    """A run's index rows as JSON-ready values (times as integer microseconds)."""
    s = index.summary
    return {
        "summary": [
            s.workflow_name,
            s.status,
            s.parent_run_id,
            _micros(s.created_at),
            _micros(s.updated_at),
            _maybe_micros(s.completed_at),
            s.last_sequence,
            dict(s.attributes),
            s.owner_id,
            s.queue_name,
            s.priority,
            s.dedup_id,
        ],
        "hooks": [[c.token, c.hook_id, _maybe_micros(c.retained_until)] for c in index.hooks],
        "wakeups": [[w.kind, w.subject_id, _micros(w.due_at)] for w in index.wakeups],
    }


def index_from_json(run_id: str, data: dict[str, Any]) -> RunIndex:
    """The inverse of `index_to_json`."""
    name, status, parent, created, updated, completed, last, attributes, owner = data["summary"][:9]
    queue_name, priority, dedup_id = data["summary"][9:]
    summary = RunSummary(
        run_id=run_id,
        workflow_name=name,
        status=status,
        parent_run_id=parent,
        created_at=_time(created),
        updated_at=_time(updated),
        completed_at=_maybe_time(completed),
        last_sequence=last,
        attributes=attributes,
        owner_id=owner,
        queue_name=queue_name,
        priority=priority,
        dedup_id=dedup_id,
    )
    hooks = tuple(
        HookClaim(token=token, hook_id=hook_id, retained_until=_maybe_time(until))
        for token, hook_id, until in data["hooks"]
    )
    wakeups = tuple(
        Wakeup(run_id=run_id, kind=kind, subject_id=subject, due_at=_time(due))
        for kind, subject, due in data["wakeups"]
    )
    return RunIndex(summary=summary, hooks=hooks, wakeups=wakeups)


class JsonlStore:
    """An `EventStore` in one JSON-lines file. Open with `await JsonlStore.open(path)`."""

    def __init__(self, path: Path) -> None:
        """Use `JsonlStore.open`."""
        self.path = path
        self._lock = asyncio.Lock()
        self._file: BinaryIO | None = None
        self._runs: dict[str, list[Row]] = {}
        self._feed: list[Row] = []
        self._next_position = 1
        self._indexes: dict[str, RunIndex] = {}
        self._holders: dict[str, tuple[str, HookClaim]] = {}

    @classmethod
    async def open(cls, path: str | Path) -> JsonlStore:
        """Open (creating) the store in `path`, replaying its lines."""
        store = cls(Path(path))
        store.path.touch()
        with store.path.open("r+b") as file:
            good = 0
            for line in file:
                if not line.endswith(b"\n"):
                    break  # a torn last line: never acknowledged
                try:
                    record = json.loads(line)
                except ValueError:
                    break
                store._replay(record)
                good += len(line)
            file.truncate(good)
        store._file = store.path.open("ab")
        return store

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the file; later calls raise `StoreClosed`."""
        async with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _open_file(self) -> BinaryIO:
        if self._file is None:
            raise StoreClosed(f"the JSON-lines store {str(self.path)!r} is closed")
        return self._file

    def _write(self, record: dict[str, Any]) -> None:
        """Append one line and make it durable."""
        file = self._open_file()
        file.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        file.flush()
        os.fsync(file.fileno())

    def _replay(self, record: dict[str, Any]) -> None:
        """Apply one line to the in-memory state (at open, and after writing it)."""
        if record["op"] == "delete":
            gone = set(record["runs"])
            for run_id in gone:
                del self._runs[run_id]
                self._drop_index(run_id)
            self._feed = [row for row in self._feed if row.run_id not in gone]
            return
        run_id, at = record["run"], _time(record["at"])
        rows = self._runs.setdefault(run_id, [])
        for event_type, version, correlation, payload, position in record["events"]:
            row = Row(
                run_id=run_id,
                sequence=len(rows) + 1,
                type=event_type,
                version=version,
                correlation=correlation,
                payload=base64.b64decode(payload),
                recorded_at=at,
                position=position,
            )
            rows.append(row)
            self._feed.append(row)
            self._next_position = max(self._next_position, position + 1)
        self._set_index(run_id, index_from_json(run_id, record["index"]), at)

    def _drop_index(self, run_id: str) -> None:
        previous = self._indexes.pop(run_id, None)
        for claim in previous.hooks if previous is not None else ():
            held = self._holders.get(claim.token)
            if held is not None and held[0] == run_id:
                del self._holders[claim.token]

    def _set_index(self, run_id: str, index: RunIndex, at: datetime) -> None:
        self._drop_index(run_id)
        self._indexes[run_id] = index
        for claim in index.claims_at(at):  # an expired claim holds nothing
            self._holders[claim.token] = (run_id, claim)

    # --- append -------------------------------------------------------------------------------

    async def append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        *,
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None = None,
    ) -> list[Envelope]:
        """Check the head (its sequence and, if given, its event's position) and the claimed
        tokens, write one line, then apply it."""
        arguments.check_append_if_sequence(
            run_id,
            expected_sequence,
            events,
            index=index,
            recorded_at=recorded_at,
            expected_position=expected_position,
        )
        encoded = [(*encode_event(event), correlation_id(event)) for event in events]
        async with self._lock:
            self._open_file()
            rows = self._runs.get(run_id, [])
            head = len(rows)
            if expected_sequence != head or (
                expected_position is not None and head and rows[-1].position != expected_position
            ):
                raise SequenceConflict(run_id, expected_sequence, head)
            for claim in index.claims_at(recorded_at):
                held = self._holders.get(claim.token)
                if held is not None and held[0] != run_id and held[1].holds_at(recorded_at):
                    raise TokenConflict(claim.token, held[0], held[1].hook_id)
            first = self._next_position
            record = {
                "op": "append",
                "run": run_id,
                "at": _micros(recorded_at),
                "events": [
                    [kind, version, correlation, base64.b64encode(payload).decode(), first + i]
                    for i, (kind, version, payload, correlation) in enumerate(encoded)
                ],
                "index": index_to_json(index),
            }
            self._write(record)
            self._replay(record)
        return [
            Envelope(
                run_id=run_id,
                sequence=head + i,
                event=event,
                recorded_at=recorded_at,
                position=first + i - 1,
            )
            for i, event in enumerate(events, start=1)
        ]

    # --- reads --------------------------------------------------------------------------------

    @staticmethod
    def _envelope(row: Row) -> Envelope:
        try:
            event = decode_event(row.type, row.version, row.payload)
        except EventDecodeError as exc:
            raise CorruptEvent(row.run_id, row.sequence, exc.reason) from None
        return Envelope(
            run_id=row.run_id,
            sequence=row.sequence,
            event=event,
            recorded_at=row.recorded_at,
            position=row.position,
        )

    def _range(
        self, rows: list[Row], after: int, limit: int | None, descending: bool
    ) -> list[Envelope]:
        if descending:
            chosen = [r for r in reversed(rows) if after <= 0 or r.sequence < after]
        else:
            chosen = [r for r in rows if r.sequence > after]
        if limit is not None:
            chosen = chosen[: max(limit, 0)]
        return [self._envelope(row) for row in chosen]

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The run's envelopes after `after` (before it, descending), at most `limit`."""
        arguments.check_read(run_id, after=after, limit=limit, descending=descending)
        async with self._lock:
            self._open_file()
            return self._range(self._runs.get(run_id, []), after, limit, descending)

    async def head(self, run_id: str) -> int:
        """The run's last sequence, 0 if unknown."""
        arguments.check_head(run_id)
        async with self._lock:
            self._open_file()
            return len(self._runs.get(run_id, ()))

    async def read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[Envelope]:
        """The run's events with that correlation id, ranged as in `read`."""
        arguments.check_read_by_correlation(
            run_id, correlation_id, after=after, limit=limit, descending=descending
        )
        async with self._lock:
            self._open_file()
            rows = [r for r in self._runs.get(run_id, []) if r.correlation == correlation_id]
            return self._range(rows, after, limit, descending)

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The feed after `after_position`, in position order."""
        arguments.check_read_all(after_position=after_position, limit=limit)
        async with self._lock:
            self._open_file()
            start = bisect.bisect_right(self._feed, after_position, key=lambda r: r.position)
            return [self._envelope(r) for r in self._feed[start : start + max(limit, 0)]]

    # --- index queries ------------------------------------------------------------------------

    async def list_runs(
        self,
        *,
        workflow_name: str | None = None,
        status: RunStatus | None = None,
        parent_run_id: str | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 20,
    ) -> Page[RunSummary]:
        """Summaries newest first (created_at, then run id), filtered, one page."""
        arguments.check_list_runs(
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )
        bound = tuple(_uncursor(cursor)) if cursor is not None else None
        async with self._lock:
            self._open_file()
            summaries = [index.summary for index in self._indexes.values()]
        matching = sorted(
            (
                s
                for s in summaries
                if (workflow_name is None or s.workflow_name == workflow_name)
                and (status is None or s.status == status)
                and (parent_run_id is None or s.parent_run_id == parent_run_id)
                and (created_before is None or s.created_at < created_before)
                and (bound is None or (_micros(s.created_at), s.run_id) < bound)
            ),
            key=lambda s: (s.created_at, s.run_id),
            reverse=True,
        )
        items = tuple(matching[: max(limit, 0)])
        more = len(matching) > len(items) and bool(items)
        last = items[-1] if items else None
        next_cursor = _cursor(_micros(last.created_at), last.run_id) if more and last else None
        return Page(items=items, cursor=next_cursor, has_more=more)

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown runs."""
        arguments.check_get_runs(run_ids)
        async with self._lock:
            self._open_file()
            return [self._indexes[r].summary if r in self._indexes else None for r in run_ids]

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The live holder of `token` at `now`, if any."""
        arguments.check_find_hook(token, now=now)
        async with self._lock:
            self._open_file()
            held = self._holders.get(token)
        if held is None or not held[1].holds_at(now):
            return None
        return HookHolder(
            run_id=held[0], hook_id=held[1].hook_id, retained_until=held[1].retained_until
        )

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """Live and still-retained hooks by (run id, hook id), one page."""
        arguments.check_list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)
        bound = tuple(_uncursor(cursor)) if cursor is not None else None
        async with self._lock:
            self._open_file()
            held = list(self._holders.values())
        matching = sorted(
            (
                HookHolder(run_id=r, hook_id=c.hook_id, retained_until=c.retained_until)
                for r, c in held
                if c.holds_at(now)
                and (run_id is None or r == run_id)
                and (bound is None or (r, c.hook_id) > bound)
            ),
            key=lambda h: (h.run_id, h.hook_id),
        )
        items = tuple(matching[: max(limit, 0)])
        more = len(matching) > len(items) and bool(items)
        next_cursor = _cursor(items[-1].run_id, items[-1].hook_id) if more else None
        return Page(items=items, cursor=next_cursor, has_more=more)

    def _wakeups(self, workflow_names: Collection[str] | None) -> list[Wakeup]:
        found = [
            w
            for index in self._indexes.values()
            if workflow_names is None or index.summary.workflow_name in workflow_names
            for w in index.wakeups
        ]
        return sorted(found, key=lambda w: (w.due_at, w.run_id, w.kind, w.subject_id))

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        """Wakeups due at or before `now` (of runs of `workflow_names`), oldest first."""
        arguments.check_due_wakeups(now, limit=limit, workflow_names=workflow_names)
        async with self._lock:
            self._open_file()
            return [w for w in self._wakeups(workflow_names) if w.due_at <= now][: max(limit, 0)]

    async def next_wakeup(self, *, workflow_names: Collection[str] | None = None) -> Wakeup | None:
        """The earliest wakeup (of a run of `workflow_names`), if any."""
        arguments.check_next_wakeup(workflow_names=workflow_names)
        async with self._lock:
            self._open_file()
            found = self._wakeups(workflow_names)
        return found[0] if found else None

    # --- retention ----------------------------------------------------------------------------

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` and retain no token
        past it; one line records which."""
        arguments.check_delete_runs(terminal_before=terminal_before, limit=limit, run_ids=run_ids)
        async with self._lock:
            self._open_file()
            ended = sorted(
                (
                    index.summary
                    for index in self._indexes.values()
                    if index.summary.status in TERMINAL_RUN_STATUSES
                    and index.summary.completed_at is not None
                    and index.summary.completed_at < terminal_before
                    and not index.claims_at(terminal_before)
                    and (run_ids is None or index.summary.run_id in run_ids)
                ),
                key=lambda s: (s.completed_at or EPOCH, s.run_id),
            )[: max(limit, 0)]
            if ended:
                record = {"op": "delete", "runs": [s.run_id for s in ended]}
                self._write(record)
                self._replay(record)
        return len(ended)


# --- the proof ----------------------------------------------------------------------------------


class JsonlStoreConformance(StoreConformance):
    """`JsonlStore` under runfold's conformance kit: every check, reopen and corruption included."""

    capabilities = Capabilities(reopen=True, corruption=True)

    async def make_store(self) -> EventStore:
        """A fresh store in the check's temporary directory."""
        return await JsonlStore.open(self.tmp_dir / f"{self.unique_name()}.jsonl")

    async def reopen_store(self, store: EventStore) -> EventStore:
        """The same file, opened again."""
        assert isinstance(store, JsonlStore)
        return await JsonlStore.open(store.path)

    async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> EventStore:
        """Overwrite one event's payload in the file with bytes that are not CBOR, and reopen."""
        assert isinstance(store, JsonlStore)
        await store.close()
        lines = [json.loads(line) for line in store.path.read_bytes().splitlines()]
        head = 0
        for record in lines:
            if record["op"] == "append" and record["run"] == run_id:
                for event in record["events"]:
                    head += 1
                    if head == sequence:
                        event[3] = base64.b64encode(b"\xff\x00").decode()
            elif record["op"] == "delete" and run_id in record["runs"]:
                head = 0
        store.path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in lines))
        return await JsonlStore.open(store.path)
