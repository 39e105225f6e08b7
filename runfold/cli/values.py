"""How runfold shows a value as text, on the command line and in the web inspector alike.

One time format everywhere: ISO 8601 in UTC to the millisecond, with `Z`, whatever the offset a
time came with. Durations in words ("250 ms", "1.2 s", "3 min 4 s"). A hook's status as a person
reads it (`released`, `retained until …`). Fields an attrs class hides from its `repr` (hook
tokens: bearer secrets) are left out of every form here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from runfold.kernel import AttributeChange, HookState, RetryPolicy, Snapshot

__all__ = [
    "duration",
    "elapsed",
    "field_texts",
    "format_value",
    "hook_status",
    "preview",
    "timestamp",
]


def preview(payload: bytes | None, width: int = 48) -> str:
    """A short, one-line form of an opaque payload: its text if UTF-8, else its size."""
    if payload is None:
        return "-"
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes>"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def timestamp(value: datetime) -> str:
    """`value` in ISO 8601, in UTC, to the millisecond, with `Z`: `2026-12-01T21:44:02.125Z`."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """A duration in words: `250 ms`, `1.2 s`, `3 min 4 s`, `2 h 5 min`, `3 d 4 h`."""
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{sign}{seconds:.3g} s"
    for unit, size, smaller, small_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if seconds >= size:
            whole, rest = divmod(round(seconds), size)
            part = rest // small_size
            return f"{sign}{whole} {unit}" + (f" {part} {smaller}" if part else "")
    raise AssertionError("unreachable")  # pragma: no cover


def elapsed(since: datetime, at: datetime) -> str:
    """`+1.2 s`: the time from `since` to `at`."""
    return "+" + duration((at - since).total_seconds())


def format_value(value: object) -> str:
    """A short, one-line text form of a field value (bytes previewed, times ISO 8601)."""
    if isinstance(value, bytes):
        return preview(value)
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, timedelta):
        return duration(value.total_seconds())
    if isinstance(value, RetryPolicy):
        return (
            f"{value.max_attempts} attempts from {format_value(value.initial_interval)} "
            f"x{value.backoff_coefficient:g}"
        )
    if isinstance(value, AttributeChange):
        return f"{value.key}={'(removed)' if value.value is None else value.value}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, tuple):
        return ", ".join(format_value(item) for item in value)
    if attrs.has(type(value)):
        fields = ", ".join(field_texts(value))
        return f"{type(value).__name__}({fields})" if fields else type(value).__name__
    if isinstance(value, str) and (not value or any(c.isspace() for c in value)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _is_default(field: attrs.Attribute[Any], value: object) -> bool:
    default = field.default
    if default is attrs.NOTHING:
        return False
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return False
    return bool(value == default)


def field_texts(value: Any, skip: str | None = None) -> list[str]:
    """`name=value` for the fields of an attrs instance that are neither secret nor default."""
    parts = []
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        if field.repr is False or _is_default(field, item) or (skip is not None and item == skip):
            continue
        parts.append(f"{field.name}={format_value(item)}")
    return parts


def hook_status(run: Snapshot, hook: HookState) -> str:
    """A hook's status as a person reads it, `released` or `retained …` once its run ended.

    An active hook of an ended run still holds its token while `retain_token_until` is later
    than the run's end (retained), else the token is free again (released).
    """
    if hook.status != "active" or not run.is_terminal:
        return hook.status
    if hook.retain_token_until is not None and (
        run.completed_at is None or hook.retain_token_until > run.completed_at
    ):
        return f"retained until {timestamp(hook.retain_token_until)}"
    return "released"
