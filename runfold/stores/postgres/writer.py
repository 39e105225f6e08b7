"""The PostgreSQL append: one round trip while a write slot is free, else a group commit.

An append takes a free write slot (`MAX_WRITES` of them); while every slot is taken, further
appends wait and go together in one transaction, one append per run and one write per run in
flight, sorted by run id so that batches lock runs in one order. While a group commit is in
flight, another starts only with enough appends (`OverlapChooser` says how many, by the rate
each choice gives); fewer wait to join the next one. Plain appends go through
`append_plain_batch`, the others through `append_batch`, each in a subtransaction of its own, so
each keeps its own all-or-nothing outcome. A write that finds a run's head settles the appends
queued for that run which expect another head (`GroupCommitWriter._prune`).

An append written alone is one statement: a plain one (onto a live run without hook claims or
wakeups) of one event `plain_append`, of more `append_plain_batch` of that one append, which
spare it `append_events`' upkeep of hooks and wakeups (the engine's appends are of this kind);
any other `append_events`, which also takes the plain ones those could not write.

Every write is bounded by its appends' deadline (`Deadline`). A write whose connection is lost
after it was sent, or that passes its deadline, is settled (`doubt.settle`) before its callers
hear of it: written, not written, or `CommitUnknown`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors

from runfold.kernel import (
    SequenceConflict,
    StoreTimeout,
    StoreUnavailable,
    TokenConflict,
)
from runfold.stores.postgres.append_sql import (
    POSITIONS_PER_TRANSACTION,
    SEQUENCE_CONFLICT,
    TOKEN_CONFLICT,
)
from runfold.stores.postgres.citus import routed_append
from runfold.stores.postgres.connections import Connection, Connections, Deadline, Identity
from runfold.stores.postgres.doubt import SETTLE_GRACE, settle
from runfold.stores.postgres.heads import HEAD
from runfold.stores.postgres.overlap import OverlapChooser
from runfold.stores.postgres.plain import plain_append
from runfold.stores.postgres.request import AppendRequest
from runfold.stores.postgres.schema import quote
from runfold.stores.postgres.wire import array

__all__ = ["BATCH_LIMIT", "MAX_WRITES", "RETRIES", "GroupCommitWriter", "plain_outcome"]

MAX_WRITES = 2
"""The append transactions a store keeps in flight (fewer if its pool is smaller).

Appends beyond wait for a group commit. Fewer slots than connections make larger batches,
which cost less client time and fewer commits per append: with eight and more writers, two
slots write more appends per second than one per connection."""
BATCH_LIMIT = 64
"""Appends per group commit, each a subtransaction.

