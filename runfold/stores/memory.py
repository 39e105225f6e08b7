"""`MemoryStore`: dicts and lists under an `asyncio.Lock`.

It is the oracle the conformance kit compares other stores with, so it favours the obvious over
the fast: queries scan, events are kept encoded exactly as a database row would keep them (so a
codec bug shows here too), and every method is one critical section.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

import attrs

from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    CorruptEvent,
    Envelope,
    Event,
    EventDecodeError,
    HookClaim,
    HookHolder,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    SequenceConflict,
    StoreClosed,
    TokenConflict,
    Wakeup,
    WorkerLease,
    correlation_id,
    decode_event,
    decode_events,
    encode_event,
    make_envelope,
    make_envelopes,
)
from runfold.kernel.bulk import in_bulk
from runfold.kernel.fast import frozen_factory
from runfold.stores import arguments
from runfold.stores.base import StoreBase
from runfold.stores.memory_due_work import MemoryDueWork
from runfold.stores.memory_leases import MemoryLeases
from runfold.stores.paging import hook_cursor_key, hooks_page, run_cursor_key, runs_page
from runfold.stores.signals import BoardSignals, SignalBoard
from runfold.stores.time_keys import index_in_utc, time_key

__all__ = ["MemoryStore"]


def _utc(moment: datetime) -> datetime:
    """`moment` in UTC: stores keep instants, not the offset a caller happened to use."""
    return moment.astimezone(UTC)


@attrs.frozen
class _Row:
    """One stored event, as a database row holds it (`recorded_at` in UTC: `_utc`)."""

    run_id: str
    sequence: int
    type: str
    schema_version: int
    correlation_id: str | None
    payload: bytes
    recorded_at: datetime
    position: int


_make_row = frozen_factory(_Row)
"""`_Row` from its fields in order: an append builds one per event."""


def _position(row: _Row) -> int:
    return row.position


class MemoryStore(MemoryLeases, MemoryDueWork, BoardSignals, StoreBase):
    """An `EventStore` in process memory: for tests, examples, and as the conformance oracle.

    It keeps worker leases too (`WorkerLeases`) and hands out due work (`DueWork`), so a fleet
    of workers in one process can share it.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._closed = False
        self._rows: dict[str, list[_Row]] = {}
        self._feed: list[_Row] = []
        self._next_position = 1
        self._indexes: dict[str, RunIndex] = {}
        self._tokens: dict[str, tuple[str, HookClaim]] = {}
        self._leases: dict[str, WorkerLease] = {}
        self._signals = SignalBoard()
        self._holds: dict[str, tuple[str, datetime, int]] = {}
        self._starts: dict[str, list[datetime]] = {}
        self._dedups: dict[tuple[str, str], tuple[str, datetime]] = {}

    async def close(self) -> None:
        """Close the store; later calls raise `StoreClosed`, closing again is harmless."""
        self._closed = True
        self._signals.wake_all()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the memory store is closed")

    # --- append -------------------------------------------------------------------------------

    async def _append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None,
        /,
    ) -> list[Envelope]:
        """Append `events` if the run's head is `expected_sequence`, all or nothing.

        See `EventStore.append_if_sequence`.

        Raises:
            SequenceConflict: The run's head is not `expected_sequence`, or its event is not at
                `expected_position`; nothing was written.
            TokenConflict: Another run's live or retained hook holds a token of `index`.
            InvalidArgument: An argument the contract refuses: `events` empty, `index` another
                run's, a naive `recorded_at` … (`runfold.stores.arguments`).
            StoreClosed: The store was closed.
        """
        encoded = [encode_event(event) for event in events]  # fails before anything is written
        async with self._lock:
            self._check_open()
            rows = self._rows.get(run_id, [])
            if expected_sequence != len(rows) or (
                expected_position is not None
                and expected_sequence > 0
                and rows[-1].position != expected_position
            ):
                raise SequenceConflict(run_id, expected_sequence, len(rows))
            self._check_claims(run_id, index, recorded_at)
            at = _utc(recorded_at)
            position = self._next_position
            sequence = expected_sequence
            new_rows: list[_Row] = []
            appended: list[Envelope] = []
            for event, (event_type, version, payload) in zip(events, encoded, strict=True):
                sequence += 1
                new_rows.append(
                    _make_row(
                        run_id,
                        sequence,
                        event_type,
                        version,
                        correlation_id(event),
                        payload,
                        at,
                        position,
                    )
                )
                appended.append(make_envelope(run_id, sequence, event, recorded_at, position))
                position += 1
            self._next_position = position
            self._rows.setdefault(run_id, rows).extend(new_rows)
            self._feed.extend(new_rows)
            self._replace_index(run_id, index, recorded_at)
        self._post(index)
        return appended

    def _check_claims(self, run_id: str, index: RunIndex, now: datetime) -> None:
        """`TokenConflict` if another run's live hook holds a token `index` claims at `now`."""
        for claim in index.claims_at(now):
            held = self._tokens.get(claim.token)
            if held is not None and held[0] != run_id and held[1].holds_at(now):
                raise TokenConflict(claim.token, held[0], held[1].hook_id)

    async def rewrite_index(self, run_id: str, index: RunIndex | None, *, now: datetime) -> None:
        """Replace the run's index rows with `index` (None: remove them), appending nothing.

        The repair behind `runfold verify --rebuild-index`: an optional capability, not part of
        `EventStore`. Fenced like an append; nothing is written when it raises.

        Raises:
            SequenceConflict: `index` does not describe the run's head
                (`index.summary.last_sequence`; 0, no events, for None).
            TokenConflict: Another run's live hook holds a token of `index` at `now`.
            InvalidArgument: `index` is another run's, or another argument the contract refuses.
            StoreClosed: The store was closed.
        """
        arguments.check_rewrite_index(run_id, index, now=now)
        expected = index.summary.last_sequence if index is not None else 0
        async with self._lock:
            self._check_open()
            head = len(self._rows.get(run_id, ()))
            if head != expected:
                raise SequenceConflict(run_id, expected, head)
            if index is not None:
                self._check_claims(run_id, index, now)
            self._replace_index(run_id, index, now)

    def _replace_index(self, run_id: str, index: RunIndex | None, now: datetime) -> None:
        previous = self._indexes.pop(run_id, None)
        if previous is not None:
            for claim in previous.hooks:
                held = self._tokens.get(claim.token)
                if held is not None and held[0] == run_id:
                    del self._tokens[claim.token]
        if index is not None:
            index = self._stored_index(index)
            self._indexes[run_id] = index
            for claim in index.claims_at(now):  # an expired claim must not displace a holder
                self._tokens[claim.token] = (run_id, claim)

    @staticmethod
    def _stored_index(index: RunIndex) -> RunIndex:
        """The index rows as kept: every time in UTC (the contract's "times are stored as UTC")."""
        return index_in_utc(index)

    # --- reads --------------------------------------------------------------------------------

    @classmethod
    def _envelopes(cls, rows: Sequence[_Row]) -> list[Envelope]:
        """The envelopes of `rows`, decoded together as a SQL store decodes a read's rows (with
        the cycle collector paused for a long read, as there).

        A row that does not decode is `CorruptEvent` naming its run and sequence.
        """
        return in_bulk(len(rows), cls._decoded, rows)

    @staticmethod
    def _decoded(rows: Sequence[_Row]) -> list[Envelope]:
        try:
            events = decode_events(
                [r.type for r in rows], [r.schema_version for r in rows], [r.payload for r in rows]
            )
        except EventDecodeError:
            for row in rows:  # the first row that does not decode alone is named
                try:
                    decode_event(row.type, row.schema_version, row.payload)
                except EventDecodeError as exc:
                    raise CorruptEvent(row.run_id, row.sequence, exc.reason) from None
            raise
        return make_envelopes(
            len(rows),
            [r.run_id for r in rows],
            [r.sequence for r in rows],
            events,
            [r.recorded_at for r in rows],
            [r.position for r in rows],
        )

    @staticmethod
    def _select(
        rows: Sequence[_Row], after: int, limit: int | None, descending: bool
    ) -> list[_Row]:
        if descending:
            chosen = [r for r in reversed(rows) if after <= 0 or r.sequence < after]
        else:
            chosen = [r for r in rows if r.sequence > after]
        return chosen if limit is None else chosen[: max(limit, 0)]

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        """The run's envelopes after `after`, at most `limit` (`EventStore.read`)."""
        async with self._lock:
            self._check_open()
            rows = self._rows.get(run_id, [])
            # Sequences are dense from 1, so a run's rows are sliced, never scanned.
            if descending:
                chosen = rows[: len(rows) if after <= 0 else max(after - 1, 0)][::-1]
            else:
                chosen = rows[max(after, 0) :]
            if limit is not None:
                chosen = chosen[: max(limit, 0)]
        return self._envelopes(chosen)

    async def _head(self, run_id: str, /) -> int:
        """The run's last sequence; 0 for an unknown run."""
        async with self._lock:
            self._check_open()
            return len(self._rows.get(run_id, ()))

    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        """The run's envelopes whose `correlation_id` matches (`EventStore.read_by_correlation`)."""
        async with self._lock:
            self._check_open()
            matching = [r for r in self._rows.get(run_id, ()) if r.correlation_id == correlation_id]
            rows = self._select(matching, after, limit, descending)
        return self._envelopes(rows)

    async def _read_all(self, after_position: int, limit: int, /) -> list[Envelope]:
        """The global feed: every run's envelopes after `after_position`, in position order."""
        async with self._lock:
            self._check_open()
            start = bisect.bisect_right(self._feed, after_position, key=_position)
            rows = self._feed[start : start + max(limit, 0)]
        return self._envelopes(rows)

    # --- index queries ------------------------------------------------------------------------

    async def _list_runs(
        self,
        workflow_name: str | None,
        status: RunStatus | None,
        parent_run_id: str | None,
        created_before: datetime | None,
        cursor: str | None,
        limit: int,
        /,
    ) -> Page[RunSummary]:
        """Run summaries, newest first, filtered and a page at a time (`EventStore.list_runs`)."""
        bound = run_cursor_key(cursor) if cursor is not None else None
        async with self._lock:
            self._check_open()
            summaries = [index.summary for index in self._indexes.values()]
        chosen = sorted(
            (
                s
                for s in summaries
                if (workflow_name is None or s.workflow_name == workflow_name)
                and (status is None or s.status == status)
                and (parent_run_id is None or s.parent_run_id == parent_run_id)
                and (created_before is None or s.created_at < created_before)
                and (bound is None or (time_key(s.created_at), s.run_id) < bound)
            ),
            key=lambda s: (time_key(s.created_at), s.run_id),
            reverse=True,
        )
        return runs_page(chosen, limit)

    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""
        async with self._lock:
            self._check_open()
            found = {rid: self._indexes[rid].summary for rid in run_ids if rid in self._indexes}
        return [found.get(rid) for rid in run_ids]

    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""
        async with self._lock:
            self._check_open()
            held = self._tokens.get(token)
        if held is None or not held[1].holds_at(now):
            return None
        run_id, claim = held
        return HookHolder(run_id=run_id, hook_id=claim.hook_id, retained_until=claim.retained_until)

    async def _list_hooks(
        self, run_id: str | None, cursor: str | None, limit: int, now: datetime, /
    ) -> Page[HookHolder]:
        """Live and still-retained hooks at `now`, a page at a time (`EventStore.list_hooks`)."""
        bound = hook_cursor_key(cursor) if cursor is not None else None
        async with self._lock:
            self._check_open()
            held = list(self._tokens.values())
        chosen = sorted(
            (
                HookHolder(run_id=rid, hook_id=c.hook_id, retained_until=c.retained_until)
                for rid, c in held
                if c.holds_at(now)
                and (run_id is None or rid == run_id)
                and (bound is None or (rid, c.hook_id) > bound)
            ),
            key=lambda h: (h.run_id, h.hook_id),
        )
        return hooks_page(chosen, limit)

    def _wakeups(self, workflow_names: Collection[str] | None) -> list[Wakeup]:
        found = [
            w
            for index in self._indexes.values()
            if workflow_names is None or index.summary.workflow_name in workflow_names
            for w in index.wakeups
        ]
        found.sort(key=lambda w: (w.due_at, w.run_id, w.kind, w.subject_id))
        return found

    async def _due_wakeups(
        self, now: datetime, limit: int, workflow_names: Collection[str] | None, /
    ) -> list[Wakeup]:
        """Wakeups due at `now`, oldest first, at most `limit` (of runs of `workflow_names`)."""
        async with self._lock:
            self._check_open()
            due = [w for w in self._wakeups(workflow_names) if w.due_at <= now]
        return due[: max(limit, 0)]

    async def _next_wakeup(self, workflow_names: Collection[str] | None, /) -> Wakeup | None:
        """The earliest pending wakeup (of a run of `workflow_names`), or None."""
        async with self._lock:
            self._check_open()
            found = self._wakeups(workflow_names)
        return found[0] if found else None

    # --- retention ----------------------------------------------------------------------------

    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` (see the protocol)."""
        async with self._lock:
            self._check_open()
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
                key=lambda s: (s.completed_at, s.run_id),
            )[: max(limit, 0)]
            doomed = {s.run_id for s in ended}
            for run_id in doomed:
                del self._rows[run_id]
                self._replace_index(run_id, None, terminal_before)
            if doomed:
                self._feed = [row for row in self._feed if row.run_id not in doomed]
        return len(doomed)
