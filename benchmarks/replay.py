"""Replay: decode and fold a long run, each half alone and both together, from bytes and from
each store (memory, the SQLite file, PostgreSQL), beside `eventsourcing` doing the same with
the same number of events (its mapper, its projector, its POPO, SQLite and PostgreSQL
recorders), and beside the codec's ceiling (`cbor2.loads` of the payloads, nothing built).

Both together is measured the way a cold load does it (a SQL store's `replay`: the rows folded
straight, `project_rows`) and, beside it, the way `read` then `project_run` does (envelopes)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import cbor2

from benchmarks.backend import Backend
from benchmarks.harness import Comparison, Result, compare, event_loop, interleaved
from benchmarks.kernel import decode_and_fold, decode_rows, decode_rows_and_fold, encoded_rows
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.targets import DECODE_FOLD_VS_EVENTSOURCING
from benchmarks.workloads import memory_store, seed_run
from runfold import EventStore
from runfold.kernel import project_run
from runfold.kernel.bulk import in_bulk
from runfold.stores.protocol import replay_run

__all__ = ["bench_replay"]

RUN_ID = "run-bench"
IN_MEMORY = "in memory"
LOADS_EACH = "ceiling: cbor2.loads of each payload"
LOADS_ALL = "ceiling: cbor2.loads of every payload in one call"
DECODE = "runfold: decode rows (decode_events, envelopes)"
FOLD = "runfold: project_run of decoded envelopes"
DECODE_FOLD = "runfold: decode + fold rows (replay_rows, project_rows)"
ENVELOPES_FOLD = "runfold: decode rows into envelopes + project_run"
MEMORY = "runfold: MemoryStore.read + project_run"
ES_DECODE = "eventsourcing: mapper.to_domain_event of stored events"
ES_FOLD = "eventsourcing: project_aggregate of decoded events"
POPO = "eventsourcing POPO recorder"


def _store_case(backend: Backend) -> str:
    return f"runfold: {backend.name} store replay (read + fold)"


def _recorder(backend: Backend) -> str:
    return f"eventsourcing {backend.name} recorder"


def bench_replay(quick: bool) -> list[Result]:
    # ≡ 1 (mod 3): eventsourcing's aggregate (created, then three events per step) holds
    # exactly as many events as runfold's run.
    size = 1_000 if quick else 25_000
    repeats = 3 if quick else 7
    rows = encoded_rows(size)
    payloads = [row[3] for row in rows]
    joined = b"\x9f" + b"".join(payloads) + b"\xff"  # an indefinite-length array of them all
    decoded = decode_rows(rows)
    backends: list[Backend] = [b for b in (SQLITE, POSTGRES) if b.version() is not None]
    work: dict[str, Callable[[], object]] = {
        # With the collector paused, as runfold's decode runs: the codec alone.
        LOADS_EACH: lambda: in_bulk(size, list, map(cbor2.loads, payloads)),
        LOADS_ALL: lambda: in_bulk(size, cbor2.loads, joined),
        DECODE: lambda: decode_rows(rows),
        FOLD: lambda: project_run(decoded),
        DECODE_FOLD: lambda: decode_and_fold(rows),
        ENVELOPES_FOLD: lambda: decode_rows_and_fold(rows),
    }
    where = dict.fromkeys([*work, MEMORY, POPO, ES_DECODE, ES_FOLD], IN_MEMORY)
    peers: set[str] = set()
    with event_loop() as loop, contextlib.ExitStack() as stack:

        def read_and_fold(store: EventStore) -> Callable[[], object]:
            # What a handler's cold load does (`replay_run`): the store's `replay` where it
            # offers one, else its `read` and `project_run`.
            loop.run_until_complete(seed_run(store, RUN_ID, size))
            return lambda: loop.run_until_complete(replay_run(store, RUN_ID))

        work[MEMORY] = read_and_fold(stack.enter_context(memory_store(loop)))
        for backend in backends:
            work[_store_case(backend)] = read_and_fold(stack.enter_context(backend.store(loop)))
            where[_store_case(backend)] = where[_recorder(backend)] = backend.describe()
        with contextlib.suppress(ImportError):
            from benchmarks.es_peer import POPO_ENV, eventsourcing_replay, eventsourcing_stages

            stages = stack.enter_context(eventsourcing_stages(size))
            assert stages.events == size
            work[ES_DECODE], work[ES_FOLD] = stages.decode, stages.fold
            peers.update([ES_DECODE, ES_FOLD])
            envs = {POPO: POPO_ENV}
            for backend in backends:
                envs[_recorder(backend)] = stack.enter_context(backend.eventsourcing_env())
            for recorder, env in envs.items():
                replay, events = stack.enter_context(eventsourcing_replay(env, size))
                assert events == size
                work[recorder] = replay
                peers.add(recorder)
        rates = interleaved(work, units=size, repeats=repeats)
    # Each runfold row beside the library doing the same; the ceilings beside the decode.
    anchors: dict[str, list[str]] = {
        LOADS_EACH: [DECODE],
        LOADS_ALL: [DECODE, DECODE_FOLD],
        DECODE: [ES_DECODE],
        FOLD: [ES_FOLD],
        DECODE_FOLD: [POPO, _recorder(SQLITE), ENVELOPES_FOLD],
        ENVELOPES_FOLD: [POPO],
        MEMORY: [POPO],
    }
    targets = {(DECODE_FOLD, POPO): DECODE_FOLD_VS_EVENTSOURCING}
    for backend in backends:
        anchors[_store_case(backend)] = list(dict.fromkeys([_recorder(backend), POPO]))
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
                if name in peers and name not in (ES_DECODE, ES_FOLD)
                else f"{name}, {size:,} events",
                on=where[name],
                unit="events/s",
                value=rate,
                comparisons=comparisons,
            )
        )
    return results
