"""Kernel benchmarks: fold, apply to a cached snapshot, and the memory a snapshot takes."""

from __future__ import annotations

import contextlib
import gc
import json
import pickle
import subprocess
import sys
import tempfile
import tracemalloc
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Measurement, Result, compare, measure
from benchmarks.targets import (
    FOLD_RATE,
    FOLD_RATE_EVENTS_PER_SECOND,
    SNAPSHOT_BYTES_PER_EVENT_BEFORE,
    SNAPSHOT_MEMORY,
)
from benchmarks.workloads import PAYLOAD_BYTES, T0, step_events, step_heavy_history
from runfold import Snapshot
from runfold.events import Envelope
from runfold.kernel import Limits, apply, encode_event, make_envelope, project_run
from runfold.stores._sql import envelopes_from_rows, replay_rows
from runfold.stores.time_keys import time_key

__all__ = [
    "EncodedRow",
    "bench_apply",
    "bench_fold",
    "bench_memory",
    "decode_and_fold",
    "decode_rows",
    "decode_rows_and_fold",
    "encoded_rows",
]

MEMORY_RUN_EVENTS = 10_000
"""Events of the run whose snapshot the memory benchmark weighs (≡ 1 (mod 3), so that
eventsourcing's aggregate of the same steps holds as many)."""

EncodedRow = tuple[int, str, int, bytes, int, None]
"""(sequence, type, schema_version, payload, recorded_at key, position) as a SQL store's read
fetches a run's row (`envelopes_from_rows`)."""


def encoded_rows(size: int) -> list[EncodedRow]:
    """A step-heavy run of `size` events, encoded as a store keeps it."""
    rows = []
    for envelope in step_heavy_history(size):
        event_type, version, payload = encode_event(envelope.event)
        rows.append(
            (envelope.sequence, event_type, version, payload, time_key(envelope.recorded_at), None)
        )
    return rows


def decode_rows(rows: list[EncodedRow]) -> list[Envelope]:
    """What a SQL store's read does once the rows are fetched (`envelopes_from_rows`): decode
    them together and build their envelopes."""
    return envelopes_from_rows(rows, "run-bench")


def decode_and_fold(rows: list[EncodedRow]) -> Snapshot:
    """What a SQL store's `replay` does once the rows are fetched (`replay_rows`): fold them
    straight into the snapshot (`project_rows`)."""
    replayed = replay_rows(rows, "run-bench", Limits())
    assert replayed is not None
    return replayed.snapshot


def decode_rows_and_fold(rows: list[EncodedRow]) -> Snapshot:
    """`decode_rows`, then `project_run`: a store's `read`, then the fold of its envelopes."""
    return project_run(decode_rows(rows))


def bench_fold(quick: bool) -> list[Result]:
    """`project_run` over pre-decoded step-heavy histories."""
    results = []
    for size in [1_000] if quick else [1_000, 10_000, 25_000]:
        history = step_heavy_history(size)
        rate = measure(partial(project_run, history), units=size, repeats=3 if quick else 15)
        goal = Measurement.of([FOLD_RATE_EVENTS_PER_SECOND])
        results.append(
            Result(
                group="Fold",
                case=f"project_run, {size:,} pre-decoded events",
                on="in memory",
                unit="events/s",
                value=rate,
                comparisons=compare(rate, "1,000,000 events/s", goal, FOLD_RATE),
            )
        )
    return results


def bench_apply(quick: bool) -> list[Result]:
    """`apply` of one step's three events to a cached snapshot, by run length."""
    results = []
    rounds = 200 if quick else 2_000
    baseline: Measurement | None = None
    for size in [10, 1_000] if quick else [10, 1_000, 25_000]:
        history = step_heavy_history(size)
        tail = step_events(size, 3 * rounds)  # steps numbered beyond any the history holds
        batches = [
            [
                make_envelope(
                    "run-bench", size + 3 * n + k + 1, event, T0 + timedelta(seconds=n), None
                )
                for k, event in enumerate(tail[3 * n : 3 * n + 3])
            ]
            for n in range(rounds)
        ]

        def chain(h: Any = history, b: list[Any] = batches) -> None:
            snapshot = project_run(h)
            for batch in b:
                snapshot = apply(snapshot, batch)

        fold_only = measure(partial(project_run, history), units=1, repeats=3)
        total = measure(chain, units=1, repeats=3 if quick else 7)
        # Time per apply = (chain - fold) / rounds, reported as applies/s.
        per_apply = (1 / total.median - 1 / fold_only.median) / rounds
        rate = Measurement(
            median=1 / per_apply, low=1 / per_apply, high=1 / per_apply, repeats=total.repeats
        )
        baseline = baseline or rate
        results.append(
            Result(
                group="Apply",
                case=f"apply 3 events to a cached snapshot of {size:,} events",
                on="in memory",
                unit="applies/s",
                value=rate,
                comparisons=compare(rate, "the 10-event run", baseline),
                note="spread not measured separately (derived from chain minus fold medians)",
            )
        )
    return results


