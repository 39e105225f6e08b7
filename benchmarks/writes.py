"""Write benchmarks on a backend: sequential appends (one event, and ten per append) against
the raw driver floor and `eventsourcing`'s recorder, then writers in contention, on distinct
runs and on one shared run."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any, cast

from benchmarks.backend import Backend
from benchmarks.harness import Measurement, Result, Trial, compare, event_loop, interleaved
from benchmarks.workloads import LOG_EVENT, NEW_RUN_EVENTS, PAYLOAD_BYTES, T0, seed_run
from runfold import CommandHandler, EventStore
from runfold.commands import RecordLog
from runfold.errors import SequenceConflict
from runfold.events import Envelope
from runfold.kernel import RunIndex, run_index

__all__ = ["bench_append", "bench_contention", "store_appends"]

BATCH = 10
"""Events per append in the batched case."""
WRITERS = (1, 8, 64)
MAX_POOL = 8
"""Connections runfold's Postgres pool gets at most: waiting appends share transactions."""


def store_appends(
    loop: asyncio.AbstractEventLoop,
    store: EventStore,
    *,
    writers: int,
    count: int,
    batch: int,
    history: int = NEW_RUN_EVENTS,
) -> Trial:
    """Each round: `writers` fresh runs of `history` events written (untimed), then one task
    per run making `count` appends of `batch` events (timed). A run's index rows are computed
    once beforehand, so the store's own cost is what is timed."""
    rounds = itertools.count(1)
    runs: list[tuple[str, RunIndex]] = []
    events = [LOG_EVENT] * batch

    async def create(run_id: str) -> tuple[str, RunIndex]:
        return run_id, run_index(await seed_run(store, run_id, history))

    async def create_all() -> None:
        name = f"run-{writers}x{count}x{batch}-{history}-{next(rounds)}"
        runs[:] = await asyncio.gather(*(create(f"{name}-{n}") for n in range(writers)))

    async def writer(run_id: str, index: RunIndex) -> None:
        head = history
        for _ in range(count):
            await store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)
            head += batch

    async def all_writers() -> None:
        await asyncio.gather(*(writer(run_id, index) for run_id, index in runs))

    return Trial(
        prepare=lambda: loop.run_until_complete(create_all()),
        run=lambda: loop.run_until_complete(all_writers()),
    )


