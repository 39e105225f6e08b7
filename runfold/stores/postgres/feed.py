"""The PostgreSQL store's global feed: reading and tailing it, and the notifications for tails.

An event's position is its transaction's id × `POSITIONS_PER_TRANSACTION` + its ordinal in that
transaction, and the feed serves only transactions older than the oldest one still running
(`pg_snapshot_xmin`): any transaction that can still commit has a higher id, hence higher
positions, so nothing can appear below a position already served, and writers share no lock.
After appends commit the store sends `NOTIFY` from a separate, write-free transaction, at most
one per `NOTIFY_INTERVAL`; `subscribe` listens, and polls as a fallback.

The notification carries the appends' tidings (`runfold.stores.signals`): whether one left a live
run without an owner (work for the fleet) and which runs ended, so `wait_for_work` and
`wait_for_end` wake in every process, through one listening connection per store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncGenerator

import psycopg

from runfold.kernel import Envelope, RunIndex
from runfold.stores._sql import EVENT_COLUMNS, envelopes_from_rows  # the feed's lead with run_id
from runfold.stores.postgres.connections import Connection, Connections
from runfold.stores.postgres.schema import quote
from runfold.stores.signals import SignalBoard, Tidings, tidings_of

__all__ = ["NOTIFY_INTERVAL", "Feed", "channel"]

_LARGEST_LIMIT = 2**31 - 1
"""The largest limit `read_feed` takes (an `integer`); a larger one returns the same rows."""

NOTIFY_INTERVAL = 0.025
"""Seconds between two `NOTIFY`s of one store: appends in between share the next one."""
_PAYLOAD_BYTES = 7000
"""Past this a notification names no ended run: it wakes every waiter for an end (the server
takes payloads under 8,000 bytes)."""


def channel(schema: str) -> str:
    """The `NOTIFY` channel of a schema's store (identifiers stop at 63 bytes)."""
    return f"runfold_{schema}".encode()[:63].decode(errors="ignore")