def _held_by_snapshot(rows: list[EncodedRow]) -> float:
    """Bytes the snapshot of `rows` holds: allocated while decoding and folding them and still
    held after a collection (tracemalloc), measured after a first fold so that caches filled
    once per process are not counted."""
    decode_and_fold(rows)
    gc.collect()
    tracemalloc.start()
    try:
        snapshot = decode_and_fold(rows)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert snapshot.last_sequence == len(rows)
    return float(held)


def bench_memory(quick: bool) -> list[Result]:
    """What a snapshot costs in memory: the bytes held by the snapshot of a 10,000-event run,
    against today's per event and eventsourcing's aggregate of the same history; the traced
    peak while decoding and folding; and the peak RSS growth of a fresh process doing it."""
    size = MEMORY_RUN_EVENTS
    rows = encoded_rows(size)
    encoded = sum(len(row[1]) + 1 + len(row[3]) for row in rows)
    held = _held_by_snapshot(rows)
    gc.collect()
    tracemalloc.start()
    try:
        decode_and_fold(rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss, method = _peak_rss_growth(rows)
    case = f"{size:,}-event step-heavy run, {PAYLOAD_BYTES}-byte payloads"
    before = Measurement.of([SNAPSHOT_BYTES_PER_EVENT_BEFORE * size])
    peer: tuple[Comparison, ...] = ()
    with contextlib.suppress(ImportError):
        from benchmarks.es_peer import eventsourcing_aggregate_bytes

        aggregate, events = eventsourcing_aggregate_bytes(size)
        assert events == size
        peer = (Comparison(anchor="eventsourcing aggregate (tracemalloc)", ratio=held / aggregate),)

    def row(what: str, value: float, comparisons: tuple[Comparison, ...], note: str = "") -> Result:
        return Result(
            group="Memory",
            case=f"{what}, {case}",
            on="in memory",
            unit="bytes",
            value=Measurement.of([value]),
            comparisons=comparisons
            + compare(
                Measurement.of([value]),
                f"encode_event output ({encoded:,} bytes)",
                Measurement.of([encoded]),
            ),
            note=note,
            lower_is_better=True,
        )

    return [
        row(
            "held by the snapshot after decode + fold (tracemalloc, after gc)",
            held,
            compare(
                Measurement.of([held]),
                f"before schema version 2 ({SNAPSHOT_BYTES_PER_EVENT_BEFORE} bytes/event)",
                before,
                SNAPSHOT_MEMORY,
            )
            + peer,
        ),
        row("traced peak while decoding + folding (tracemalloc)", peak, ()),
        row(
            "peak RSS growth of a fresh process decoding + folding, snapshot held",
            rss,
            (),
            note=f"measured once; {method}",
        ),
    ]


def _peak_rss_growth(rows: list[EncodedRow]) -> tuple[float, str]:
    """Bytes the peak RSS of a fresh interpreter rises by while it decodes and folds `rows`
    (loaded beforehand) and holds the snapshot, and how that was read."""
    with tempfile.TemporaryDirectory(prefix="runfold-bench-") as directory:
        path = Path(directory) / "rows.pickle"
        path.write_bytes(pickle.dumps(rows))
        found = subprocess.run(
            [sys.executable, "-m", "benchmarks.rss_probe", str(path)],
            check=True,
            capture_output=True,
            cwd=Path(__file__).resolve().parent.parent,  # where `benchmarks` imports from
            text=True,
        )
    report = json.loads(found.stdout)
    return float(report["growth"]), str(report["method"])
