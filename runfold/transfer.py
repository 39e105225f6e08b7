"""Runs as JSON lines: `runfold export` and `runfold import`, and replay tests' histories.

One line per run, self-contained, so files concatenate:

    {"format": "runfold-runs", "version": 1, "run_id": "…", "events": [
        {"sequence": 1, "type": "run_created", "schema_version": 2,
         "recorded_at": "2026-01-02T03:04:05.000006+00:00", "payload": "<base64>"}, …]}

`payload` is the event as the kernel's codec encodes it for a store (`encode_event`: CBOR), so
an event is exported byte for byte as stored, hook tokens and payloads included: treat an
export as the store's own data. Decoding goes through the same codec, whose upcasters lift an
event written by an older kernel. `version` is this file format's; a reader refuses a version
it does not know (`ExportFormatError`) rather than misread it.

Import writes each run as it was first written, the runs oldest first (by their last event):
one `append_if_sequence` per run of events that share a time (a store stamps an append with
one time, so events of one time are what one append of the source wrote), so every event keeps
its time, and the run passes through the states it passed through. Everything is checked
before the first write: the lines decode, each history folds (`project_run`), no run is
repeated, none exists in the target and no hook token the runs held at any point is held there
by another run (`RunsAlreadyExist`, `TokenConflict`), so an import refused is an import that
wrote nothing. A store failing in the middle (it went away) leaves the run cut after one of its
appends: a state it was once in.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from runfold.kernel import (
    Envelope,
    RunfoldError,
    Snapshot,
    TokenConflict,
    apply,
    project_run,
    run_index,
)
from runfold.kernel.codec import decode_event, encode_event
from runfold.stores.protocol import EventStore

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "ExportFormatError",
    "RunsAlreadyExist",
    "export_line",
    "export_runs",
    "import_runs",
    "read_export",
]

EXPORT_FORMAT = "runfold-runs"
"""The `format` field of every exported line."""
EXPORT_VERSION = 1
"""The `version` field this runfold writes, and the newest it reads."""


class ExportFormatError(RunfoldError):
    """A line of an export file is not a run this runfold can read (`line` is its number)."""

    code = "export_format"
    status = 422

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"export line {line}: {reason}")
        self.line = line


class RunsAlreadyExist(RunfoldError):
    """`import_runs` met runs the target store already holds (or a file repeating one).

    `run_ids` lists them; nothing was written.
    """

    code = "runs_already_exist"
    status = 409

    def __init__(self, run_ids: Sequence[str]) -> None:
        shown = ", ".join(repr(r) for r in run_ids[:5]) + (" …" if len(run_ids) > 5 else "")
        super().__init__(
            f"{len(run_ids)} run(s) to import already exist, nothing was imported: {shown}"
        )
        self.run_ids = tuple(run_ids)


def export_line(history: Sequence[Envelope]) -> str:
    """The export line of one run's whole history (its envelopes, in sequence order)."""
    events = []
    for envelope in history:
        event_type, version, payload = encode_event(envelope.event)
        events.append(
            {
                "sequence": envelope.sequence,
                "type": event_type,
                "schema_version": version,
                "recorded_at": envelope.recorded_at.isoformat(),
                "payload": base64.b64encode(payload).decode("ascii"),
            }
        )
    line = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "run_id": history[0].run_id,
        "events": events,
    }
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False)


async def export_runs(store: EventStore, run_ids: Iterable[str]) -> AsyncIterator[str]:
    """The export line of each run, in the order given; a run without events is skipped."""
    for run_id in run_ids:
        history = await store.read(run_id)
        if history:
            yield export_line(history)


def read_export(lines: Iterable[str]) -> Iterator[list[Envelope]]:
    """Each run's history (its envelopes, as exported) from export lines; blank lines skipped.

    Raises:
        ExportFormatError: A line is not JSON, not of this format, of a newer version, or holds
            an event that does not decode.
    """
    for number, text in enumerate(lines, start=1):
        if text.strip():
            yield _history(number, text)


