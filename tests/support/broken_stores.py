"""Deliberately broken stores, one defect each, to prove the conformance kit has teeth.

Each is a `MemoryStore` with one step rewritten the way a plausible bug would have it (a check
outside the critical section, a forgotten filter, an off-by-one cursor, …). `CAUGHT_BY` names the
conformance check that must fail for each; `tests/stores/test_conformance.py` runs the kit against
them.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    Envelope,
    Event,
    HookHolder,
    Limits,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    SequenceConflict,
    Wakeup,
    WorkerLease,
    correlation_id,
    encode_event,
    project_run,
)
from runfold.stores.memory import MemoryStore, _Row
from runfold.stores.paging import decode_cursor, encode_cursor
from runfold.stores.protocol import ReplayedRun
from runfold.stores.time_keys import time_key

_LIMITS = Limits()
ALL = 1_000_000
"""More than any check lists."""


def _rows(
    run_id: str,
    head: int,
    events: Sequence[Event],
    recorded_at: datetime,
    first_position: int,
    payload_limit: int | None = None,
) -> list[_Row]:
    """The stored rows of `events` appended after `head`, from `first_position` on."""
    rows = []
    for offset, event in enumerate(events, start=1):
        event_type, version, payload = encode_event(event)
        rows.append(
            _Row(
                run_id=run_id,
                sequence=head + offset,
                type=event_type,
                schema_version=version,
                correlation_id=correlation_id(event),
                payload=payload[:payload_limit],
                recorded_at=recorded_at,
                position=first_position + offset - 1,
            )
        )
    return rows


def _envelopes(rows: Sequence[_Row], events: Sequence[Event]) -> list[Envelope]:
    return [
        Envelope(
            run_id=row.run_id,
            sequence=row.sequence,
            event=event,
            recorded_at=row.recorded_at,
            position=row.position,
        )
        for row, event in zip(rows, events, strict=True)
    ]


class _Appending(MemoryStore):
    """A MemoryStore whose append is spelled out step by step, so a mutant can misplace one."""

    payload_limit: int | None = None

    def _write_rows(
        self, run_id: str, events: Sequence[Event], recorded_at: datetime
    ) -> list[Envelope]:
        """Write the batch at the run's head and into the feed (no checks, no index)."""
        rows = self._rows.setdefault(run_id, [])
        new = _rows(run_id, len(rows), events, recorded_at, self._next_position, self.payload_limit)
        self._next_position += len(new)
        rows.extend(new)
        self._feed.extend(new)
        return _envelopes(new, events)

    def _check_head(self, run_id: str, expected: int, position: int | None = None) -> None:
        rows = self._rows.get(run_id, [])
        if expected != len(rows) or (
            position is not None and rows and rows[-1].position != position
        ):
            raise SequenceConflict(run_id, expected, len(rows))

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
        for event in events:
            encode_event(event)
        async with self._lock:
            self._check_open()
            self._check_head(run_id, expected_sequence, expected_position)
            self._check_claims(run_id, index, recorded_at)
            envelopes = self._write_rows(run_id, events, recorded_at)
            self._replace_index(run_id, index, recorded_at)
            return envelopes


class SkipsHeadCheck(_Appending):
    """Appends at the head whatever sequence the caller expected."""

    def _check_head(self, run_id: str, expected: int, position: int | None = None) -> None:
        return


class HeadCheckOutsideTransaction(_Appending):
    """Checks the head, lets other tasks run (a round trip to the database), then writes without
    checking again: right for one writer, wrong when two race."""

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
        async with self._lock:
            self._check_open()
            self._check_head(run_id, expected_sequence, expected_position)
        await asyncio.sleep(0)
        async with self._lock:
            self._check_claims(run_id, index, recorded_at)
            envelopes = self._write_rows(run_id, events, recorded_at)
            self._replace_index(run_id, index, recorded_at)
            return envelopes


class BatchNotAtomic(_Appending):
    """Writes a batch event by event, encoding each as it goes: a failure half-way leaves the
    first events behind (and no index rows)."""

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
        async with self._lock:
            self._check_open()
            self._check_head(run_id, expected_sequence, expected_position)
            self._check_claims(run_id, index, recorded_at)
            written = [self._write_rows(run_id, [event], recorded_at)[0] for event in events]
            self._replace_index(run_id, index, recorded_at)
            return written


