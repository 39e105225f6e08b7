"""Replay: decode + fold a long run from bytes and from each store (memory, the SQLite file,
PostgreSQL), against `eventsourcing` replaying the same number of events from its POPO,
SQLite and PostgreSQL recorders."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from benchmarks.backend import Backend
from benchmarks.harness import Comparison, Result, compare, event_loop, interleaved
from benchmarks.kernel import decode_and_fold, encoded_rows
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.targets import DECODE_FOLD_VS_EVENTSOURCING
from benchmarks.workloads import memory_store, seed_run
from runfold import EventStore, project_run

__all__ = ["bench_replay"]

RUN_ID = "run-bench"
IN_MEMORY = "in memory"
DECODE = "runfold: decode rows + project_run"
MEMORY = "runfold: MemoryStore.read + project_run"
POPO = "eventsourcing POPO recorder"


def _store_case(backend: Backend) -> str:
    return f"runfold: {backend.name} store read + project_run"


def _recorder(backend: Backend) -> str:
    return f"eventsourcing {backend.name} recorder"


def bench_replay(quick: bool) -> list[Result]:
    # ≡ 1 (mod 3): eventsourcing's aggregate (created, then three events per step) holds
    # exactly as many events as runfold's run.
    size = 1_000 if quick else 25_000
    repeats = 3 if quick else 7
    rows = encoded_rows(size)
    backends: list[Backend] = [b for b in (SQLITE, POSTGRES) if b.version() is not None]
    where = {DECODE: IN_MEMORY, MEMORY: IN_MEMORY, POPO: IN_MEMORY}
    work: dict[str, Callable[[], object]] = {DECODE: lambda: decode_and_fold(rows)}
    peers: set[str] = set()
    with event_loop() as loop, contextlib.ExitStack() as stack:

        def read_and_fold(store: EventStore) -> Callable[[], object]:
            loop.run_until_complete(seed_run(store, RUN_ID, size))
            return lambda: project_run(loop.run_until_complete(store.read(RUN_ID)))

        work[MEMORY] = read_and_fold(stack.enter_context(memory_store(loop)))
        for backend in backends:
            work[_store_case(backend)] = read_and_fold(stack.enter_context(backend.store(loop)))
            where[_store_case(backend)] = where[_recorder(backend)] = backend.describe()
        with contextlib.suppress(ImportError):
            from benchmarks.es_peer import POPO_ENV, eventsourcing_replay

            envs = {POPO: POPO_ENV}
            for backend in backends:
                envs[_recorder(backend)] = stack.enter_context(backend.eventsourcing_env())
            for recorder, env in envs.items():
                replay, events = stack.enter_context(eventsourcing_replay(env, size))
                assert events == size
                work[recorder] = replay
                peers.add(recorder)
        rates = interleaved(work, units=size, repeats=repeats)
    # Every runfold row against the in-memory and SQLite recorders, a database's own row also
    # against its database's recorder.
    targets = {(DECODE, POPO): DECODE_FOLD_VS_EVENTSOURCING}
    anchors = {name: [POPO, _recorder(SQLITE)] for name in work if name not in peers}
    for backend in backends:
        anchors[_store_case(backend)] = list(
            dict.fromkeys([POPO, _recorder(SQLITE), _recorder(backend)])
        )
        if backend.replay_vs_eventsourcing is not None:
            targets[(_store_case(backend), _recorder(backend))] = backend.replay_vs_eventsourcing
    results = []
    for name, rate in rates.items():
        comparisons: tuple[Comparison, ...] = ()
        for anchor in anchors.get(name, []):
            comparisons += compare(rate, anchor, rates.get(anchor), targets.get((name, anchor)))
        results.append(
            Result(
                group="Replay",
                case=f"{name}: repository.get, {size:,} events"
                if name in peers
                else f"{name}, {size:,} events",
                on=where[name],
                unit="events/s",
                value=rate,
                comparisons=comparisons,
            )
        )
    return results