class Feed:
    """The global feed of a store's schema: `read_all`, `subscribe`, and `announce`."""

    def __init__(self, connections: Connections, schema: str, *, feed_wait: float) -> None:
        """The feed of `schema` over `connections`; `read_all` waits up to `feed_wait` s."""
        self._connections = connections
        self._feed_wait = feed_wait
        self._read_sql = (
            f"SELECT run_id, {EVENT_COLUMNS} FROM {quote(schema)}.read_feed(%s, %s, %s)"
        )
        self._channel = channel(schema)
        self._unannounced = False  # appends committed since the last NOTIFY
        self._tidings = Tidings()  # what those appends tell waiters
        self._sender = secrets.token_hex(8)  # this store's own notifications come back to it
        self.board = SignalBoard()
        self._signal_listener: asyncio.Task[None] | None = None
        self._announcing = False
        self._closing = asyncio.Event()
        self._listeners: set[Connection] = set()

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The global feed after `after_position`, in position order (`EventStore.read_all`)."""
        rows = await self._connections.fetch(
            self._read_sql,
            (after_position, min(max(limit, 0), _LARGEST_LIMIT), round(self._feed_wait * 1000)),
        )
        return envelopes_from_rows(rows)

    async def subscribe(
        self, after_position: int = 0, *, poll_interval: float = 1.0, batch: int = 1000
    ) -> AsyncGenerator[Envelope, None]:
        """Every envelope of the feed after `after_position`, in feed order, as it commits."""
        position = after_position
        listener: Connection | None = None
        try:
            while True:
                if listener is None:
                    listener = await self._listen()
                envelopes = await self.read_all(after_position=position, limit=batch)
                for envelope in envelopes:
                    yield envelope
                    assert envelope.position is not None
                    position = envelope.position
                if len(envelopes) < batch and not await self._wait(listener, poll_interval):
                    assert listener is not None
                    await self._release(listener)  # it failed: the next round listens anew
                    listener = None
        finally:
            if listener is not None:
                await self._release(listener)

    async def _listen(self) -> Connection | None:
        """A pooled connection listening on the store's channel, kept by one subscriber; None
        when none can be had (the subscriber polls meanwhile)."""
        self._connections.check_open()
        try:
            conn = await self._connections.pool.getconn()
        except psycopg.Error:
            return None
        self._listeners.add(conn)
        try:
            await conn.execute(f"LISTEN {quote(self._channel)}")
        except psycopg.Error:
            await self._release(conn)
            return None
        return conn

    async def _release(self, listener: Connection) -> None:
        self._listeners.discard(listener)
        with contextlib.suppress(psycopg.Error):  # a broken connection: the pool drops it
            await listener.execute("UNLISTEN *")
        await self._connections.pool.putconn(listener)

    async def _wait(self, listener: Connection | None, seconds: float) -> bool:
        """Until a notification arrives on `listener` or `seconds` pass (without a listener:
        sleep). False if the listener failed."""
        if listener is None:
            await asyncio.sleep(seconds)
            return True
        try:
            async for _ in listener.notifies(timeout=seconds, stop_after=1):
                pass
        except psycopg.Error:
            return False
        return True

    def announce(self, index: RunIndex) -> None:
        """Wake subscribers and waiters after an append of `index` committed.

        `NOTIFY` soon, in the background; waiters of this process at once.

        Not inside `append_events`: a notifying transaction holds a database-wide lock from
        before its commit until its commit is flushed, so concurrent writers would flush one by
        one, at a fraction of the raw insert rate. Here it is a
        transaction without writes, at most one per `NOTIFY_INTERVAL` per store.
        """
        tidings = tidings_of(index)
        if tidings:
            self._tidings.add(tidings)
            self.board.post(tidings)
        self._unannounced = True
        if not self._announcing:
            self._announcing = True
            self._connections.background(self._announce_pending())

    async def _announce_pending(self) -> None:
        try:
            while self._unannounced:
                self._unannounced = False
                payload, self._tidings = self._payload(self._tidings), Tidings()
                with contextlib.suppress(psycopg.Error):  # best effort: subscribers also poll
                    async with self._connections.pool.connection() as conn:
                        await conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
                with contextlib.suppress(TimeoutError):  # closing cuts the pause short
                    await asyncio.wait_for(self._closing.wait(), NOTIFY_INTERVAL)
        finally:
            self._announcing = False

    async def close(self) -> None:
        """Send the last `NOTIFY` now, and close the listeners.

        Subscribers wake, and find the store closed.
        """
        self._closing.set()
        self.board.wake_all()
        for listener in list(self._listeners):
            await listener.close()
        if self._signal_listener is not None:
            self._signal_listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._signal_listener

    # --- signals ------------------------------------------------------------------------------

    def _payload(self, tidings: Tidings) -> str:
        """A notification's payload: the sender, and `tidings` (ended runs left out if many)."""
        message = {"from": self._sender, "work": tidings.work, "ended": sorted(tidings.ended)}
        text = json.dumps(message)
        if len(text.encode()) > _PAYLOAD_BYTES:
            text = json.dumps({"from": self._sender, "work": tidings.work, "ended": None})
        return text

    def _receive(self, payload: str) -> None:
        """Wake the waiters a notification from another process concerns."""
        try:
            message = json.loads(payload)
            sender, work, ended = message["from"], bool(message["work"]), message["ended"]
        except (ValueError, TypeError, KeyError):  # not runfold's (an older one): wake all
            self.board.wake_all()
            return
        if sender == self._sender:
            return  # posted here when the append committed
        if ended is None:
            self.board.post(Tidings(work=work), every_end=True)
        else:
            self.board.post(Tidings(work=work, ended=(str(e) for e in ended)))

    async def wait_for_work(self, timeout: float) -> bool:
        """`RunSignals.wait_for_work`, across processes."""
        self._listen_for_signals()
        return await self.board.wait_for_work(timeout)

    async def wait_for_end(self, run_id: str, timeout: float) -> bool:
        """`RunSignals.wait_for_end`, across processes."""
        self._listen_for_signals()
        return await self.board.wait_for_end(run_id, timeout)

    def _listen_for_signals(self) -> None:
        """Start the store's one signal listener, unless it runs (or the store closes)."""
        self._connections.check_open()
        if self._signal_listener is None or self._signal_listener.done():
            self._signal_listener = asyncio.create_task(self._relay_signals())

    async def _relay_signals(self) -> None:
        """Relay notifications to this process's waiters until the store closes; a lost
        connection costs a listen anew (waiters are woken, as they may have missed one)."""
        while not self._closing.is_set():
            listener = await self._listen()
            if listener is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), 1.0)
                continue
            try:
                async for notify in listener.notifies():
                    self._receive(notify.payload)
            except psycopg.Error:
                pass
            finally:
                if listener.closed:
                    self._listeners.discard(listener)
                else:
                    await self._release(listener)
                self.board.wake_all()
