"""A run's history as the run page lists it: each event's fields, payloads decoded.

Fields an event class hides from its `repr` (hook tokens: bearer secrets) are left out here, so
no page ever shows one. Byte fields become labelled payloads (`payloads.show_payload`); the rest
become short text, as the command line writes them (`runfold.cli.values`: times in UTC with
`Z`). Nothing here escapes: the templates do, for every value.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

import attrs

from runfold.cli.values import format_value, timestamp
from runfold.kernel import (
    Envelope,
    correlation_id,
)
from runfold.ui.payloads import LISTED_LIMIT, ShownPayload, show_payload

__all__ = [
    "HISTORY_TEXT",
    "EventField",
    "HistoryEntry",
    "history_entry",
    "payload_limit_for",
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


def history_entry(
    envelope: Envelope,
    start: datetime,
    steps: Mapping[str, str] | None = None,
    *,
    payload_limit: int = LISTED_LIMIT,
) -> HistoryEntry:
    """`envelope` as a history row; `start` is the run's first event's time.

    `steps` labels step ids (`runfold.kernel.naming.step_names`): a step event's subject is
    its label, `charge #2`, and its `step_name` field is not repeated. Its payloads and texts
    are cut after `payload_limit` characters (see `payload_limit_for`).
    """
    event = envelope.event
    entity = correlation_id(event) or ""
    subject = steps.get(entity, entity) if steps and hasattr(event, "step_id") else entity
    fields = []
    for field in attrs.fields(cast(Any, type(event))):
        if field.repr is False:  # a secret (hook token): never shown
            continue
        value = getattr(event, field.name)
        if value is None or value == field.default or (entity and value == entity):
            continue
        if field.name == "step_name" and subject != entity:
            continue
        if isinstance(value, bytes):
            fields.append(
                EventField(name=field.name, text=None, payload=show_payload(value, payload_limit))
            )
        else:
            text = format_value(value)
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
