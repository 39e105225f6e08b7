"""The PostgreSQL store's connections: its pool, held connections, and driver errors as runfold's.

`Connections` hands out pooled autocommit connections that can send `append_request` values
(each with the cursor its appends reuse), keeps one for the event loop's next round, runs the
store's background tasks, and turns driver errors into runfold errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor
from psycopg_pool import AsyncConnectionPool, PoolClosed

from runfold.kernel import StoreClosed, StoreError, StoreUnavailable
from runfold.stores.postgres.wire import Wire, WireDumper

__all__ = ["Connection", "Connections", "Cursor", "Pool"]

Connection = AsyncConnection[tuple[Any, ...]]
"""A psycopg connection of the store, rows as tuples."""
Cursor = AsyncCursor[tuple[Any, ...]]
"""A cursor of a `Connection`."""
Pool = AsyncConnectionPool[Connection]
"""The pool the store takes its connections from."""


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
        return conn

    async def putconn(self, conn: Connection) -> None:
        """Give back a connection from `getconn`.

        The store keeps it until the event loop's next round for a call that comes straight
        after (a writer's next append, say), sparing it a trip through the pool.
        """
        if not self.closed and not conn.broken:
            self._held.append(conn)
            asyncio.get_running_loop().call_soon(self._release_held, conn)
        else:
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
        """The rows of `query`, in binary; `StoreClosed` once closed, driver errors translated."""
        self.check_open()
        try:
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
