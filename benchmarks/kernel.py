"""Kernel benchmarks: fold, apply, replay from bytes (against `eventsourcing`), snapshot memory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from benchmarks.harness import Measurement, Result, measure
from benchmarks.workloads import PAYLOAD_BYTES, T0, step_events, step_heavy_history
from runfold import (
    MemoryStore,
    apply,
    decode_event,
    encode_event,
    project_run,
    run_index,
)
from runfold.kernel import make_envelope

__all__ = [
    "bench_apply",
    "bench_fold",
    "bench_memory",
    "bench_replay",
    "eventsourcing_replay",
]


def bench_fold(quick: bool) -> list[Result]:
    """`project_run` over pre-decoded step-heavy histories."""
    results = []
    for size in [1_000] if quick else [1_000, 10_000, 25_000]:
        history = step_heavy_history(size)
        rate = measure(partial(project_run, history), units=size, repeats=3 if quick else 15)
        results.append(
            Result(
                benchmark="fold",
                case=f"project_run, {size:,} pre-decoded events",
                unit="events/s",
                value=rate,
                anchor="target 1,000,000 events/s",
                ratio=rate.median / 1_000_000,
            )
        )
    return results


def bench_apply(quick: bool) -> list[Result]:
    """`apply` of one step's three events to a cached snapshot, by run length."""
    results = []
    rounds = 200 if quick else 2_000
    baseline: float | None = None
    for size in [10, 1_000] if quick else [10, 1_000, 25_000]:
        history = step_heavy_history(size)
        first_step = size  # beyond any step the history holds
        tail = step_events(first_step, 3 * (rounds + 50))
        batches = [
            [
                make_envelope(
                    "run-bench",
                    size + offset * 3 + k + 1,
                    event,
                    T0 + timedelta(seconds=offset),
                    None,
                )
                for k, event in enumerate(tail[offset * 3 : offset * 3 + 3])
            ]
            for offset in range(rounds + 50)
        ]

        def chain(h: Any = history, b: list[Any] = batches) -> None:
            snapshot = project_run(h)
            for batch in b[:rounds]:
                snapshot = apply(snapshot, batch)

        fold_only = measure(partial(project_run, history), units=1, repeats=3)
        total = measure(chain, units=1, repeats=3 if quick else 7)
        # Time per apply = (chain - fold) / rounds, reported as applies/s.
        per_apply = (1 / total.median - 1 / fold_only.median) / rounds
        rate = Measurement(
            median=1 / per_apply, low=1 / per_apply, high=1 / per_apply, repeats=total.repeats
        )
        baseline = baseline or rate.median
        results.append(
            Result(
                benchmark="apply",
                case=f"apply 3 events to a cached snapshot of {size:,} events",
                unit="applies/s",
                value=rate,
                anchor="the 10-event run",
                ratio=rate.median / baseline,
                note="spread not measured separately (derived from chain minus fold medians)",
            )
        )
    return results


def _encoded_rows(size: int) -> list[tuple[int, str, int, bytes, int]]:
    """(sequence, type, schema_version, payload, recorded_at micros) as a store row holds."""
    rows = []
    for envelope in step_heavy_history(size):
        event_type, version, payload = encode_event(envelope.event)
        micros = (envelope.recorded_at - T0) // timedelta(microseconds=1)
        rows.append((envelope.sequence, event_type, version, payload, micros))
    return rows


def _decode_and_fold(rows: list[tuple[int, str, int, bytes, int]]) -> Any:
    """What a store's read does (decode each row, build its envelope; rows of one append share
    their time object, as SQLiteStore does), then `project_run`."""
    history = []
    last_micros = None
    recorded_at = T0
    for sequence, event_type, version, payload, micros in rows:
        if micros != last_micros:
            last_micros, recorded_at = micros, T0 + timedelta(microseconds=micros)
        event = decode_event(event_type, version, payload)
        history.append(make_envelope("run-bench", sequence, event, recorded_at, None))
    return project_run(history)


