"""The PostgreSQL store's connections: its pool, held connections, and driver errors as runfold's.

`Connections` hands out pooled autocommit connections that can send `append_request` values
(each with the cursor its appends reuse), keeps one for the event loop's next round, runs the
store's background tasks, bounds every call by its deadline (`Deadline`), and turns driver errors
into runfold errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Coroutine, Iterator
from types import TracebackType
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor, errors
from psycopg_pool import AsyncConnectionPool, PoolClosed
from psycopg_pool.base import AttemptWithBackoff

from runfold.kernel import StoreClosed, StoreError, StoreTimeout, StoreUnavailable
from runfold.stores.postgres.wire import Wire, WireDumper

__all__ = [
    "CANCEL_GRACE",
    "Connection",
    "Connections",
    "Cursor",
    "Deadline",
    "Identity",
    "Pool",
    "ReconnectingPool",
]

Connection = AsyncConnection[tuple[Any, ...]]
"""A psycopg connection of the store, rows as tuples."""
Cursor = AsyncCursor[tuple[Any, ...]]
"""A cursor of a `Connection`."""
Pool = AsyncConnectionPool[Connection]
"""The pool the store takes its connections from."""


class _Backoff(AttemptWithBackoff):
    """Tries again 0.1 s after a failed connection attempt, the wait growing by half, at most
    1 s (see `ReconnectingPool`)."""

    INITIAL_DELAY = 0.1
    DELAY_BACKOFF = 1.5
    MAX_DELAY = 1.0

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.MAX_DELAY)


class ReconnectingPool(AsyncConnectionPool[Connection]):
    """The pool a store makes: a server it cannot reach is tried again at least every second.

    psycopg_pool waits a second after a failed connection attempt and doubles the wait each
    time, so after a failover of ten seconds it may wait eight more before it finds the new
    primary, and the store's appends wait with it. This pool waits 0.1 s, growing by half, at
    most 1 s. psycopg_pool has no setting for it: `_add_connection` is overridden to start its
    attempts with `_Backoff` (`tests/stores/test_store_faults.py` checks the method is still there).
    """

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = _Backoff(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing)


Identity = tuple[int, str, int]
"""A connection's server backend: its process id, and the host and port it was reached at."""

CANCEL_GRACE = 0.25
"""Seconds a call past its deadline is given to cancel its statement on the server.

psycopg answers a cancelled query by asking the server to cancel it and waiting for the answer
(up to 10 s); a server that is silent (hung, cut off) never answers, so after this grace the
call is cancelled again, and psycopg closes the connection."""

_override: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "runfold_postgres_call_timeout", default=None
)


class Deadline:
    """`async with Deadline(at, what):` the block ends by loop time `at`, or `StoreTimeout`.

    It may take `CANCEL_GRACE` more to cancel the statement. At `at` the task is cancelled
    (psycopg then cancels the statement on the server; one that answers leaves the connection
    usable); if the block is still running `CANCEL_GRACE` later, it is cancelled again, which
    interrupts psycopg's wait for that answer and closes the connection. What `asyncio.timeout`
    does, with one timer per call instead of two nested ones (this is on every append).
    """

    __slots__ = ("_cancelling", "_handle", "_strikes", "_task", "at", "what")

    def __init__(self, at: float, what: str) -> None:
        self.at = at
        self.what = what
        self._strikes = 0
        self._cancelling = 0
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = asyncio.get_running_loop().call_at(self.at, self._expire)

    def _expire(self) -> None:
        assert self._task is not None
        self._strikes += 1
        self._task.cancel()
        if self._strikes == 1:
            loop = asyncio.get_running_loop()
            self._handle = loop.call_at(self.at + CANCEL_GRACE, self._expire)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._handle is not None and self._task is not None
        self._handle.cancel()
        if not self._strikes:
            return
        for _ in range(self._strikes):
            left = self._task.uncancel()
        if exc_type is asyncio.CancelledError and left <= self._cancelling:
            raise StoreTimeout(f"PostgreSQL: {self.what} did not finish by its deadline")


