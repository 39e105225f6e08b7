"""One append to PostgreSQL: its `append_request`, encoded before any SQL runs.

A bad event fails here, without a round trip. An `Append` that goes in a group commit also
carries the future its caller awaits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from runfold.kernel import Event, RunIndex, correlation_id, encode_event
from runfold.stores.postgres.wire import (
    BYTEA,
    I4,
    I4_MAX,
    I8_MAX,
    INT4,
    NO_CLAIMS,
    NO_WAKEUPS,
    TEXT,
    array_field,
    claims_fields,
    int4_field,
    int8_field,
    record,
    text_field,
    time_field,
    utf8,
    wakeups_fields,
)
from runfold.stores.time_keys import time_key

__all__ = ["Append"]


class Append:
    """One append as an `append_request`, encoded before any SQL runs.

    A bad event fails without a round trip. `future` is what its caller awaits when it goes in a
    group commit.
    """

    __slots__ = (
        "attributes",
        "claims",
        "count",
        "deadline",
        "encoded",
        "events",
        "expected",
        "expected_position",
        "future",
        "index",
        "recorded_at",
        "run_id",
        "ticket",
    )

    def __init__(
        self,
        run_id: str,
        expected: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.expected = expected
        # Positions are positive bigints: one out of that range is no event's, and -1 conflicts
        # as that value would.
        if expected <= 0 or expected_position is None:
            self.expected_position: int | None = None
        else:
            self.expected_position = expected_position if 0 < expected_position < I8_MAX else -1
        self.events = events
        self.count = len(events)
        self.index = index
        self.recorded_at = recorded_at
        self.future: asyncio.Future[int] | None = None
        self.ticket = -1  # its place among the appends queued, once queued
        self.deadline = 0.0  # the event loop time by which it must be settled (the store's)
        self.claims = index.claims_at(recorded_at)
        self.encoded = [encode_event(event) for event in events]
        attributes = index.summary.attributes
        self.attributes = json.dumps(dict(attributes), sort_keys=True) if attributes else "{}"

    @property
    def plain(self) -> bool:
        """Whether these are events onto a run without hook claims or wakeups.

        `append_plain_batch` may write those in a group commit.
        """
        return (
            0 < self.expected <= I4_MAX - self.count  # the new head is an integer column too
            and not self.claims
            and not self.index.wakeups
        )

    @property
    def single(self) -> bool:
        """Whether this is a plain append of one event, which `plain_append` may write alone.

        Its parameters are `plain_parameters`.
        """
        return self.count == 1 and self.plain

    def plain_parameters(self) -> dict[str, Any]:
        """The parameters of `plain_append`."""
        summary = self.index.summary
        ((event_type, version, payload),) = self.encoded
        completed_at = summary.completed_at
        return {
            "status": summary.status,
            "updated_at": time_key(summary.updated_at),
            "completed_at": None if completed_at is None else time_key(completed_at),
            "last_sequence": summary.last_sequence,
            "attributes": self.attributes,
            "owner_id": summary.owner_id,
            "expected": self.expected,
            "expected_position": self.expected_position,
            "run_id": self.run_id,
            "type": event_type,
            "version": version,
            "correlation_id": correlation_id(self.events[0]),
            "payload": payload,
            "recorded_at": time_key(self.recorded_at),
        }

    def wire(self) -> bytes:
        """The binary `append_request`."""
        encoded, summary, index = self.encoded, self.index.summary, self.index
        expected = self.expected
        return record(
            (
                text_field(self.run_id),
                # A head is never negative, nor past what its column holds once the events are
                # added: out of that range, -1 conflicts as the value would.
                int4_field(expected if 0 <= expected <= I4_MAX - self.count else -1),
                array_field(TEXT, [event_type.encode() for event_type, _, _ in encoded]),
                array_field(INT4, [I4.pack(version) for _, version, _ in encoded]),
                array_field(TEXT, [utf8(correlation_id(event)) for event in self.events]),
                array_field(BYTEA, [payload for _, _, payload in encoded]),
                time_field(self.recorded_at),
                text_field(summary.workflow_name),
                text_field(summary.status),
                text_field(summary.parent_run_id),
                time_field(summary.created_at),
                time_field(summary.updated_at),
                time_field(summary.completed_at),
                int4_field(summary.last_sequence),
                text_field(self.attributes),
                *(claims_fields(self.claims) if self.claims else NO_CLAIMS),
                *(wakeups_fields(index.wakeups) if index.wakeups else NO_WAKEUPS),
                int8_field(self.expected_position),
                text_field(summary.owner_id),
                text_field(summary.queue_name),
                int4_field(summary.priority),
                text_field(summary.dedup_id),
            )
        )

    def settle(self, outcome: int | BaseException) -> None:
        """Hand the outcome to the caller waiting on this append's future."""
        assert self.future is not None
        if not self.future.done():
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)