class _ConflictCounting:
    """An `EventStore` that passes every call on to `store`, counting the `SequenceConflict`s
    its appends raise (the handler retries them out of sight)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.conflicts = 0

    async def append_if_sequence(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        try:
            return await self._store.append_if_sequence(*args, **kwargs)
        except SequenceConflict:
            self.conflicts += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def shared_run_commands(
    loop: asyncio.AbstractEventLoop, store: EventStore, *, writers: int, count: int
) -> tuple[Trial, list[int]]:
    """Each round: a fresh run and one `CommandHandler` per writer, as separate processes
    would have (untimed), then each writer executing `count` `RecordLog` commands on that one
    run (timed); the handler retries a lost race until it wins. Also returns the conflicts of
    each round."""
    rounds = itertools.count(1)
    conflicts_per_round: list[int] = []
    handlers: list[tuple[str, CommandHandler, _ConflictCounting]] = []
    command = RecordLog(level="info", message="x" * PAYLOAD_BYTES)

    def prepare() -> None:
        run_id = f"shared-{writers}x{count}-{next(rounds)}"
        loop.run_until_complete(seed_run(store, run_id, NEW_RUN_EVENTS))
        counting = [_ConflictCounting(store) for _ in range(writers)]
        # Enough attempts that no writer gives up: every lost race is a conflict counted.
        handlers[:] = [
            (run_id, CommandHandler(cast(EventStore, c), max_attempts=1_000_000), c)
            for c in counting
        ]

    async def writer(run_id: str, handler: CommandHandler) -> None:
        for _ in range(count):
            await handler.execute(run_id, command)

    async def all_writers() -> None:
        await asyncio.gather(*(writer(r, h) for r, h, _ in handlers))

    def run() -> None:
        loop.run_until_complete(all_writers())
        conflicts_per_round.append(sum(c.conflicts for _, _, c in handlers))

    return Trial(prepare=prepare, run=run), conflicts_per_round


def bench_append(backend: Backend, quick: bool) -> list[Result]:
    """Sequential appends, one event and `BATCH` events at a time, on one connection."""
    if backend.version() is None:
        return []
    count = 20 if quick else 1_000
    batched = 5 if quick else 200
    repeats = 2 if quick else 7
    group = f"{backend.name} append"
    on = backend.describe()
    results: list[Result] = []
    with event_loop() as loop, contextlib.ExitStack() as stack:
        store = stack.enter_context(backend.store(loop))
        for per_append, appends in ((1, count), (BATCH, batched)):
            contenders: dict[str, Trial | Callable[[], object]] = {
                "raw": stack.enter_context(
                    backend.raw_inserts(loop, writers=1, count=appends, batch=per_append)
                ),
                "runfold": store_appends(loop, store, writers=1, count=appends, batch=per_append),
            }
            driver = stack.enter_context(backend.raw_through_driver(loop, count=appends))
            if per_append == 1 and driver is not None:
                contenders["driver"] = driver
            statement = stack.enter_context(backend.append_statement(loop, count=appends))
            if per_append == 1 and statement is not None:
                contenders["statement"] = statement
            with contextlib.suppress(ImportError):
                from benchmarks.es_peer import eventsourcing_appends

                env = stack.enter_context(backend.eventsourcing_env())
                contenders["eventsourcing"] = stack.enter_context(
                    eventsourcing_appends(env, appends, per_append)
                )
            rates = interleaved(contenders, units=appends * per_append, repeats=repeats)
            results += _append_rows(backend, group, on, rates, appends, per_append)
    return results


def _append_rows(
    backend: Backend,
    group: str,
    on: str,
    rates: Mapping[str, Measurement],
    appends: int,
    per_append: int,
) -> list[Result]:
    raw, ours, peer = rates["raw"], rates["runfold"], rates.get("eventsourcing")
    single = per_append == 1
    shape = (
        f"{appends:,} sequential single-event appends"
        if single
        else f"{appends:,} sequential appends of {per_append} events"
    )
    floor = backend.floor
    driver = rates.get("driver")
    through_driver = f"asyncio one-hop ceiling ({floor} through the driver's thread)"
    statement = rates.get("statement")
    own_statement = f"runfold's statement ceiling ({floor} sending runfold's append)"
    rows = [
        Result(
            group=group,
            case=f"{floor}: one transaction per append, {shape}",
            on=on,
            unit="events/s",
            value=raw,
        ),
        Result(
            group=group,
            case=f"runfold append_if_sequence, {shape}",
            on=on,
            unit="events/s",
            value=ours,
            comparisons=compare(ours, floor, raw, backend.append_vs_raw if single else None)
            + compare(ours, through_driver, driver, backend.append_vs_hop if single else None)
            + compare(ours, own_statement, statement)
            + compare(
                ours,
                "eventsourcing recorder",
                peer,
                backend.append_vs_eventsourcing if single else None,
            ),
        ),
    ]
    if driver is not None:
        rows.append(
            Result(
                group=group,
                case=f"{through_driver}: the same transactions, each one call on the async "
                f"driver's worker thread awaited from the event loop, {shape}",
                on=on,
                unit="events/s",
                value=driver,
                comparisons=compare(driver, floor, raw)
                + compare(driver, "eventsourcing recorder", peer),
                note="the best a store on this driver could do: its transaction no costlier "
                "than the raw one",
            )
        )
    if statement is not None:
        rows.append(
            Result(
                group=group,
                case=f"{own_statement}: the statement runfold sends for a single-event append, "
                f"on runfold's schema, its parameters made once, {shape}",
                on=on,
                unit="events/s",
                value=statement,
                comparisons=compare(statement, floor, raw),
                note="what runfold's schema costs the server beside the floor's bare INSERT: "
                "the run's row moved in the same transaction, the feed position indexed",
            )
        )
    if peer is not None:
        rows.append(
            Result(
                group=group,
                case=f"eventsourcing {backend.name} recorder: Application.save, {shape}",
                on=on,
                unit="events/s",
                value=peer,
                comparisons=compare(peer, floor, raw),
            )
        )
    return rows


def bench_contention(backend: Backend, quick: bool) -> list[Result]:
    """1, 8 and 64 writers: on distinct runs (bare appends), then on one shared run (through
    `CommandHandler`), with the conflict rate of the shared run."""
    if backend.version() is None:
        return []
    total = 32 if quick else 2_560  # rounds of a few hundred ms: shorter ones were noisy
    shared_total = 8 if quick else 128
    repeats = 2 if quick else 5
    group = f"{backend.name} contention"
    on = backend.describe()
    results: list[Result] = []
    with event_loop() as loop:
        one_writer: dict[str, Measurement] = {}
        for writers in WRITERS:
            count = max(total // writers, 2)
            pool = min(writers, MAX_POOL)
            with contextlib.ExitStack() as stack:
                store = stack.enter_context(backend.store(loop, connections=pool))
                contenders: dict[str, Trial | Callable[[], object]] = {
                    "runfold": store_appends(loop, store, writers=writers, count=count, batch=1)
                }
                if backend.parallel_writers:
                    contenders["raw"] = stack.enter_context(
                        backend.raw_inserts(loop, writers=writers, count=count, batch=1)
                    )
                distinct = interleaved(contenders, units=writers * count, repeats=repeats)
                shared_count = max(shared_total // writers, 1)
                trial, conflicts = shared_run_commands(
                    loop, store, writers=writers, count=shared_count
                )
                shared = interleaved(
                    {"shared": trial}, units=writers * shared_count, repeats=repeats
                )["shared"]
            one_writer.setdefault("distinct", distinct["runfold"])
            one_writer.setdefault("shared", shared)
            results += _contention_rows(
                backend,
                group,
                on,
                writers=writers,
                pool=pool,
                distinct=distinct,
                one_writer=one_writer,
                count=count,
            )
            kept = conflicts[-repeats:]  # the timed rounds, not the warm-up
            attempts = writers * shared_count * repeats + sum(kept)
            results.append(
                Result(
                    group=group,
                    case=f"runfold: {writers} writer(s) on one shared run, CommandHandler"
                    f".execute(RecordLog) ×{shared_count} each (one handler per writer; the "
                    f"handler retries on SequenceConflict){connections(backend, pool)}",
                    on=on,
                    unit="appends/s",
                    value=shared,
                    comparisons=compare(shared, "1 writer, shared run", one_writer["shared"]),
                    note=f"conflict rate {sum(kept) / attempts:.0%} of append attempts",
                )
            )
    return results


def connections(backend: Backend, pool: int) -> str:
    """What a row says of runfold's connections: a pool's size, where there is a pool."""
    return f", pool of {pool} connection(s)" if backend.parallel_writers else ""


def _contention_rows(
    backend: Backend,
    group: str,
    on: str,
    *,
    writers: int,
    pool: int,
    distinct: Mapping[str, Measurement],
    one_writer: Mapping[str, Measurement],
    count: int,
) -> list[Result]:
    ours, raw = distinct["runfold"], distinct.get("raw")
    rows = [
        Result(
            group=group,
            case=f"runfold: {writers} writer(s) on distinct runs, append_if_sequence of one "
            f"event ×{count:,} each{connections(backend, pool)}",
            on=on,
            unit="appends/s",
            value=ours,
            comparisons=compare(
                ours, "1 writer", one_writer["distinct"], backend.distinct_vs_one.get(writers)
            )
            + compare(
                ours,
                f"{backend.floor}, {writers} connection(s)",
                raw,
                backend.distinct_vs_raw.get(writers),
            ),
            note="no conflicts: distinct runs",
        )
    ]
    if raw is not None:
        rows.append(
            Result(
                group=group,
                case=f"{backend.floor}: {writers} connection(s), {count:,} single-INSERT "
                "transactions each, distinct runs",
                on=on,
                unit="appends/s",
                value=raw,
            )
        )
    return rows
