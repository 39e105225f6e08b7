"""Replay: a run's stored rows folded straight into its snapshot (`project_rows`).

A cold load reads a run's whole history and folds it. Decoded the usual way, every stored row
becomes an event and an envelope that the fold reads once and drops. Here the payloads are read
in one call of the CBOR decoder (`wire.load_payloads`), and the events a run repeats (those of
steps, waits, deliveries and log lines: `_handlers.FIELD_HANDLERS`) are folded
straight from their positional payloads by an unpacker generated once per type
(`fast.compile_unpacker`), which checks every field as the type's decoder does. Any other row
is decoded into its event and folded as usual. A time is converted once for each run of equal
consecutive values (the rows of one append share their time).

The result is always the one of the ordinary path, `project_run` of the envelopes the rows
decode into, or its error: whenever the fast path meets what it does not read (a row of an
older schema version, a payload or a column it refuses, a history that breaks a law of the
catalogue), the rows are decoded and folded the ordinary way, which raises precisely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice, repeat
from typing import Any

from runfold.kernel.bulk import in_bulk
from runfold.kernel.codec import decode_events, default_codec
from runfold.kernel.events import Event, make_envelope, make_envelopes
from runfold.kernel.fast import compile_unpacker
from runfold.kernel.limits import DEFAULT_LIMITS, Limits
from runfold.kernel.snapshot._builder import Builder, start_builder
from runfold.kernel.snapshot._handlers import FIELD_HANDLERS, HANDLERS
from runfold.kernel.snapshot.reducer import project_run
from runfold.kernel.snapshot.states import Snapshot
from runfold.kernel.wire import load_payloads

__all__ = ["project_rows"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_Folder = Callable[[Builder, Any, datetime], None]
"""Folds one row's unstructured payload, recorded at a time, into a fold's builder."""


def _decoding_folder(decode: Callable[[Any], Event], handle: Any) -> _Folder:
    """A folder that structures the payload into its event (raising where it is wrong), then
    folds the event."""

    def fold(b: Builder, payload: Any, at: datetime) -> None:
        handle(b, decode(payload), at)

    return fold


def _folders() -> dict[str, _Folder]:
    """The folder of each event type's current schema version, by type."""
    folders: dict[str, _Folder] = {}
    for event_type, decode in default_codec._current.items():
        cls = default_codec._types[event_type]
        by_event = _decoding_folder(decode, HANDLERS[cls])
        by_fields = FIELD_HANDLERS.get(cls)
        if by_fields is not None and cls.positional:
            folders[event_type] = compile_unpacker(cls, by_fields, by_event)
        else:
            folders[event_type] = by_event
    return folders


_FOLDERS = _folders()
_VERSIONS = default_codec._versions


def project_rows(
    run_id: str,
    sequences: Sequence[int],
    types: Sequence[str],
    versions: Sequence[int],
    payloads: Sequence[bytes],
    times: Sequence[int],
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> Snapshot:
    """The snapshot of `run_id`'s stored rows: `project_run` of the envelopes they decode into.

    Row `i` is the event stored as `(types[i], versions[i], payloads[i])` (`decode_event`) at
    `sequences[i]`, recorded at `times[i]`, integer microseconds since the Unix epoch (as the
    codec writes times). The rows are folded without building their events where they can be,
    which is faster; the snapshot, or the error, is the same.

    Raises:
        EventDecodeError: A row does not decode.
        HistoryError: The history breaks a law of `project_run` (an empty one included).
        RunNotSupported: The run was stamped by a newer kernel spec.
        ValueError: The columns are not all of one length.
        TypeError: A time is not an `int` (a float, say, that a loosely typed column let in).
    """
    count = len(payloads)
    if not len(sequences) == len(types) == len(versions) == len(times) == count:
        raise ValueError("project_rows takes a sequence, type, version, payload and time per row")
    if not count:
        return project_run([], limits=limits)  # raises for the empty history
    if set(map(type, times)) != {int}:
        raise TypeError("a time that is not integer microseconds")
    return in_bulk(count, _project, run_id, sequences, types, versions, payloads, times, limits)


def _project(
    run_id: str,
    sequences: Sequence[int],
    types: Sequence[str],
    versions: Sequence[int],
    payloads: Sequence[bytes],
    times: Sequence[int],
    limits: Limits,
) -> Snapshot:
    if tuple(map(_VERSIONS.get, types)) == tuple(versions):  # every row at its current version
        try:
            return _fold_rows(run_id, sequences, types, payloads, times, limits)
        except Exception:
            pass  # the ordinary path below raises precisely, or folds what this one refused
    events = decode_events(types, versions, payloads)
    recorded = [_EPOCH + timedelta(0, 0, time) for time in times]
    history = make_envelopes(
        len(payloads), repeat(run_id), sequences, events, recorded, repeat(None)
    )
    return project_run(history, limits=limits)


def _fold_rows(
    run_id: str,
    sequences: Sequence[int],
    types: Sequence[str],
    payloads: Sequence[bytes],
    times: Sequence[int],
    limits: Limits,
) -> Snapshot:
    """The fast path: rows of current schema versions only; raises on anything it refuses."""
    items = load_payloads(payloads)
    last_time = times[0]
    at = _EPOCH + timedelta(0, 0, last_time)
    event = default_codec._current[types[0]](items[0])
    b = start_builder(make_envelope(run_id, sequences[0], event, at, None), limits)
    folders = _FOLDERS
    step = _MICROSECOND
    seq = 1
    rest = [islice(column, 1, None) for column in (sequences, types, items, times)]
    for sequence, event_type, item, time in zip(*rest, strict=True):
        seq += 1
        b.seq = seq
        if sequence != seq:
            raise ValueError("a gap or a repeat")  # the ordinary path names it
        if time != last_time:
            # From the time before: exact for integers, and adding a small timedelta costs
            # less than building one from a large count of microseconds.
            at += step * (time - last_time)
            last_time = time
        folders[event_type](b, item, at)
    b.updated_at = at  # no handler reads it: the last event's time is the run's
    return b.freeze()
