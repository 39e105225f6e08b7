"""Command cost: `CommandHandler.execute` on a cached snapshot against the bare
`append_if_sequence` it performs, on a short run and a long one, on every store. A command
costs O(new events): the long run must cost what the short one does."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from benchmarks.backend import Backend
from benchmarks.harness import Comparison, Result, Trial, compare, event_loop, interleaved
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.targets import COMMAND_COST_FLAT
from benchmarks.workloads import PAYLOAD_BYTES, memory_store, seed_run
from benchmarks.writes import store_appends
from runfold import CommandHandler, EventStore
from runfold.commands import RecordLog

__all__ = ["bench_commands"]

SHORT = 10


def handler_commands(
    loop: asyncio.AbstractEventLoop, store: EventStore, *, count: int, history: int
) -> Trial:
    """Each round: a fresh run of `history` events and a handler that has executed one command
    on it, so its snapshot is cached (untimed), then `count` commands (timed). Each appends
    one `log_recorded`, the event the bare appends write."""
    rounds = itertools.count(1)
    current: list[tuple[str, CommandHandler]] = []
    command = RecordLog(level="info", message="x" * PAYLOAD_BYTES)

    async def prepare() -> None:
        run_id = f"commands-{history}-{next(rounds)}"
        await seed_run(store, run_id, history)
        handler = CommandHandler(store)
        await handler.execute(run_id, command)
        current[:] = [(run_id, handler)]

    async def run() -> None:
        run_id, handler = current[0]
        for _ in range(count):
            await handler.execute(run_id, command)

    return Trial(
        prepare=lambda: loop.run_until_complete(prepare()),
        run=lambda: loop.run_until_complete(run()),
    )


def bench_commands(quick: bool) -> list[Result]:
    long = 1_000 if quick else 20_000
    repeats = 2 if quick else 5
    # Commands per timed run: more in memory, where each takes microseconds, so that a round
    # is long enough to time; a long run stays under the 25,000-event limit either way.
    in_memory, on_disk = (10, 10) if quick else (2_000, 200)
    backends: list[Backend] = [b for b in (SQLITE, POSTGRES) if b.version() is not None]
    results: list[Result] = []
    with event_loop() as loop:
        stores: list[tuple[str, int, contextlib.AbstractContextManager[EventStore]]] = [
            ("in memory (MemoryStore)", in_memory, memory_store(loop))
        ]
        stores += [(b.describe(), on_disk, b.store(loop)) for b in backends]
        for on, count, opening in stores:
            with opening as store:
                contenders: dict[str, Trial] = {}
                for history in (SHORT, long):
                    contenders[f"bare {history}"] = store_appends(
                        loop, store, writers=1, count=count, batch=1, history=history
                    )
                    contenders[f"execute {history}"] = handler_commands(
                        loop, store, count=count, history=history
                    )
                rates = interleaved(contenders, units=count, repeats=repeats)
            bare = f"bare append_if_sequence of one log_recorded (index precomputed) ×{count:,}"
            execute = f"CommandHandler.execute(RecordLog) on a cached snapshot ×{count:,}"
            flat = compare(
                rates[f"execute {long}"],
                f"execute, {SHORT} events",
                rates[f"execute {SHORT}"],
                COMMAND_COST_FLAT,
            )
            rows: dict[str, tuple[str, tuple[Comparison, ...]]] = {
                f"bare {SHORT}": (f"{bare}, run of {SHORT} events", ()),
                f"execute {SHORT}": (
                    f"{execute}, run of {SHORT} events",
                    compare(rates[f"execute {SHORT}"], "bare append", rates[f"bare {SHORT}"]),
                ),
                f"bare {long}": (
                    f"{bare}, run of {long:,} events",
                    compare(rates[f"bare {long}"], f"bare, {SHORT} events", rates[f"bare {SHORT}"]),
                ),
                f"execute {long}": (
                    f"{execute}, run of {long:,} events",
                    compare(rates[f"execute {long}"], "bare append", rates[f"bare {long}"]) + flat,
                ),
            }
            results += [
                Result(
                    group="Command cost",
                    case=case,
                    on=on,
                    unit="appends/s",
                    value=rates[key],
                    comparisons=comparisons,
                )
                for key, (case, comparisons) in rows.items()
            ]
    return results
