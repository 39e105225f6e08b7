"""What the inspector's benchmark and its scale test share: a store with a long run, `runfold ui`
served over it in a real subprocess, concurrent GETs against it, and writer processes appending
to the same store meanwhile.

`python -m benchmarks.inspector_load write URL PREFIX SECONDS` is one writer: it starts runs and
records log lines on them through `CommandHandler` for `SECONDS`, then prints one JSON line:
how many commands it executed, its longest gap between two and any error.

The GETs go through a few lines of asyncio streams rather than an HTTP client library: the
standard library's client blocks a thread per request, and none is a dependency of runfold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import attrs

from benchmarks.workloads import seed_run
from runfold import CommandHandler
from runfold.commands import CreateRun, RecordLog, StartRun
from runfold.stores import open_store

__all__ = [
    "BIG_RUN",
    "LoadReport",
    "WriterReport",
    "fetch",
    "load",
    "load_paths",
    "seed_store",
    "serving",
    "writing",
]

BIG_RUN = "big-run"
"""The long run of the store `seed_store` writes."""
SMALL_RUNS = 40
"""Short runs beside it, so the runs page lists a page of them."""
LOG_EVERY_RUN = 9
"""Log lines a writer records on each run it starts before starting the next."""


async def seed_store(path: Path, events: int) -> None:
    """A SQLite store at `path` with `BIG_RUN` of `events` events (written through the store's
    API in batches, as the engine would have) and `SMALL_RUNS` short runs."""
    store = await open_store(f"sqlite:///{path}")
    try:
        await seed_run(store, BIG_RUN, events, chunk=5_000)
        handler = CommandHandler(store)
        for n in range(SMALL_RUNS):
            create = CreateRun(workflow_name="small", input=json.dumps({"n": n}).encode())
            await handler.execute(f"small-{n:03d}", StartRun(create=create))
    finally:
        await store.close()


def load_paths(events: int) -> list[str]:
    """The pages the load asks for, in turn: what an operator's browser fetches."""
    return [
        "/",
        f"/runs/{BIG_RUN}",
        f"/runs/{BIG_RUN}/details",
        f"/api/head?run_id={BIG_RUN}",
        f"/runs/{BIG_RUN}/events?after={max(events - 50, 0)}",
        "/runs/small-007",
        "/runs/small-007/details",
        "/api/head?run_id=small-007",
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(store_url: str, *extra: str) -> Iterator[str]:
    """`runfold ui` over `store_url` on a free loopback port: its base URL, until the block ends."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "runfold", "ui", "--store", store_url, "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/static/favicon.svg", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    _, err = process.communicate()
                    raise RuntimeError(f"runfold ui did not start: {err.decode()}") from None
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        process.communicate(timeout=15)


async def fetch(base: str, path: str) -> tuple[int, int]:
    """GET `base + path` on a connection of its own: the status and the body's size in bytes."""
    async with _Connection.to(base) as connection:
        return await connection.get(path)


class _Connection:
    """One kept-alive HTTP/1.1 connection, as a browser holds one to the inspector."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def to(cls, base: str) -> AsyncIterator[_Connection]:
        host, _, port = base.removeprefix("http://").partition(":")
        connection = cls(host, int(port))
        try:
            yield connection
        finally:
            await connection.close()

    async def get(self, path: str) -> tuple[int, int]:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(
            int(line.partition(":")[2])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        await self.reader.readexactly(length)
        return status, length

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@attrs.frozen(kw_only=True)
class LoadReport:
    """What `load` saw: each request's latency in seconds (all, and by path), failures by kind."""

    latencies: tuple[float, ...]
    by_path: dict[str, list[float]]
    errors: dict[str, int]


async def load(base: str, paths: Sequence[str], *, clients: int, seconds: float) -> LoadReport:
    """`clients` concurrent clients, each on a kept-alive connection, GETting `paths` in turn
    until `seconds` are over."""
    latencies: list[float] = []
    by_path: dict[str, list[float]] = {path: [] for path in paths}
    errors: dict[str, int] = {}
    deadline = time.perf_counter() + seconds

    async def client(number: int) -> None:
        turn = number
        async with _Connection.to(base) as connection:
            while time.perf_counter() < deadline:
                path = paths[turn % len(paths)]
                turn += 1
                start = time.perf_counter()
                try:
                    status, _ = await connection.get(path)
                except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    await connection.close()
                    continue
                latencies.append(time.perf_counter() - start)
                by_path[path].append(latencies[-1])
                if status != 200:
                    kind = f"HTTP {status} {path}"
                    errors[kind] = errors.get(kind, 0) + 1

    await asyncio.gather(*(client(n) for n in range(clients)))
    return LoadReport(latencies=tuple(latencies), by_path=by_path, errors=errors)


@attrs.frozen(kw_only=True)
class WriterReport:
    """One writer's account: commands executed in `seconds`, its longest gap between two (both
    from its first command on: opening the store and importing are not counted), any error."""

    commands: int
    seconds: float
    longest_gap: float
    p99_gap: float
    error: str | None


@contextlib.contextmanager
def writing(store_url: str, *, writers: int, seconds: float) -> Iterator[list[WriterReport]]:
    """`writers` writer processes on `store_url` for `seconds`; their reports fill the list
    when the block ends (it waits for them)."""
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.inspector_load",
                "write",
                store_url,
                f"writer-{os.getpid()}-{n}",
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(writers)
    ]
    reports: list[WriterReport] = []
    try:
        yield reports
    finally:
        for process in processes:
            out, err = process.communicate(timeout=seconds + 60)
            try:
                reports.append(WriterReport(**json.loads(out.decode().strip().splitlines()[-1])))
            except (ValueError, IndexError, TypeError):
                reports.append(
                    WriterReport(
                        commands=0,
                        seconds=0.0,
                        longest_gap=0.0,
                        p99_gap=0.0,
                        error=err.decode()[-2000:] or "?",
                    )
                )


async def _write(store_url: str, prefix: str, seconds: float) -> WriterReport:
    store = await open_store(store_url)
    handler = CommandHandler(store)
    commands = 0
    gaps: list[float] = []
    error: str | None = None
    began = last = time.perf_counter()
    deadline = began + seconds
    try:
        run = 0
        while time.perf_counter() < deadline:
            run_id = f"{prefix}-{run}"
            run += 1
            create = CreateRun(workflow_name="writer", input=b"{}")
            logs = [RecordLog(level="info", message=f"line {n}") for n in range(LOG_EVERY_RUN)]
            for command in [StartRun(create=create), *logs]:
                await handler.execute(run_id, command)
                now = time.perf_counter()
                commands += 1
                gaps.append(now - last)
                last = now
    except Exception as exc:  # reported, not raised: the report is the writer's output
        error = f"{type(exc).__name__}: {exc}"
    finally:
        await store.close()
    ordered = sorted(gaps) or [0.0]
    return WriterReport(
        commands=commands,
        seconds=last - began,
        longest_gap=ordered[-1],
        p99_gap=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        error=error,
    )


def main(argv: Sequence[str]) -> int:
    """`write URL PREFIX SECONDS`: one writer (see the module's docstring)."""
    _, store_url, prefix, seconds = argv
    report = asyncio.run(_write(store_url, prefix, float(seconds)))
    print(json.dumps(attrs.asdict(report)), flush=True)
    return 0 if report.error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