A transaction keeps up to 64 subtransaction ids in shared memory before other sessions'
snapshots slow down.
"""
RETRIES = 3
"""Attempts for an append refused with serialization_failure (it wrote nothing)."""


_RETRY = errors.SerializationFailure.sqlstate
"""The state of an append refused before it wrote anything, which a new transaction may write."""


def plain_outcome(expected: int, outcome: int) -> tuple[str | None, int | None, str | None]:
    """An `append_plain_batch` row as `append_batch` would give it: (state, base, detail).

    Where the function could not say why it wrote nothing, the state is serialization_failure:
    the append is then written alone, as any append refused that way.
    """
    if outcome >= 0:
        return None, outcome, None
    head = -1 - outcome
    if head != expected:
        return SEQUENCE_CONFLICT, None, str(head)
    return _RETRY, None, None


class GroupCommitWriter:
    """A store's appends: written at once while a write slot is free, else in group commits."""

    def __init__(self, connections: Connections, schema: str) -> None:
        """The writer of the store in `schema`, over `connections`."""
        self._connections = connections
        self._schema = schema
        # Group commit: `_writing` transactions are in flight; appends arriving meanwhile wait
        # in `_queue` and go together in the next one.
        self._writing = 0
        self._max_writes = min(MAX_WRITES, connections.pool.max_size)
        self._batches = 0  # the group commits among `_writing`
        self._chooser = OverlapChooser()
        self._queue: list[AppendRequest] = []
        self._tickets = 0  # appends queued so far: see `_prune`
        self._in_flight: set[str] = set()  # the runs being written: see `_drain`
        self._drain_scheduled = False
        # Set while appends arrive together: each then waits a loop round for the others to
        # queue, so that they share a transaction instead of one going ahead alone.
        self._contended = False
        self._group_of: Callable[[str], int] | None = None  # a cluster's worker of a run
        # A plain append of one event alone: as `plain_append` (one server), else (a cluster, or
        # more events) as `append_plain_batch`.
        self._one_statement = True
        self._routed_sql: str | None = None  # a cluster's plain append of one event alone
        self.idle = asyncio.Event()
        """Set while no append is being written or waits to be."""
        self.idle.set()
        s = quote(schema)
        self._append_sql = f"SELECT {s}.append_events(%b)"
        self._plain_sql = plain_append(s)
        self._batch_sql = f"SELECT state, base, detail FROM {s}.append_batch(%b)"
        self._plain_batch_sql = f"SELECT * FROM {s}.append_plain_batch(%b)"
        self._head_sql = HEAD.format(s=s)

    def group_by_worker(self, group_of: Callable[[str], int]) -> None:
        """On a cluster: a group commit takes the appends of one worker only.

        `group_of` gives a run id's worker, so that no group commit is a two-phase commit. Every
        connection of the pool is a write slot: Citus sends a group commit's statements to the
        worker one after another, a round trip each, so a batch saves commits but not time,
        while appends in transactions side by side overlap their trips. A plain append of one
        event alone goes as `citus.routed_append`, one statement routed to the run's worker
        and committed there in one phase (where that writes nothing, through `append_events`);
        a plain append of more events through `append_plain_batch` (`citus.plain_batch_function`,
        a statement per event), not `plain_append`: Citus plans that one statement in several
        steps and commits it in two phases."""
        self._group_of = group_of
        self._one_statement = False
        self._routed_sql = routed_append(quote(self._schema), POSITIONS_PER_TRANSACTION)
        self._max_writes = self._connections.pool.max_size

    async def append(self, request: AppendRequest) -> int:
        """Write `request`; its base position (its events follow at base + 1, …).

        At once while a write slot is free and no other append is about; else in the next
        group commit (cancelled, the caller leaves; the batch goes on).
        """
        if (
            self._writing < self._max_writes
            and not self._queue
            and not self._contended
            and request.run_id not in self._in_flight
        ):  # a free write slot, and no sign of company: write it now
            self._start_write([request])
            try:
                return await self.append_one(request)
            finally:
                self._written([request])
        # join a group commit
        request.future = asyncio.get_running_loop().create_future()
        request.ticket = self._tickets
        self._tickets += 1
        self._queue.append(request)
        self._schedule_drain()
        return await request.future

    def _encode(self, batch: list[AppendRequest]) -> Any:
        """`batch` as the one `append_request[]` parameter of the batch functions."""
        return self._connections.requests(
            array(self._connections.request.oid, [r.wire() for r in batch])
        )

    async def _head(self, run_id: str) -> int:
        rows = await self._connections.fetch(self._head_sql, (run_id,))
        return int(rows[0][0]) if rows else 0

    def _schedule_drain(self) -> None:
        """Run `_drain` soon: after the callers woken together with this one have queued."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Start group commits of the queued appends in the free write slots, shared out evenly
        (the server writes them side by side), but none of fewer than `OverlapChooser.overlap`
        appends while another group commit is in flight.

        A run has one write in flight at most, and a batch one append per run: appends queued
        for one run mostly expect the same head, so all but one are bound to conflict, and
        `_prune` settles those without a round trip once that one is written. Sorted by run id
        (stable: one run's appends keep their order), so that batches lock runs in one order
        and cannot deadlock."""
        self._drain_scheduled = False
        self._contended = len(self._queue) > 1
        self._queue.sort(key=lambda r: r.run_id)
        while self._writing < self._max_writes:
            ready = len({r.run_id for r in self._queue} - self._in_flight)
            overlap = self._chooser.overlap
            if not ready or (self._batches and ready < overlap):
                return
            parts = max(1, min(self._max_writes - self._writing, ready // overlap))
            share = min(-(-ready // parts), BATCH_LIMIT)
            batch: list[AppendRequest] = []
            rest: list[AppendRequest] = []
            events = 0
            group, group_of_batch = self._group_of, 0
            for request in self._queue:
                if (
                    len(batch) < share
                    and request.run_id not in self._in_flight
                    and (not batch or group is None or group_of_batch == group(request.run_id))
                    and (not batch or batch[-1].run_id != request.run_id)
                    and (not batch or events + request.count < POSITIONS_PER_TRANSACTION)
                ):
                    if not batch and group is not None:
                        group_of_batch = group(request.run_id)
                    batch.append(request)
                    events += request.count
                else:
                    rest.append(request)
            self._queue = rest
            if not batch:
                return
            self._start_write(batch)
            self._batches += 1
            self._connections.background(self._write_batch(batch))

    def _start_write(self, batch: list[AppendRequest]) -> None:
        self._writing += 1
        self.idle.clear()
        self._chooser.busy()
        self._in_flight.update(request.run_id for request in batch)

    async def _write_batch(self, batch: list[AppendRequest]) -> None:
        try:
            await self._append_many(batch)
        except Exception as exc:  # nobody may wait forever
            for request in batch:
                request.settle(exc)
        except BaseException as exc:
            for request in batch:
                request.settle(StoreUnavailable(f"append abandoned: {exc!r}"))
            raise
        finally:
            self._batches -= 1
            self._written(batch)

    def _written(self, batch: list[AppendRequest]) -> None:
        """A write ended: start the next group commit, or note that the store is idle."""
        self._writing -= 1
        self._in_flight.difference_update(request.run_id for request in batch)
        self._chooser.written(len(batch))
        if self._queue:
            self._schedule_drain()
        elif self._writing == 0:
            self.idle.set()
            self._chooser.idle()

    async def append_one(self, request: AppendRequest) -> int:
        """Write one append in a transaction of its own; its base position."""
        sent_before = self._tickets
        try:
            base = await self._write_one(request)
        except SequenceConflict as conflict:
            self._prune({request.run_id: conflict.actual}, sent_before)
            raise
        self._prune({request.run_id: request.expected + request.count}, sent_before)
        return base

    async def _write_one(self, request: AppendRequest) -> int:
        for attempt in range(1, RETRIES + 1):
            conn: Connection | None = None
            identity: Identity | None = None
            try:
                async with Deadline(request.deadline, "an append"):
                    conn = await self._connections.getconn()
                    identity = self._connections.identities.get(conn)
                    try:
                        cursor = self._connections.cursors[conn]
                        plain = True
                        if request.single and self._routed_sql is not None:
                            # A cluster's one statement: no row, and append_events says why.
                            await cursor.execute(self._routed_sql, request.plain_parameters())
                            row = await cursor.fetchone()
                            if row is not None:
                                return int(row[0])
                            plain = False
                        elif request.single and self._one_statement:
                            await cursor.execute(self._plain_sql, request.plain_parameters())
                        elif request.plain:  # of several events: no upkeep of hooks or wakeups
                            await cursor.execute(self._plain_batch_sql, (self._encode([request]),))
                        else:
                            plain = False
                        if plain:
                            row = await cursor.fetchone()
                            assert row is not None
                            state, _, detail = plain_outcome(request.expected, row[0])
                            if state is None:
                                return int(row[0])
                            refusal = await self._refusal(request, state, detail)
                            if refusal is not None:
                                raise refusal
                        # Not plain, or the statement could not say why it wrote nothing.
                        await cursor.execute(
                            self._append_sql, (self._connections.request(request.wire()),)
                        )
                        row = await cursor.fetchone()
                    finally:
                        await self._connections.putconn(conn)
                assert row is not None
                return int(row[0])
            except StoreTimeout as timeout:
                if conn is None:
                    raise  # no connection in time: nothing was sent
                [outcome] = await self._in_doubt([request], identity, timeout)
            except psycopg.Error as exc:
                if isinstance(exc, errors.SerializationFailure) and attempt < RETRIES:
                    continue  # refused before writing anything: a younger transaction passes
                if isinstance(exc, errors.ReadOnlySqlTransaction) and conn is not None:
                    self._connections.discard(conn)
                if conn is None or not (conn.closed or exc.sqlstate is None):
                    refusal = await self._refusal(request, exc.sqlstate, exc.diag.message_detail)
                    if refusal is not None:
                        raise refusal from None
                    raise self._connections.translate(exc) from exc
                [outcome] = await self._in_doubt([request], identity, exc)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        raise AssertionError("unreachable")

    async def _in_doubt(
        self, requests: list[AppendRequest], identity: Identity | None, cause: Exception
    ) -> list[int | Exception]:
        """The outcomes of `requests`, whose connection was lost (or deadline passed) after
        they were sent: settled by reading their runs back (`doubt.settle`)."""
        if isinstance(cause, psycopg.Error):
            cause = self._connections.translate(cause)
        deadline = min(r.deadline for r in requests) + SETTLE_GRACE
        outcomes = await settle(self._connections, self._schema, requests, identity, deadline)
        for n, outcome in enumerate(outcomes):
            if not isinstance(outcome, Exception):
                continue
            if isinstance(cause, StoreTimeout) and type(outcome) is StoreUnavailable:
                # Not written, because the deadline passed: say so.
                outcome = outcomes[n] = StoreTimeout(f"{cause}; {outcome}")
            outcome.__cause__ = cause
        return outcomes

    async def _append_many(self, batch: list[AppendRequest]) -> None:
        """Write `batch` in one transaction and settle each append's future."""
        if len(batch) == 1:
            await self._settle_alone(batch[0])
            return
        sent_before = self._tickets
        requests = self._encode(batch)
        plain = all(r.plain for r in batch)  # a batch's runs are distinct (`_drain`)
        rows: Sequence[tuple[Any, ...]]  # (state, base, detail) per append, as `append_batch`
        conn: Connection | None = None
        identity: Identity | None = None
        try:
            async with Deadline(min(r.deadline for r in batch), "a group commit"):
                conn = await self._connections.getconn()
                identity = self._connections.identities.get(conn)
                try:
                    cursor = self._connections.cursors[conn]
                    if plain:
                        await cursor.execute(self._plain_batch_sql, (requests,))
                        rows = [
                            plain_outcome(r.expected, o)
                            for r, (o,) in zip(batch, await cursor.fetchall(), strict=True)
                        ]
                    else:
                        await cursor.execute(self._batch_sql, (requests,))
                        rows = await cursor.fetchall()
                finally:
                    await self._connections.putconn(conn)
        except (psycopg.Error, StoreTimeout) as exc:
            if conn is None:  # no connection: nothing was sent
                failure = exc if isinstance(exc, StoreTimeout) else self._connections.translate(exc)
                for request in batch:
                    request.settle(failure)
                return
            if isinstance(exc, StoreTimeout) or conn.closed or exc.sqlstate is None:
                # Lost after it was sent (or past its deadline): whether the batch committed is
                # unknown until its runs are read back.
                outcomes = await self._in_doubt(batch, identity, exc)
                for request, outcome in zip(batch, outcomes, strict=True):
                    request.settle(outcome)
                return
            # The server refused the whole transaction (a deadlock, say): nothing was written,
            # so each append alone gets its own outcome.
            for request in batch:
                await self._settle_alone(request)
            return
        heads: dict[str, int] = {}
        alone: list[AppendRequest] = []
        for request, (state, base, detail) in zip(batch, rows, strict=True):
            if state is None:
                request.settle(int(base))
                heads[request.run_id] = request.expected + request.count
            elif state == _RETRY:
                alone.append(request)
            else:
                refusal = await self._refusal(request, state, detail)
                assert refusal is not None  # append_batch only catches the refusals
                request.settle(refusal)
                if isinstance(refusal, SequenceConflict):
                    heads[request.run_id] = refusal.actual
        self._prune(heads, sent_before)
        for request in alone:
            await self._settle_alone(request)

    def _prune(self, heads: dict[str, int], sent_before: int) -> None:
        """Settle the queued appends that a write just found doomed: those to a run in `heads`
        (a head the run had while the write ran: the one it left, or the one it conflicted
        with) that expect another head, and were queued before the write was sent (`ticket <
        sent_before`), hence were waiting at that moment. Each conflicts there, with that head,
        and no round trip is spent to learn it."""
        if not heads or not self._queue:
            return
        waiting = []
        for request in self._queue:
            head = heads.get(request.run_id)
            if head is None or head == request.expected or request.ticket >= sent_before:
                waiting.append(request)
            else:
                request.settle(SequenceConflict(request.run_id, request.expected, head))
        self._queue = waiting

    async def _settle_alone(self, request: AppendRequest) -> None:
        try:
            request.settle(await self.append_one(request))
        except Exception as exc:
            request.settle(exc)

    async def _refusal(
        self, request: AppendRequest, sqlstate: str | None, detail: str | None
    ) -> Exception | None:
        """The runfold error for an append refused with `sqlstate`, or None if not a refusal."""
        if sqlstate == SEQUENCE_CONFLICT:
            return SequenceConflict(request.run_id, request.expected, int(detail or 0))
        if sqlstate == TOKEN_CONFLICT:
            holder = json.loads(detail or "{}")
            token = request.claims[holder["claim"] - 1].token
            return TokenConflict(token, holder["run_id"], holder["hook_id"])
        if sqlstate == errors.UniqueViolation.sqlstate:  # the primary key backstop
            return SequenceConflict(
                request.run_id, request.expected, await self._head(request.run_id)
            )
        return None