def _history(number: int, text: str) -> list[Envelope]:
    try:
        line = json.loads(text)
    except ValueError as exc:
        raise ExportFormatError(number, f"not JSON ({exc})") from None
    if not isinstance(line, dict) or line.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(number, f"not a {EXPORT_FORMAT!r} line")
    version = line.get("version")
    if type(version) is not int or not 1 <= version <= EXPORT_VERSION:
        raise ExportFormatError(
            number, f"format version {version!r}; this runfold reads 1 to {EXPORT_VERSION}"
        )
    run_id, events = line.get("run_id"), line.get("events")
    if not isinstance(run_id, str) or not run_id or not isinstance(events, list) or not events:
        raise ExportFormatError(number, "a line needs a run_id and at least one event")
    return [_envelope(number, run_id, item) for item in events]


def _envelope(number: int, run_id: str, item: Any) -> Envelope:
    try:
        sequence, recorded_at = item["sequence"], datetime.fromisoformat(item["recorded_at"])
        payload = base64.b64decode(item["payload"], validate=True)
        event = decode_event(item["type"], item["schema_version"], payload)
    except (KeyError, TypeError, ValueError, binascii.Error, RunfoldError) as exc:
        reason = f"an event of run {run_id!r} does not decode: {exc}"
        raise ExportFormatError(number, reason) from None
    if type(sequence) is not int or recorded_at.tzinfo is None:
        raise ExportFormatError(number, f"an event of run {run_id!r} has a bad sequence or time")
    return Envelope(run_id=run_id, sequence=sequence, event=event, recorded_at=recorded_at)


async def import_runs(store: EventStore, histories: Iterable[Sequence[Envelope]]) -> int:
    """Append each run's history to `store` as a new run; how many runs were imported.

    Each run is written as it was first written: one append per run of events that share a
    time (what one append of the source store wrote), so every event keeps its own time.

    Raises:
        RunsAlreadyExist: A run exists in `store`, or is given twice; nothing was written.
        TokenConflict: A hook token a run's hooks hold at any point of its history is held in
            `store` by another run; nothing was written.
        HistoryError: A history breaks a law of `project_run` (its run named); nothing written.
    """
    runs: list[list[tuple[Sequence[Envelope], Snapshot]]] = []
    seen: set[str] = set()
    repeated: list[str] = []
    for history in histories:
        run_id = history[0].run_id
        if run_id in seen:
            repeated.append(run_id)
        seen.add(run_id)
        runs.append(_appends(history))
    existing = [s.run_id for s in await store.get_runs(sorted(seen)) if s is not None]
    if repeated or existing:
        raise RunsAlreadyExist(sorted({*repeated, *existing}))
    # The tokens the runs' hooks hold after any of their appends (live, or retained past the
    # run's end) must be free of other runs.
    for appends in runs:
        for _, snapshot in appends:
            for claim in run_index(snapshot).claims_at(snapshot.updated_at):
                holder = await store.find_hook(claim.token, now=snapshot.updated_at)
                if holder is not None and holder.run_id != snapshot.run_id:
                    raise TokenConflict(claim.token, holder.run_id, holder.hook_id)
    # Oldest first, as they were written: a token one run freed and a later one took is
    # claimed again in that order.
    runs.sort(key=lambda appends: appends[-1][1].updated_at)
    for appends in runs:
        for events, snapshot in appends:
            await store.append_if_sequence(
                snapshot.run_id,
                events[0].sequence - 1,
                [envelope.event for envelope in events],
                index=run_index(snapshot),
                recorded_at=events[0].recorded_at,
            )
    return len(runs)


def _appends(history: Sequence[Envelope]) -> list[tuple[Sequence[Envelope], Snapshot]]:
    """`history` cut where the time changes (the source's appends), each part with the run
    after it.

    Raises:
        HistoryError: The history breaks a law of `project_run`.
    """
    parts: list[Sequence[Envelope]] = []
    start = 0
    for end in range(1, len(history) + 1):
        if end == len(history) or history[end].recorded_at != history[start].recorded_at:
            parts.append(history[start:end])
            start = end
    appends: list[tuple[Sequence[Envelope], Snapshot]] = []
    snapshot: Snapshot | None = None
    for part in parts:
        snapshot = project_run(part) if snapshot is None else apply(snapshot, part)
        appends.append((part, snapshot))
    return appends