class IndexOutsideTransaction(_Appending):
    """Commits the events, then writes the index rows in a second step after an await: readers
    see events without their index, and a cancellation between the steps loses the index."""

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
        async with self._lock:
            self._check_open()
            self._check_head(run_id, expected_sequence, expected_position)
            self._check_claims(run_id, index, recorded_at)
            envelopes = self._write_rows(run_id, events, recorded_at)
        await asyncio.sleep(0)
        async with self._lock:
            self._replace_index(run_id, index, recorded_at)
        return envelopes


class TerminalIndexIgnored(_Appending):
    """Skips the index update of an append that ends the run (a "nothing left to index"
    shortcut): the summary stays live, tokens stay held, wakeups stay due."""

    def _replace_index(self, run_id: str, index: RunIndex | None, now: datetime) -> None:
        if index is not None and index.summary.status in TERMINAL_RUN_STATUSES:
            return
        super()._replace_index(run_id, index, now)


class TokenIgnoresOtherRuns(_Appending):
    """Never checks a claimed token against other runs' holders: the last claim wins."""

    def _check_claims(self, run_id: str, index: RunIndex, now: datetime) -> None:
        return


_NEVER = datetime.min.replace(tzinfo=UTC)
"""Before every retention deadline: asking "live at _NEVER?" ignores `retained_until`."""


class RetentionIgnored(_Appending):
    """Treats a retained hook as holding its token forever: `retained_until` is ignored."""

    def _check_claims(self, run_id: str, index: RunIndex, now: datetime) -> None:
        super()._check_claims(run_id, index, _NEVER)

    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        return await super()._find_hook(token, _NEVER)

    async def _list_hooks(
        self, run_id: str | None, cursor: str | None, limit: int, now: datetime, /
    ) -> Page[HookHolder]:
        return await super()._list_hooks(run_id, cursor, limit, _NEVER)


class DescendingReadsWrong(_Appending):
    """Reads descending by reversing the ascending answer: `after` and `limit` apply to the
    wrong end."""

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        ascending = await super()._read(run_id, after, limit, False)
        return ascending[::-1] if descending else ascending


class _Correlating(_Appending):
    """A MemoryStore whose correlation reads select from `_matching(run_id, correlation_id)`, so a
    mutant can gather them wrongly."""

    def _matching(self, run_id: str, correlation_id: str) -> list[_Row]:
        return [r for r in self._rows.get(run_id, ()) if r.correlation_id == correlation_id]

    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        async with self._lock:
            self._check_open()
            rows = self._select(self._matching(run_id, correlation_id), after, limit, descending)
        return self._envelopes(rows)


class CorrelationLeaks(_Correlating):
    """Filters correlation reads by correlation id only, forgetting the run."""

    def _matching(self, run_id: str, correlation_id: str) -> list[_Row]:
        return [row for row in self._feed if row.correlation_id == correlation_id]


class _CursorRewriting(_Appending):
    """A MemoryStore whose `list_runs` resumes from `_resume(cursor)` instead of the cursor."""

    @staticmethod
    def _resume(micros: str, run_id: str) -> str:
        return encode_cursor(micros, run_id)

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
        resumed = None if cursor is None else self._resume(*decode_cursor(cursor, 2))
        return await super()._list_runs(
            workflow_name, status, parent_run_id, created_before, resumed, limit
        )


class CursorRepeatsARun(_CursorRewriting):
    """Resumes a listing at its cursor inclusively (`<=` for `<`): every page repeats the last run
    of the page before."""

    @staticmethod
    def _resume(micros: str, run_id: str) -> str:
        return encode_cursor(micros, run_id + "\x00")


class CursorSkipsTies(_CursorRewriting):
    """Resumes a listing by `created_at` alone: runs created at the same instant as the last one
    of a page are skipped."""

    @staticmethod
    def _resume(micros: str, run_id: str) -> str:
        return encode_cursor(micros, "")


class FeedExposesUncommitted(_Appending):
    """Takes feed positions when an append starts but publishes its rows to the feed when it
    commits, after some I/O (longer for smaller batches): a later position can be visible before
    an earlier one."""

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
        async with self._lock:
            self._check_open()
            self._check_head(run_id, expected_sequence, expected_position)
            self._check_claims(run_id, index, recorded_at)
            rows = self._rows.setdefault(run_id, [])
            new = _rows(run_id, len(rows), events, recorded_at, self._next_position)
            self._next_position += len(new)
            rows.extend(new)
            self._replace_index(run_id, index, recorded_at)
        for _ in range(4 - min(len(new), 3)):
            await asyncio.sleep(0)
        async with self._lock:
            for row in new:
                bisect.insort(self._feed, row, key=lambda r: r.position)
        return _envelopes(new, events)


