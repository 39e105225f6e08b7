"""Child processes for `tests/stores/test_sqlite_store.py`: racing appenders, a crash-prone one.

Run as `python -m tests.support.sqlite_worker race|crash '<json arguments>'` from the repository
root. Each child opens its own `SQLiteStore` on the shared file and reports what the store
acknowledged as JSON lines (one line per event of interest, flushed as written), so the parent
can check that no acknowledged write was lost, duplicated or reordered.

The crash plan (`crash_batch`) lives here so that the child that writes it and the parent that
checks it agree on what was attempted. This module imports only runfold (no pytest), so a child
starts quickly.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from runfold import Snapshot
from runfold.errors import SequenceConflict, StoreUnavailable
from runfold.events import (
    AttributeChange,
    AttributesSet,
    Envelope,
    Event,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.kernel import apply, project_run, run_index
from runfold.stores import SQLiteStore

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""The same start time as `tests.conftest.T0` (not imported from there: it pulls in pytest)."""

CHILD_BUSY_TIMEOUT = 30.0
"""Children wait this long for the write lock: generous, so a slow machine does not flake."""

# --- shared helpers -----------------------------------------------------------------------------


def envelopes(run_id: str, head: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
    return [
        Envelope(run_id=run_id, sequence=head + offset, event=event, recorded_at=at)
        for offset, event in enumerate(events, start=1)
    ]


def fold(snapshot: Snapshot | None, new: Sequence[Envelope]) -> Snapshot:
    """The kernel's snapshot after `new` (the run's first events when `snapshot` is None)."""
    return project_run(new) if snapshot is None else apply(snapshot, new)


def _write(log: IO[str], record: dict[str, Any]) -> None:
    log.write(json.dumps(record) + "\n")
    log.flush()


# --- race: many processes appending to shared and private runs ---------------------------------


def race_events(worker: int, append: int, size: int, *, create: bool) -> list[Event]:
    """The events worker `worker` sends for its `append`-th logical append; every event names
    its writer, so the parent can tell exactly whose events a history holds."""
    tag = f"w{worker}:a{append}"
    first: list[Event] = (
        [RunCreated(workflow_name="race", input=tag.encode()), RunStarted()] if create else []
    )
    return first + [LogRecorded(level="info", message=f"{tag}:k{k}") for k in range(size)]


def race_target(worker: int, append: int, shared: Sequence[str]) -> tuple[str, int]:
    """Which run the `append`-th logical append goes to, and how many log events it carries:
    even appends race on the shared runs, odd ones go to the worker's own run."""
    run_id = shared[(append // 2) % len(shared)] if append % 2 == 0 else f"own-{worker}"
    return run_id, 1 + append % 3


async def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        await asyncio.sleep(0.002)


async def race(args: dict[str, Any]) -> None:
    """Append `appends` logical appends, each retried until it lands; log every acknowledgement,
    every `SequenceConflict` (with the head it reported) and every `StoreUnavailable`."""
    worker: int = args["worker"]
    shared: list[str] = args["shared"]
    out = Path(args["out"])
    Path(f"{out}.ready").touch()
    await _wait_for(Path(args["go"]), 60.0)  # start together, so the appends really race
    snapshots: dict[str, Snapshot] = {}
    with out.open("w", encoding="utf-8") as log:
        async with await SQLiteStore.open(args["db"], busy_timeout=CHILD_BUSY_TIMEOUT) as store:
            for append in range(args["appends"]):
                run_id, size = race_target(worker, append, shared)
                while True:
                    known = snapshots.get(run_id)
                    try:
                        new = await store.read(
                            run_id, after=known.last_sequence if known is not None else 0
                        )
                    except StoreUnavailable:
                        _write(log, {"kind": "unavailable", "run": run_id, "append": append})
                        continue
                    snapshot = fold(known, new) if new else known
                    if snapshot is not None:
                        snapshots[run_id] = snapshot
                    head = snapshot.last_sequence if snapshot is not None else 0
                    events = race_events(worker, append, size, create=snapshot is None)
                    after = fold(snapshot, envelopes(run_id, head, events, T0))
                    try:
                        appended = await store.append_if_sequence(
                            run_id, head, events, index=run_index(after), recorded_at=T0
                        )
                    except SequenceConflict as exc:
                        _write(
                            log,
                            {
                                "kind": "conflict",
                                "run": exc.run_id,
                                "append": append,
                                "expected": exc.expected,
                                "actual": exc.actual,
                                "head": head,
                            },
                        )
                        continue
                    except StoreUnavailable:
                        _write(log, {"kind": "unavailable", "run": run_id, "append": append})
                        await asyncio.sleep(0.01)
                        continue
                    snapshots[run_id] = after
                    _write(
                        log,
                        {
                            "kind": "ack",
                            "run": run_id,
                            "append": append,
                            "created": snapshot is None,
                            "size": size,
                            "sequences": [e.sequence for e in appended],
                            "positions": [e.position for e in appended],
                        },
                    )
                    break


# --- crash: one process appending multi-event batches until it is killed ------------------------

CRASH_RUNS: dict[str, int] = {"crash-a": 40, "crash-b": 90, "crash-c": 5000, "crash-d": 5000}
"""The runs the crash child feeds, and how many batches each one's plan has: `crash-a` ends
completed (keeping one token retained), `crash-b` ends failed, the others stay live."""

RETAINED_UNTIL = T0 + timedelta(days=10)


def batch_time(batch: int) -> datetime:
    """Every event of batch `batch` is recorded at this time, so a batch is easy to recognise."""
    return T0 + timedelta(seconds=batch)


def crash_batch(run_id: str, batch: int) -> tuple[Event, ...] | None:
    """The `batch`-th batch the crash child appends to `run_id`, or None past the run's plan.

    The batches make the run's index rows move: hooks are created and some disposed, waits are
    created and some completed (wakeups come and go), attributes change, steps run, and two runs
    end (dropping their wakeups and live tokens, one keeping a retained token)."""
    length = CRASH_RUNS[run_id]
    if batch >= length:
        return None
    if batch == 0:
        return (
            RunCreated(
                workflow_name=f"wf-{run_id}",
                input=run_id.encode(),
                deadline=T0 + timedelta(days=1),
            ),
            RunStarted(),
        )
    if batch == length - 1 and run_id == "crash-a":
        return (
            HookCreated(hook_id="kept", token=f"{run_id}/kept", retain_token_until=RETAINED_UNTIL),
            RunCompleted(output=b"done"),
        )
    if batch == length - 1 and run_id == "crash-b":
        return (RunFailed(error=b"boom", error_code="E_BOOM"),)
    phase = batch % 6
    note = LogRecorded(level="info", message=f"{run_id}:{batch}")
    if phase == 1:
        return (HookCreated(hook_id=f"h{batch}", token=f"{run_id}/t{batch}"), note)
    if phase == 2:
        change = AttributeChange(key=f"k{batch % 5}", value=f"v{batch}")
        return (
            WaitCreated(wait_id=f"w{batch}", resume_at=T0 + timedelta(minutes=batch)),
            AttributesSet(changes=(change,)),
        )
    if phase == 3:
        return (HookReceived(hook_id=f"h{batch - 2}", payload=b"p"), note)
    if phase == 4:
        if batch % 12 == 4:  # complete every other wait and dispose every other hook
            return (WaitCompleted(wait_id=f"w{batch - 2}"), HookDisposed(hook_id=f"h{batch - 3}"))
        return (note,)
    if phase == 5:
        step = f"s{batch}"
        return (
            StepCreated(step_id=step, step_name="work", input=b""),
            StepStarted(step_id=step, attempt=1),
            StepCompleted(step_id=step, output=b"ok"),
        )
    return (note, LogRecorded(level="warning", message=f"{run_id}:{batch}:again"))


def batches_in(run_id: str, events: int) -> int:
    """How many whole batches of the plan make up the first `events` events of `run_id`."""
    total = batch = 0
    while total < events:
        planned = crash_batch(run_id, batch)
        if planned is None:
            raise AssertionError(f"{run_id} holds {events} events, more than its whole plan")
        total += len(planned)
        batch += 1
    if total != events:
        raise AssertionError(f"{run_id} holds {events} events: not a whole number of batches")
    return batch


async def _feed(store: SQLiteStore, run_id: str, log: IO[str]) -> None:
    history = await store.read(run_id)
    batch = batches_in(run_id, len(history))
    snapshot = project_run(history) if history else None
    while (events := crash_batch(run_id, batch)) is not None:
        head = snapshot.last_sequence if snapshot is not None else 0
        at = batch_time(batch)
        after = fold(snapshot, envelopes(run_id, head, events, at))
        await store.append_if_sequence(run_id, head, events, index=run_index(after), recorded_at=at)
        _write(log, {"run": run_id, "batch": batch})
        snapshot, batch = after, batch + 1


async def crash(args: dict[str, Any]) -> None:
    """Feed every crash run at once (so appends share group commits) until killed."""
    with Path(args["out"]).open("a", encoding="utf-8") as log:
        async with await SQLiteStore.open(args["db"], busy_timeout=CHILD_BUSY_TIMEOUT) as store:
            await asyncio.gather(*(_feed(store, run_id, log) for run_id in CRASH_RUNS))


def main(argv: Sequence[str]) -> None:
    mode, raw = argv
    args = json.loads(raw)
    asyncio.run(race(args) if mode == "race" else crash(args))


if __name__ == "__main__":
    main(sys.argv[1:])
