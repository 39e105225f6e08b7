"""A run's history as the run page lists it: each event's fields, payloads decoded.

Fields an event class hides from its `repr` (hook tokens: bearer secrets) are left out here, so
no page ever shows one. Byte fields become labelled payloads (`payloads.show_payload`); the rest
become short text. Nothing here escapes: the templates do, for every value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

import attrs

from runfold.kernel import (
    AttributeChange,
    Envelope,
    HookState,
    RetryPolicy,
    Snapshot,
    correlation_id,
)
from runfold.ui.payloads import LISTED_LIMIT, ShownPayload, show_payload

__all__ = [
    "HISTORY_TEXT",
    "EventField",
    "HistoryEntry",
    "history_entry",
    "hook_status",
    "payload_limit_for",
    "short_text",
    "timestamp",
]


@attrs.frozen(kw_only=True, slots=True)
class EventField:
    """One field of an event: short `text`, or a decoded `payload` for bytes."""

    name: str
    text: str | None
    payload: ShownPayload | None


@attrs.frozen(kw_only=True, slots=True)
class HistoryEntry:
    """One row of the history table."""

    sequence: int
    position: int | None
    event_type: str
    recorded_at: str
    elapsed: str
    subject: str
    fields: tuple[EventField, ...]


HISTORY_TEXT = 100_000
"""The characters of payload text a page of history shows at most, however many rows it has.

Escaped (a quote becomes five characters), that stays under half a megabyte.
"""


def payload_limit_for(rows: int) -> int:
    """The cut of each payload in a page of `rows` history rows (two payloads a row at most)."""
    return max(64, min(LISTED_LIMIT, HISTORY_TEXT // (2 * rows)))


def timestamp(value: datetime) -> str:
    """A time as the pages show it: ISO 8601 to the millisecond, `Z` for UTC."""
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def hook_status(hook: HookState, run: Snapshot) -> str:
    """A hook's status as `runfold show` words it: `released` or `retained until …` once ended.

    An active hook of an ended run holds its token only while it is retained.

    The command line has the same rule (`runfold.cli.output.hook_status`); the inspector does
    not import the CLI, nor the CLI the inspector's extra, so each keeps its few lines.
    """
    if hook.status != "active" or not run.is_terminal:
        return hook.status
    if hook.retain_token_until is not None and (
        run.completed_at is None or hook.retain_token_until > run.completed_at
    ):
        return f"retained until {timestamp(hook.retain_token_until)}"
    return "released"


def short_text(value: object) -> str:
    """A one-line text form of a non-bytes field value (times ISO 8601, durations in seconds)."""
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, RetryPolicy):
        return (
            f"{value.max_attempts} attempts from {short_text(value.initial_interval)} "
            f"x{value.backoff_coefficient:g}"
        )
    if isinstance(value, AttributeChange):
        return f"{value.key}={'(removed)' if value.value is None else value.value}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, tuple):
        return ", ".join(short_text(item) for item in value)
    if attrs.has(type(value)):
        inner = ", ".join(
            f"{f.name}={short_text(getattr(value, f.name))}"
            for f in attrs.fields(cast(Any, type(value)))
            if f.repr is not False
        )
        return f"{type(value).__name__}({inner})"
    if isinstance(value, str):
        return value
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def history_entry(
    envelope: Envelope, start: datetime, *, payload_limit: int = LISTED_LIMIT
) -> HistoryEntry:
    """`envelope` as a history row; `start` is the run's first event's time.

    Its payloads and texts are cut after `payload_limit` characters (see `payload_limit_for`).
    """
    event = envelope.event
    subject = correlation_id(event) or ""
    fields = []
    for field in attrs.fields(cast(Any, type(event))):
        if field.repr is False:  # a secret (hook token): never shown
            continue
        value = getattr(event, field.name)
        if value is None or value == field.default or (subject and value == subject):
            continue
        if isinstance(value, bytes):
            fields.append(
                EventField(name=field.name, text=None, payload=show_payload(value, payload_limit))
            )
        else:
            text = short_text(value)
            if len(text) > payload_limit:  # a progress message or a reason may be megabytes
                text = text[:payload_limit] + "… (cut)"
            fields.append(EventField(name=field.name, text=text, payload=None))
    return HistoryEntry(
        sequence=envelope.sequence,
        position=envelope.position,
        event_type=event.event_type,
        recorded_at=timestamp(envelope.recorded_at),
        elapsed=f"+{(envelope.recorded_at - start).total_seconds():.3f}s",
        subject=subject,
        fields=tuple(fields),
    )