class Connections:
    """A store's pool of autocommit connections, and the errors of its driver as runfold's."""

    def __init__(self, pool: Pool, schema: str, *, owns_pool: bool) -> None:
        """Wrap `pool` for the store in `schema` (named in messages); close it if `owns_pool`."""
        self.pool = pool
        self.schema = schema
        self.owns_pool = owns_pool
        self.closed = False
        # Each pooled connection that has sent appends, with the cursor its appends reuse (a new
        # cursor per statement is a noticeable part of an append's client time).
        self.cursors: dict[Connection, Cursor] = {}
        # The server backend behind each of those connections, for settling an append whose
        # connection was lost (`doubt`).
        self.identities: dict[Connection, Identity] = {}
        self.call_timeout = 30.0
        """Seconds: the default deadline of a call (`PostgresStore.open`'s `call_timeout`)."""
        self._held: list[Connection] = []  # see `putconn`
        self._tasks: set[asyncio.Task[None]] = set()  # see `background`
        self._exit_guard: asyncio.Task[None] | None = None  # see `guard_exit`
        self._checking = False
        # The types of `append_request` values and arrays, once the schema is known.
        self.request: type[Wire] = Wire
        self.requests: type[Wire] = Wire

    def learn_types(self, request_oid: int, requests_oid: int) -> None:
        """Take the types of `append_request` and its array (new, or the schema was remade)."""
        if getattr(self.request, "oid", None) != request_oid:
            self.request = type("_Request", (Wire,), {"oid": request_oid})
            self.requests = type("_Requests", (Wire,), {"oid": requests_oid})
            self.cursors = {}  # connections learn the new types

    def check_open(self) -> None:
        """Raise `StoreClosed` once the store is closed."""
        if self.closed:
            raise StoreClosed(f"the PostgreSQL store (schema {self.schema!r}) is closed")

    async def getconn(self) -> Connection:
        """A pooled autocommit connection that can send `append_request`s, for `putconn`.

        Driver errors pass through. (No closed check: while closing, appends already accepted
        still go.)
        """
        if self._held:
            conn = self._held.pop()
        else:
            conn = await self.pool.getconn()
        if conn not in self.cursors:
            if not conn.autocommit:
                await self.pool.putconn(conn)
                raise ValueError("the pool's connections must be in autocommit mode")
            for cls in (self.request, self.requests):
                conn.adapters.register_dumper(cls, WireDumper)
            # The pool replaced any connection it closed: forget those.
            self.cursors = {c: k for c, k in self.cursors.items() if not c.closed}
            self.cursors[conn] = conn.cursor()  # after the dumpers: a cursor copies them
            self.identities = {c: i for c, i in self.identities.items() if c in self.cursors}
            self.identities[conn] = (conn.info.backend_pid, conn.info.host, conn.info.port)
        return conn

    def deadline(self) -> float:
        """The event loop time by which a call starting now must end."""
        override = _override.get()
        seconds = self.call_timeout if override is None else override
        return asyncio.get_running_loop().time() + seconds

    @contextlib.contextmanager
    def timeout(self, seconds: float) -> Iterator[None]:
        """Calls made in this block (by this task and those it starts) have `seconds` each."""
        if not seconds > 0:
            raise ValueError("a call timeout must be a positive number of seconds")
        token = _override.set(seconds)
        try:
            yield
        finally:
            _override.reset(token)

    async def putconn(self, conn: Connection) -> None:
        """Give back a connection from `getconn`.

        The store keeps it until the event loop's next round for a call that comes straight
        after (a writer's next append, say), sparing it a trip through the pool.
        """
        if not self.closed and not conn.closed:  # a broken connection is closed too
            self._held.append(conn)
            asyncio.get_running_loop().call_soon(self._release_held, conn)
        else:
            await self.pool.putconn(conn)

    def discard(self, conn: Connection) -> None:
        """Close `conn`, given back just now, so that the pool makes another in its place.

        On a read-only server: a new connection may reach the primary.
        """
        if conn in self._held:
            self._held.remove(conn)
            self.background(self._discard(conn))

    async def _discard(self, conn: Connection) -> None:
        await conn.close()
        await self.pool.putconn(conn)

    def _release_held(self, conn: Connection) -> None:
        if conn in self._held:  # nobody took it in the meantime
            self._held.remove(conn)
            self.background(self.pool.putconn(conn))

    def guard_exit(self) -> None:
        """Close the owned pool if the event loop cancels the store's tasks before `close`.

        `asyncio.run` ends by cancelling every task left and waiting for them all. psycopg_pool's
        workers take a cancellation that lands while they connect for a failed connection
        attempt (3.3: `CLIENT_EXCEPTIONS` includes `CancelledError`), schedule another and wait
        for work for ever; a script that raised with its store open then never exits. Cancelled
        with them, this task closes the pool, which stops its workers.
        """
        self._exit_guard = asyncio.create_task(self._close_pool_when_cancelled())

    async def _close_pool_when_cancelled(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        except asyncio.CancelledError:
            if not self.closed:  # cancelled from outside, not by `close`
                self.closed = True
                await self.pool.close(timeout=1.0)
            raise

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task the store keeps a reference to (and `close` waits for)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """`getconn` as a context that turns driver errors into runfold errors.

        For the schema work; the hot paths give connections back by hand and map errors their
        way.
        """
        try:
            conn = await self.getconn()
            try:
                yield conn
            finally:
                await self.putconn(conn)
        except psycopg.Error as exc:
            raise self.translate(exc) from exc

    def translate(self, exc: psycopg.Error) -> Exception:
        """The runfold error for a driver error."""
        if self.closed or isinstance(exc, PoolClosed):
            return StoreClosed(f"the PostgreSQL store (schema {self.schema!r}) is closed")
        if isinstance(exc, errors.ReadOnlySqlTransaction):
            # A standby, or a primary turned read-only (demoted in a failover): nothing was
            # written, and a connection made again may reach the primary.
            self._recover()
            return StoreUnavailable(f"PostgreSQL server is read-only: {exc}")
        if isinstance(exc, errors.QueryCanceled):  # statement_timeout: rolled back
            return StoreTimeout(f"PostgreSQL: {exc}")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            self._recover()
            return StoreUnavailable(f"PostgreSQL: {exc}")
        if isinstance(exc, psycopg.DataError):  # e.g. U+0000 in a text value
            return ValueError(f"PostgreSQL cannot take this value: {exc}")
        return StoreError(f"PostgreSQL: {exc}")

    def _recover(self) -> None:
        """After an operational error, test the idle connections in the background, so a
        server restart costs the callers one error each at most, not one per dead connection."""
        if not self._checking:
            self._checking = True
            self.background(self._check_pool())

    async def _check_pool(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):  # the pool retries by itself meanwhile
                await self.pool.check()
        finally:
            self._checking = False

    async def fetch(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        """The rows of `query`, in binary, or a runfold error.

        `StoreClosed` once closed, driver errors translated, `StoreTimeout` past the call's
        deadline.
        """
        self.check_open()
        try:
            async with Deadline(self.deadline(), "a read"):
                conn = await self.getconn()
                try:
                    cursor = await conn.execute(query, params, binary=True)
                    return await cursor.fetchall()
                finally:
                    await self.putconn(conn)
        except psycopg.DataError as exc:
            if exc.sqlstate is None:
                # psycopg refused U+0000 in a text key before sending it: no stored key can
                # hold one, so nothing matches (as an unknown run reads empty elsewhere).
                return []
            raise self.translate(exc) from exc
        except psycopg.Error as exc:
            raise self.translate(exc) from exc

    async def close(self) -> None:
        """Give back the held connections, wait for the background tasks, close an owned pool.

        The caller has set `closed` and let the appends already accepted finish.
        """
        if self._exit_guard is not None:
            self._exit_guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._exit_guard
        while self._held:
            await self.pool.putconn(self._held.pop())
        while self._tasks:
            await asyncio.gather(*self._tasks)
        if self.owns_pool:
            await self.pool.close()
