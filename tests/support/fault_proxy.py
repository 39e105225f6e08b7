"""A TCP proxy on loopback in front of PostgreSQL that cuts connections around appends.

`FaultProxy(upstream_port)` listens on a free loopback port and relays each connection to the
server. It reads the client's side of the PostgreSQL protocol message by message (the startup
message, then typed messages), so it knows when a connection sends an append: a `Parse` whose
SQL writes events (`INSERT INTO …` or one of the store's `append_…` functions), and then each
`Bind` of that prepared statement. For every append it asks `plan` (default: never) whether to
cut, and how:

- `"before"`: the append is never sent; both sockets close. Nothing was written.
- `"during"`: the append is sent, and both sockets close at once, before any reply: the server
  usually commits it, the client cannot know.
- `"after"`: the append is sent and its reply read through `ReadyForQuery`; the reply is
  dropped and both sockets close. It committed; the client sees a lost connection.

`black_hole()` stops relaying in both directions, keeping the sockets open (a hung server, a
partition); `heal()` resumes relaying (bytes held meanwhile are dropped: those connections are
as good as dead) and `cut_all()` closes every connection. Connections must not use TLS or GSS
encryption (`sslmode=disable gssencmode=disable`, as `dsn` gives): the proxy reads the
messages.

Written by hand because the fault sits inside the protocol: a generic TCP fault injector
(toxiproxy and the like) cuts by time or bytes, not at a commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Callable
from typing import Literal

from psycopg.conninfo import make_conninfo

__all__ = ["Cut", "FaultProxy", "random_plan"]

Cut = Literal["before", "during", "after"]
"""Where a cut falls around an append."""
Plan = Callable[[], Cut | None]


def random_plan(
    rate: float, cuts: tuple[Cut, ...] = ("before", "during", "after"), *, seed: int = 29
) -> Plan:
    """A plan that cuts `rate` of appends (of the append statements the proxy sees: a group
    commit is one), at a place drawn from `cuts`; the third append is always cut, so that a
    short test meets at least one fault."""
    rng = random.Random(seed)
    seen = [0]

    def plan() -> Cut | None:
        seen[0] += 1
        return rng.choice(cuts) if seen[0] == 3 or rng.random() < rate else None

    return plan


def _writes(sql: bytes) -> bool:
    return b"INSERT INTO" in sql or b"append_" in sql


class _Link:
    """One client connection and its server connection."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.server_reader, self.server_writer = server
        self.statements: set[bytes] = set()  # prepared statements that append
        self.cut_at_sync: Cut | None = None  # a cut waiting for the append's Sync
        self.drop_reply = False  # "after": swallow the server's reply up to ReadyForQuery
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for writer in (self.client_writer, self.server_writer):
                writer.close()
            self.proxy.links.discard(self)

    async def relay(self) -> None:
        tasks = [
            asyncio.create_task(self._client_to_server()),
            asyncio.create_task(self._server_to_client()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _held(self) -> None:
        """Wait while the proxy is a black hole."""
        while self.proxy.holding and not self.closed:
            await asyncio.sleep(0.01)

    async def _client_to_server(self) -> None:
        reader = self.client_reader
        try:
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            startup = await reader.readexactly(length - 4)
            self.server_writer.write(struct.pack("!i", length) + startup)
            while not self.closed:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!i", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                await self._held()
                if self.closed or self.proxy.holding_since_cut(self):
                    return
                if self._is_append(kind, body):
                    cut = self.proxy.plan()
                    if cut is not None:
                        self.proxy.cuts[cut] += 1
                    if cut == "before":
                        return  # never sent: `relay` closes both sides
                    if cut is not None:
                        self.cut_at_sync = cut
                self.server_writer.write(kind + struct.pack("!i", length) + body)
                if kind == b"S" and self.cut_at_sync is not None:
                    cut, self.cut_at_sync = self.cut_at_sync, None
                    await self.server_writer.drain()
                    if cut == "during":
                        if self.proxy.hole_after_cut:
                            self.proxy.black_hole()
                        return
                    self.drop_reply = True
                await self.server_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def _is_append(self, kind: bytes, body: bytes) -> bool:
        if kind == b"P":  # Parse: statement name, query
            name, rest = body.split(b"\0", 1)
            query = rest.split(b"\0", 1)[0]
            if _writes(query):
                self.statements.add(name)
            else:
                self.statements.discard(name)
            return False
        if kind == b"B":  # Bind: portal name, statement name
            statement = body.split(b"\0", 2)[1]
            return statement in self.statements
        if kind == b"Q":  # a simple query
            return _writes(body)
        return False

    async def _server_to_client(self) -> None:
        reader = self.server_reader
        try:
            while not self.closed:
                kind = await reader.readexactly(1)
                (length,) = struct.unpack("!i", await reader.readexactly(4))
                body = await reader.readexactly(length - 4)
                await self._held()
                if self.closed or self.proxy.holding_since_cut(self):
                    return
                if self.drop_reply:
                    if kind == b"Z":
                        if self.proxy.hole_after_cut:
                            self.proxy.black_hole()
                        return  # the reply is gone, and so is the connection
                    continue
                self.client_writer.write(kind + struct.pack("!i", length) + body)
                await self.client_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return


class FaultProxy:
    """A loopback proxy in front of the PostgreSQL server at `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], plan: Plan | None = None) -> None:
        self.upstream = upstream
        self.plan: Plan = plan if plan is not None else (lambda: None)
        self.links: set[_Link] = set()
        self.cuts: dict[Cut, int] = {"before": 0, "during": 0, "after": 0}
        self.holding = False
        self.hole_after_cut = False
        """Set: a cut during or after an append also turns the proxy into a black hole."""
        self._healed_links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    def dsn(self, base: str) -> str:
        """`base` pointed at the proxy, without TLS or GSS encryption (the proxy reads the
        protocol)."""
        return make_conninfo(
            base, host="127.0.0.1", port=self.port, sslmode="disable", gssencmode="disable"
        )

    def black_hole(self) -> None:
        """Stop relaying, in both directions, on every connection, old and new."""
        self.holding = True
        self._healed_links = set(self.links)

    def heal(self) -> None:
        """Relay again. Connections that lived through the black hole are closed: whatever they
        had in flight is lost, as after a partition that TCP did not survive."""
        self.holding = False
        for link in list(self._healed_links):
            link.close()
        self._healed_links = set()

    def holding_since_cut(self, link: _Link) -> bool:
        return link in self._healed_links and not self.holding

    def cut_all(self) -> None:
        """Close every connection now."""
        for link in list(self.links):
            link.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while self.holding:  # a black hole takes connections but never answers
                await asyncio.sleep(0.01)
            try:
                server = await asyncio.open_connection(*self.upstream)
            except OSError:
                writer.close()
                return
            link = _Link(self, (reader, writer), server)
            self.links.add(link)
            await link.relay()
        except asyncio.CancelledError:
            writer.close()  # the proxy is closing
        finally:
            self._tasks.discard(task)