class TruncatesPayload(_Appending):
    """Keeps at most 65,535 payload bytes (a BLOB column's size), cutting larger events short."""

    payload_limit = 65_535


class _Retaining(_Appending):
    """A MemoryStore whose retention asks `_retains(index, cutoff)` whether a run's hooks keep
    it, so a mutant can ask it wrongly."""

    @staticmethod
    def _retains(index: RunIndex, cutoff: datetime) -> bool:
        return bool(index.claims_at(cutoff))

    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
        async with self._lock:
            self._check_open()
            doomed = sorted(
                (
                    index.summary
                    for index in self._indexes.values()
                    if index.summary.status in TERMINAL_RUN_STATUSES
                    and index.summary.completed_at is not None
                    and index.summary.completed_at < terminal_before
                    and not self._retains(index, terminal_before)
                    and (run_ids is None or index.summary.run_id in run_ids)
                ),
                key=lambda s: (s.completed_at, s.run_id),
            )[: max(limit, 0)]
            for summary in doomed:
                del self._rows[summary.run_id]
                self._replace_index(summary.run_id, None, terminal_before)
            gone = {s.run_id for s in doomed}
            self._feed = [row for row in self._feed if row.run_id not in gone]
        return len(doomed)


class DeletesRetainedRuns(_Retaining):
    """Retention deletes every run that ended before the cutoff, forgetting to ask whether one of
    its hooks still retains its token."""

    @staticmethod
    def _retains(index: RunIndex, cutoff: datetime) -> bool:
        return False


# --- subtle defects: each passed the kit before it checked the edge it breaks ---------------------


class HasMoreWhenFull(_Appending):
    """Says a `list_runs` page has more whenever it is full (`len(page) == limit`) instead of
    looking one past it: an exactly full last page promises a next page that is empty."""

    async def list_runs(self, **filters: Any) -> Page[RunSummary]:
        page = await super().list_runs(**filters)
        if page.has_more or not page.items or len(page.items) < filters.get("limit", 20):
            return page
        last = page.items[-1]
        resume = encode_cursor(time_key(last.created_at), last.run_id)
        return Page(items=page.items, cursor=resume, has_more=True)


class RetainedToCutoffKept(_Retaining):
    """Retention keeps a run whose hook retains its token until exactly the cutoff (`>=` where
    `>` is right): that hook holds nothing at the cutoff, yet its run is not deleted."""

    @staticmethod
    def _retains(index: RunIndex, cutoff: datetime) -> bool:
        return any(c.retained_until is None or c.retained_until >= cutoff for c in index.hooks)


class CorrelationByRecordedAt(_Correlating):
    """Orders correlation reads by `recorded_at` (then sequence) instead of by sequence: right
    as long as the clock never steps back."""

    def _matching(self, run_id: str, correlation_id: str) -> list[_Row]:
        found = super()._matching(run_id, correlation_id)
        return sorted(found, key=lambda r: (r.recorded_at, r.sequence))


class KeepsTimeOffsets(_Appending):
    """Keeps the index rows' times with the offset they were given (as a store of ISO strings
    would): summaries, retention deadlines and wakeups read back in the caller's zone, not UTC
    (equal instants, so a check comparing values alone passes)."""

    @staticmethod
    def _stored_index(index: RunIndex) -> RunIndex:
        return index


class RefusesNul(_Appending):
    """Refuses attribute keys and values holding U+0000 (a C string's or a PostgreSQL text
    column's limit) when it checks an append's index rows, though the kernel allows them."""

    def _check_claims(self, run_id: str, index: RunIndex, now: datetime) -> None:
        if any("\x00" in key + value for key, value in index.summary.attributes.items()):
            raise ValueError("attribute text may not hold U+0000")
        super()._check_claims(run_id, index, now)


class WakeupArgumentsUnchecked(MemoryStore):
    """`due_wakeups` skips the shared argument checks: a naive `now` compares with nothing and
    answers `[]` (as a dict-backed store does) instead of refusing it."""

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        async with self._lock:
            self._check_open()
            if now.utcoffset() is None:
                return []
            return [w for w in self._wakeups(workflow_names) if w.due_at <= now][: max(limit, 0)]


class NothingToDoWhenClosed(MemoryStore):
    """`get_runs([])` answers `[]` before looking at whether the store is closed: there is
    nothing to fetch, so it never reaches the check."""

    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        if not run_ids:
            return []
        return await super()._get_runs(run_ids)


class NegativeLimitUnbounded(MemoryStore):
    """A negative `limit` of `read` means "no limit", as SQLite's `LIMIT -1` does, where the
    contract says it means 0."""

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        unbounded = limit is not None and limit < 0
        return await super()._read(run_id, after, None if unbounded else limit, descending)