def eventsourcing_replay(size: int, module: str) -> Callable[[], Any]:
    """An `eventsourcing` application holding one aggregate of `size` events; returns its
    repository replay (`repository.get`, no snapshots), the library's own replay path."""
    from eventsourcing.application import Application

    from benchmarks.es_peer import WorkflowRun

    env = {"PERSISTENCE_MODULE": module}
    if module.endswith("sqlite"):
        env["SQLITE_DBNAME"] = tempfile.mktemp(suffix=".db", prefix="runfold-bench-es-")
    application: Application[Any] = Application(env=env)
    aggregate = WorkflowRun(workflow_name="order-fulfilment", input="x" * PAYLOAD_BYTES)
    step = 0
    while aggregate.version < size:
        step_id = f"step-{step:06d}"
        aggregate.create_step(step_id, "charge-card", "i" * PAYLOAD_BYTES)
        aggregate.start_step(step_id, 1)
        aggregate.complete_step(step_id, "o" * PAYLOAD_BYTES)
        step += 1
    application.save(aggregate)
    versions = aggregate.version
    assert application.repository.get(aggregate.id).version == versions
    return lambda: application.repository.get(aggregate.id)


def bench_replay(quick: bool) -> list[Result]:
    """Decode + fold from stored bytes, against `eventsourcing`'s aggregate replay."""
    size = 1_002 if quick else 10_002  # a multiple of three steps plus created/started
    repeats = 3 if quick else 11
    rows = _encoded_rows(size)
    store = MemoryStore()
    history = step_heavy_history(size)
    loop = asyncio.new_event_loop()
    try:
        snapshot = project_run(history)
        loop.run_until_complete(
            store.append_if_sequence(
                "run-bench",
                0,
                [e.event for e in history],
                index=run_index(snapshot),
                recorded_at=T0,
            )
        )

        def from_store() -> Any:
            return project_run(loop.run_until_complete(store.read("run-bench")))

        cases: list[tuple[str, Callable[[], Any]]] = [
            ("runfold: decode rows + project_run", lambda: _decode_and_fold(rows)),
            ("runfold: MemoryStore.read + project_run", from_store),
        ]
        peers: list[tuple[str, Callable[[], Any]]] = []
        with contextlib.suppress(ImportError):
            peers = [
                (
                    "eventsourcing: POPO recorder, repository.get",
                    eventsourcing_replay(size, "eventsourcing.popo"),
                ),
                (
                    "eventsourcing: SQLite recorder, repository.get",
                    eventsourcing_replay(size, "eventsourcing.sqlite"),
                ),
            ]
        rates = {name: measure(work, units=size, repeats=repeats) for name, work in cases + peers}
    finally:
        loop.close()
    peer = "eventsourcing: POPO recorder, repository.get"
    anchor_rate = rates[peer].median if peer in rates else None
    anchor = "eventsourcing POPO replay (target ≥ 10×)"
    return [
        Result(
            benchmark="replay",
            case=f"{name}, {size:,} events",
            unit="events/s",
            value=rate,
            anchor=anchor if anchor_rate else None,
            ratio=rate.median / anchor_rate if anchor_rate else None,
            note="peer not installed" if anchor_rate is None else "",
        )
        for name, rate in rates.items()
    ]


def bench_memory(quick: bool) -> list[Result]:
    """Bytes a snapshot retains after decoding and folding, against the run's encoded events.

    Two anchors, stated plainly: the CBOR payloads alone, and the whole output of
    `encode_event` (type name, schema version, payload) that a store keeps per event.
    """
    size = 1_000 if quick else 25_000
    rows = _encoded_rows(size)
    payloads = sum(len(payload) for _, _, _, payload, _ in rows)
    encoded = sum(len(t) + 1 + len(payload) for _, t, _, payload, _ in rows)
    gc.collect()
    tracemalloc.start()
    try:
        snapshot = _decode_and_fold(rows)
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert snapshot.last_sequence == size
    value = Measurement(median=retained, low=retained, high=retained, repeats=1)
    case = f"snapshot of a {size:,}-event step-heavy run, {PAYLOAD_BYTES}-byte payloads"
    return [
        Result(
            benchmark="memory",
            case=case,
            unit="bytes",
            value=value,
            anchor=f"CBOR payload bytes only ({payloads:,}) (target ≤ 2×)",
            ratio=retained / payloads,
        ),
        Result(
            benchmark="memory",
            case=case,
            unit="bytes",
            value=value,
            anchor=f"encode_event output: type + version + payload ({encoded:,}) (target ≤ 2×)",
            ratio=retained / encoded,
        ),
    ]
