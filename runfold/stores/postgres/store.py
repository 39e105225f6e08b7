"""`PostgresStore`: the store class, composed of its connections, writer and feed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict

from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    Envelope,
    Event,
    HookHolder,
    InvalidArgument,
    Limits,
    RunIndex,
    RunSummary,
    SequenceConflict,
    StoreUnavailable,
    Wakeup,
    make_envelope,
)
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.stores import arguments, conninfo
from runfold.stores._sql import (
    IndexReads,
    envelopes_from_rows,
    holder_from_row,
    replay_rows,
    run_events_query,
    summary_from_row,
    token_holder_query,
    wakeup_from_row,
    wakeups_query,
)
from runfold.stores.base import StoreBase
from runfold.stores.due_work import DEDUP_GRACE
from runfold.stores.postgres import citus
from runfold.stores.postgres.append_sql import POSITIONS_PER_TRANSACTION
from runfold.stores.postgres.connections import (
    Connection,
    Connections,
    Deadline,
    Pool,
    ReconnectingPool,
)
from runfold.stores.postgres.due_work import PostgresDueWork
from runfold.stores.postgres.feed import Feed
from runfold.stores.postgres.heads import HEAD, summary_columns
from runfold.stores.postgres.leases import PostgresLeases
from runfold.stores.postgres.placement import Placement
from runfold.stores.postgres.request import AppendRequest
from runfold.stores.postgres.retention import DELETE_RUNS, DROP_UNBORN_RUN
from runfold.stores.postgres.schema import (
    SCHEMA_VERSION,
    prepare_schema,
    quote,
    request_types,
)
from runfold.stores.postgres.writer import GroupCommitWriter
from runfold.stores.protocol import ReplayedRun
from runfold.stores.time_keys import time_key

__all__ = ["PostgresStore"]


class PostgresStore(IndexReads, PostgresLeases, PostgresDueWork, StoreBase):
    """An `EventStore` in a PostgreSQL schema, opened with `await PostgresStore.open(dsn)`.

    It keeps worker leases too (`WorkerLeases`), so a fleet of workers can share the schema.
    """

    MARK = "%s"

    def __init__(self, pool: Pool, schema: str, *, owns_pool: bool, feed_wait: float) -> None:
        """Use `PostgresStore.open`; this wraps a pool it has already opened."""
        self._schema = schema
        self._s = quote(schema)
        self._connections = Connections(pool, schema, owns_pool=owns_pool)
        self._fetch = self._connections.fetch
        self._writer = GroupCommitWriter(self._connections, schema)
        self._feed = Feed(self._connections, schema, feed_wait=feed_wait)
        self._distributed = False  # asked for at open, or found: see `runfold...citus`
        self.SUMMARY = summary_columns(self._s)
        self.migrated_from: int | None = None
        """The schema version this store found and migrated from (0: it created the schema), or
        None while it has migrated nothing (the schema was current)."""

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        pool: Pool | None = None,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        timeout: float = 10.0,
        feed_wait: float = 0.1,
        migrate: bool = True,
        call_timeout: float = 30.0,
        distributed: bool = False,
    ) -> PostgresStore:
        """Open the store in `schema` of the database `dsn` names, or on an existing `pool`.

        An existing pool's connections must be in autocommit mode; the store leaves it open on
        close.
        Without `schema`, a `schema` query parameter of a URL `dsn` names it
        (`postgresql://host/db?schema=tenant_a`), else it is `runfold`.

        `pool_min`/`pool_max` size the pool the store creates; `timeout` is how long a call
        (and `open` itself) waits for a connection before `StoreUnavailable`. `read_all` serves
        only events of transactions older than every one still running, anywhere on the server;
        it waits up to `feed_wait` seconds for those running when it is called, so that it
        returns what committed before the call unless an older transaction stays open. With
        `migrate` (the default) the schema is created or upgraded first (see `migrate`); without
        it, a schema that is missing or older is refused, so an application without DDL rights
        can run on a schema migrated beforehand.

        `distributed` lays the schema out on a Citus cluster (`dsn` names its coordinator):
        `migrate` distributes its tables by run (hook tokens by token) if they are not yet. A
        schema found distributed is served as one whatever `distributed` says
        (docs/scaling.md).

        `call_timeout` is every call's deadline, in seconds: a call that has not finished by then
        (a hung server, a network gone silent) raises `StoreTimeout`, a `StoreUnavailable`; an
        append is settled first (`doubt`), so it returns its envelopes if it committed, and raises
        `CommitUnknown` if that cannot be known within half a second more. `timeout(seconds)`
        overrides it for the calls of a block. The server enforces it too on the connections the
        store makes: their `statement_timeout` is `call_timeout` (and `connect_timeout`, unless
        the connection string sets one, is `timeout`).

        Raises `StoreOpenError` for a schema written by a newer runfold, a schema that is not
        runfold's, or (without `migrate`) one that needs migrating; `StoreUnavailable` when no
        connection can be made within `timeout`; `ValueError` for bad arguments, a connection
        string libpq cannot parse among them. No message names the password, however it was
        given (URL, `?password=`, a `password=` keyword, `PGPASSWORD`).
        """
        if (dsn is None) == (pool is None):
            raise ValueError("PostgresStore.open needs a dsn or a pool (one of them)")
        if not call_timeout > 0:
            raise ValueError("call_timeout must be a positive number of seconds")
        if dsn is not None:
            dsn, named = conninfo.split_schema(dsn)
            schema = schema or named
            conninfo.check(dsn)  # a malformed string fails here, its password withheld
        schema = schema or "runfold"
        if pool is not None:
            store = cls(pool, schema, owns_pool=False, feed_wait=feed_wait)
            store._distributed = distributed
            store._connections.call_timeout = call_timeout
            try:
                async with store._connections.connection() as conn:
                    await store._prepare_schema(conn, migrate)
            except BaseException:
                await store.close()
                raise
            return store
        # A connection of its own for the schema work, made before the pool: a server that is
        # down or refuses the login fails here at once, with its reason, where the pool would
        # retry until `timeout` (and log a warning of its own for each try).
        try:
            probe = await AsyncConnection.connect(
                dsn or "", autocommit=True, connect_timeout=max(2, round(timeout))
            )
        except psycopg.Error as exc:
            refusal: str | None = conninfo.scrub(str(exc), dsn or "")
        else:
            refusal = None
        if refusal is not None:  # raised out here: the driver's error is not kept as context
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {refusal}")
        async with probe:
            kwargs: dict[str, Any] = {"autocommit": True}
            if "connect_timeout" not in conninfo_to_dict(dsn or ""):
                kwargs["connect_timeout"] = max(2, round(timeout))
            pool = ReconnectingPool(
                dsn or "",
                min_size=pool_min,
                max_size=pool_max,
                kwargs=kwargs,
                timeout=timeout,
                open=False,
                name=f"runfold-{schema}",
                configure=_server_deadline(call_timeout),
            )
            store = cls(pool, schema, owns_pool=True, feed_wait=feed_wait)
            store._distributed = distributed
            store._connections.call_timeout = call_timeout
            try:
                await pool.open(wait=False)  # its connections are made in the background meanwhile
                store._connections.guard_exit()
                await store._prepare_schema(probe, migrate)
            except BaseException:
                await store.close()
                raise
        return store

    async def close(self) -> None:
        """Close the store; later calls raise `StoreClosed`, closing again is harmless."""
        if self._connections.closed:
            return
        self._connections.closed = True
        await self._writer.idle.wait()  # appends already accepted are written
        await self._feed.close()  # the last NOTIFY goes now; subscribers wake, find it closed
        await self._connections.close()

    def _check_open(self) -> None:
        self._connections.check_open()

    def timeout(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """`with store.timeout(2.0):` the store's calls in the block have `seconds` each.

        That is, instead of `call_timeout`, for the calls this task makes in the block and those
        of the tasks it starts there.
        The server's `statement_timeout` stays `call_timeout`. Raises `ValueError` unless
        `seconds` is positive.
        """
        return self._connections.timeout(seconds)

    @property
    def schema_version(self) -> int:
        """The schema version this runfold writes and reads (`SchemaMigrator`)."""
        return SCHEMA_VERSION

    # --- schema -------------------------------------------------------------------------------

    async def migrate(self) -> None:
        """Create or upgrade the store's schema to this runfold's `SCHEMA_VERSION`.

        Idempotent, and safe when many processes run it at once: they queue on an advisory
        lock and find the work done. A schema already current is only read (no lock, no DDL).
        Raises `StoreOpenError` for a schema written by a newer runfold or one that is not
        runfold's; `StoreUnavailable` if the database cannot be reached.
        """
        self._check_open()
        async with self._connections.connection() as conn:
            await self._prepare_schema(conn, migrate=True)

    async def _prepare_schema(self, conn: Connection, migrate: bool) -> None:
        """Check the schema's version on `conn`, migrating it first if `migrate`; learn the
        type of `append_request`."""
        try:
            found = await prepare_schema(conn, self._schema, migrate, distributed=self._distributed)
            if found is not None:
                self.migrated_from = found
            self._distributed = await citus.is_distributed(conn, self._schema)
            if self._distributed:
                placement = await Placement.read(conn, self._s)
                self._writer.group_by_worker(placement.group)
            self._connections.learn_types(*await request_types(conn, self._schema))
        except psycopg.Error as exc:
            raise self._connections.translate(exc) from exc

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

        `EventStore.append_if_sequence`, with its errors. One round trip while a pool
        connection is free; appends made while every one is writing are written together, each
        with its own outcome.
        """
        if len(events) >= POSITIONS_PER_TRANSACTION:
            limit = f"{POSITIONS_PER_TRANSACTION - 1:,}"
            raise InvalidArgument("events", f"holds more than this store takes at once ({limit})")
        request = AppendRequest(
            run_id, expected_sequence, events, index, recorded_at, expected_position
        )
        self._check_open()
        request.deadline = self._connections.deadline()
        base = await self._writer.append(request)
        self._feed.announce(index)
        return [
            make_envelope(run_id, expected_sequence + n, event, recorded_at, base + n)
            for n, event in enumerate(events, start=1)
        ]

    # --- reads --------------------------------------------------------------------------------

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        """The run's envelopes after `after`, at most `limit` (`EventStore.read`)."""
        return await self._envelopes(run_id, None, after, limit, descending)

    async def replay(self, run_id: str, *, limits: Limits = DEFAULT_LIMITS) -> ReplayedRun | None:
        """The run's snapshot folded as its rows are read (`Replayer.replay`)."""
        arguments.check_text(run_id, "run_id")
        rows = await self._read_rows(run_id, None, 0, None, False)
        return replay_rows(rows, run_id, limits)

    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        """The run's envelopes of one correlation id (`EventStore.read_by_correlation`)."""
        return await self._envelopes(run_id, correlation_id, after, limit, descending)

    async def _envelopes(
        self,
        run_id: str,
        correlation: str | None,
        after: int,
        limit: int | None,
        descending: bool,
    ) -> list[Envelope]:
        rows = await self._read_rows(run_id, correlation, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def _read_rows(
        self,
        run_id: str,
        correlation: str | None,
        after: int,
        limit: int | None,
        descending: bool,
    ) -> list[tuple[Any, ...]]:
        sql, params = run_events_query(
            f"{self._s}.events", "%s", run_id, correlation, after, descending
        )
        params.append(None if limit is None else max(limit, 0))  # LIMIT NULL: every row
        return await self._fetch(sql, params)

    async def _head(self, run_id: str, /) -> int:
        """The run's last sequence; 0 for an unknown run."""
        rows = await self._fetch(HEAD.format(s=self._s), (run_id,))
        return int(rows[0][0]) if rows else 0

    async def _read_all(self, after_position: int, limit: int, /) -> list[Envelope]:
        """The global feed after `after_position`, in position order (`EventStore.read_all`)."""
        return await self._feed.read_all(after_position=after_position, limit=limit)

    def subscribe(
        self, after_position: int = 0, *, poll_interval: float = 1.0, batch: int = 1000
    ) -> AsyncGenerator[Envelope, None]:
        """Every envelope of the feed after `after_position`, in feed order, as it commits.

        An endless async iterator: end it with `aclose()`, e.g. via `contextlib.aclosing`.

        Between batches it waits on `LISTEN`, on a pooled connection it keeps while it runs,
        and reads again at least every `poll_interval` seconds: the feed also moves when an
        older transaction ends, and notifications are not durable. Raises what `read_all`
        raises: `StoreUnavailable`, `StoreClosed`, `CorruptEvent`.
        """
        return self._feed.subscribe(after_position, poll_interval=poll_interval, batch=batch)

    async def wait_for_work(self, timeout: float) -> bool:
        """`RunSignals.wait_for_work`: woken by appends of every process (`NOTIFY`)."""
        return await self._feed.wait_for_work(timeout)

    async def wait_for_end(self, run_id: str, timeout: float) -> bool:
        """`RunSignals.wait_for_end`: woken by appends of every process (`NOTIFY`)."""
        return await self._feed.wait_for_end(run_id, timeout)

    # --- index queries ------------------------------------------------------------------------

    def _table(self, name: str) -> str:
        return f"{self._s}.{name}"

    async def _rows(self, query: str, params: Sequence[Any]) -> list[Any]:
        return await self._fetch(query, params)

    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""
        if not run_ids:
            self._check_open()
            return []
        rows = await self._fetch(
            f"SELECT {self.SUMMARY} FROM {self._s}.runs WHERE run_id = ANY(%s::text[])",
            (list(dict.fromkeys(run_ids)),),
        )
        found = {row[0]: summary_from_row(row) for row in rows}
        return [found.get(run_id) for run_id in run_ids]

    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""
        rows = await self._fetch(
            token_holder_query("%s", f"{self._s}.tokens"), (token.encode(), time_key(now))
        )
        return holder_from_row(rows[0]) if rows else None

    async def _wakeups(
        self, workflow_names: Collection[str] | None, due: int | None, limit: int
    ) -> list[Wakeup]:
        params: tuple[Any, ...] = (limit,) if due is None else (due, limit)
        served = None if workflow_names is None else "= ANY(%s)"
        query = wakeups_query(f"{self._s}.", "%s", served=served, due=due is not None)
        if workflow_names is not None:
            params = (sorted(workflow_names), *params)
        return [wakeup_from_row(row) for row in await self._fetch(query, params)]

    # --- repair and retention -----------------------------------------------------------------

    async def rewrite_index(self, run_id: str, index: RunIndex | None, *, now: datetime) -> None:
        """Replace the run's index rows with `index` (None: remove them), appending nothing.

        The repair behind `runfold verify --rebuild-index`: an optional capability, not part of
        `EventStore`.

        Fenced like an append, in one transaction: `index` must describe the run's head
        (`index.summary.last_sequence`; 0, no events, for None), else `SequenceConflict`; a token
        another run's live hook holds at `now` raises `TokenConflict`. Nothing is written when
        either is raised.
        """
        arguments.check_rewrite_index(run_id, index, now=now)
        if index is None:
            if self._distributed:
                async with self._cluster_connection() as conn:
                    head = await citus.drop_unborn_run(conn, self._s, run_id)
            else:
                [(head,)] = await self._fetch(DROP_UNBORN_RUN.format(s=self._s), {"run_id": run_id})
            if head:
                raise SequenceConflict(run_id, 0, head)
            return
        # An append of no events is exactly this: the head check, then the index rows.
        self._check_open()
        request = AppendRequest(run_id, index.summary.last_sequence, (), index, now)
        request.deadline = self._connections.deadline()
        await self._writer.append_one(request)

    async def _hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, now: datetime, /
    ) -> bool:
        """Hold the deduplication id for the run, unless a live run holds it (`DueWork`)."""
        if not self._distributed:
            return await super()._hold_dedup(queue_name, dedup_id, run_id, now)
        params: dict[str, Any] = {"queue": queue_name, "dedup": dedup_id, "run": run_id}
        params |= {"now": time_key(now), "grace": time_key(now - DEDUP_GRACE)}
        async with self._cluster_connection() as conn:
            return await citus.hold_dedup(conn, self._s, params)

    @contextlib.asynccontextmanager
    async def _cluster_connection(self) -> AsyncIterator[Connection]:
        """A connection for a call made of several transactions (on a cluster), bounded by the
        call's deadline, its errors translated."""
        self._check_open()
        deadline = Deadline(self._connections.deadline(), "a call")
        async with deadline, self._connections.connection() as conn:
            yield conn

    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` (the protocol's rules)."""
        params = {
            "before": time_key(terminal_before),
            "terminal": sorted(TERMINAL_RUN_STATUSES),
            "limit": max(limit, 0),
            "chosen": None if run_ids is None else sorted(run_ids),
        }
        if self._distributed:
            async with self._cluster_connection() as conn:
                return await citus.delete_runs(conn, self._s, params)
        [(count,)] = await self._fetch(DELETE_RUNS.format(s=self._s), params)
        return int(count)


def _server_deadline(seconds: float) -> Callable[[Connection], Awaitable[None]]:
    """The pool's `configure`: the server cancels a statement that runs past `seconds`."""
    setting = f"SET statement_timeout = {max(1, round(seconds * 1000))}"

    async def configure(conn: Connection) -> None:
        await conn.execute(setting)

    return configure
