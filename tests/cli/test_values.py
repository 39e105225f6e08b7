"""The command line and the inspector show a value the same way (`runfold.cli.values`): times
in UTC with `Z` whatever offset they came with, durations in words, secrets never."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from runfold.cli.values import duration, format_value, timestamp
from runfold.events import Envelope, HookCreated, WaitCreated
from runfold.ui.history import history_entry

PARIS = timezone(timedelta(hours=2))
KOLKATA = timezone(timedelta(hours=5, minutes=30))


def test_a_time_is_shown_in_utc_whatever_its_offset() -> None:
    at = datetime(2026, 12, 1, 23, 44, 2, 125_000, tzinfo=PARIS)
    assert timestamp(at) == "2026-12-01T21:44:02.125Z"
    assert timestamp(at.astimezone(UTC)) == timestamp(at)


def test_the_inspectors_history_shows_times_as_the_command_line_does() -> None:
    resume_at = datetime(2026, 12, 2, 9, 0, tzinfo=KOLKATA)
    recorded_at = datetime(2026, 12, 2, 1, 0, tzinfo=PARIS)
    event = WaitCreated(wait_id="w", resume_at=resume_at)
    envelope = Envelope(run_id="r", sequence=3, event=event, recorded_at=recorded_at)
    entry = history_entry(envelope, recorded_at - timedelta(seconds=2))
    assert entry.recorded_at == "2026-12-01T23:00:00.000Z" == format_value(recorded_at)
    shown = {field.name: field.text for field in entry.fields}
    assert shown["resume_at"] == "2026-12-02T03:30:00.000Z" == format_value(resume_at)
    assert entry.elapsed == "+2.000s"


def test_values_in_words_and_secrets_left_out() -> None:
    assert duration(0.25) == "250 ms" and duration(184) == "3 min 4 s"
    assert format_value(timedelta(seconds=90)) == "1 min 30 s"
    hook = HookCreated(hook_id="h", token="bearer-secret")
    assert "bearer-secret" not in format_value(hook)