def _replayed(history: Sequence[Envelope], limits: Limits) -> ReplayedRun | None:
    if not history:
        return None
    return ReplayedRun(
        snapshot=project_run(history, limits=limits),
        first_position=history[0].position,
        last_position=history[-1].position,
    )


class ReplaysAllButTheLast(_Appending):
    """Offers `replay`, but folds the run's history without its last event."""

    async def replay(self, run_id: str, *, limits: Limits = _LIMITS) -> ReplayedRun | None:
        return _replayed((await self.read(run_id))[:-1], limits)


class ReplaysWithoutLimits(_Appending):
    """Offers `replay`, but folds with the default limits whatever it is given."""

    async def replay(self, run_id: str, *, limits: Limits = _LIMITS) -> ReplayedRun | None:
        return _replayed(await self.read(run_id), _LIMITS)


class RenewsLapsedLease(MemoryStore):
    """Renews a worker's lease whether or not it lapsed (an upsert without its condition)."""

    async def renew_lease(self, worker_id: str, *, lease_until: datetime, now: datetime) -> bool:
        held = self._leases.get(worker_id)
        started = held.started_at if held is not None else now
        self._leases[worker_id] = WorkerLease(
            worker_id=worker_id, lease_until=lease_until, started_at=started
        )
        return True


class OrphansNeedALeaseRow(MemoryStore):
    """Finds orphans by their owner's lapsed lease only (an inner join): misses the runs of
    owners that never held a lease, or dropped theirs."""

    async def orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        found = await super().orphaned_runs(now, limit=ALL, workflow_names=workflow_names)
        leased = [s for s in found if s.owner_id in self._leases]
        return leased[: max(limit, 0)]


class HandsAWakeupTwice(MemoryStore):
    """Hands out a run with a due wakeup whether or not another worker holds it (the hold
    checked for queued runs and orphans, forgotten for wakeups): two workers drive one timer."""

    def _held(self, summary: RunSummary, now: datetime) -> str | None:
        index = self._indexes[summary.run_id]
        if summary.status != "pending" and any(w.due_at <= now for w in index.wakeups):
            return None
        return super()._held(summary, now)


class SignalsNothing(MemoryStore):
    """Wakes no waiter after an append (the post forgotten): its waits only ever time out."""

    def _post(self, index: RunIndex) -> None:
        pass


CAUGHT_BY: dict[type[MemoryStore], str] = {
    SkipsHeadCheck: "test_append_stale_sequence_refused",
    HeadCheckOutsideTransaction: "test_racing_writers_one_wins",
    BatchNotAtomic: "test_append_batch_all_or_nothing",
    IndexOutsideTransaction: "test_readers_never_see_partial_append",
    TerminalIndexIgnored: "test_index_follows_run_end",
    TokenIgnoresOtherRuns: "test_token_conflict_across_runs",
    RetentionIgnored: "test_retained_token_held_until_deadline",
    DescendingReadsWrong: "test_read_descending_ranges",
    CorrelationLeaks: "test_read_by_correlation_scoped_to_run",
    CursorRepeatsARun: "test_list_runs_pagination_visits_every_run_once",
    CursorSkipsTies: "test_list_runs_pagination_visits_every_run_once",
    FeedExposesUncommitted: "test_tailing_reader_never_skips",
    TruncatesPayload: "test_round_trip_payload_bytes",
    DeletesRetainedRuns: "test_delete_runs_before_cutoff",
    HasMoreWhenFull: "test_pages_end_exactly",
    RetainedToCutoffKept: "test_delete_runs_at_the_cutoff",
    CorrelationByRecordedAt: "test_clock_stepping_back_keeps_sequence_order",
    KeepsTimeOffsets: "test_times_read_back_in_utc",
    RefusesNul: "test_nul_in_every_text_field",
    WakeupArgumentsUnchecked: "test_arguments_refused_alike",
    NothingToDoWhenClosed: "test_closed_store_refuses_calls",
    NegativeLimitUnbounded: "test_arguments_at_their_bounds",
    RenewsLapsedLease: "test_lease_renewed_until_it_lapses",
    OrphansNeedALeaseRow: "test_orphaned_runs_are_live_runs_without_a_lease",
    HandsAWakeupTwice: "test_racing_claimers_never_get_one_run_twice",
    SignalsNothing: "test_run_end_wakes_its_waiter",
}
"""Each broken store and the conformance check that must catch its defect."""
