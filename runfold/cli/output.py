"""How the CLI writes: aligned tables and colour on a terminal that wants them, plain text when
piped, JSON for scripts; and the text forms of events, timelines and snapshots.

Hook tokens are bearer secrets: every field an attrs class hides from its `repr` (tokens) is
left out of every form here, text and JSON alike.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

import attrs

from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    AttributeChange,
    Envelope,
    RetryPolicy,
    Snapshot,
    correlation_id,
)

__all__ = [
    "Terminal",
    "describe_event",
    "elapsed",
    "envelope_json",
    "format_value",
    "preview",
    "redact",
    "render_snapshot",
    "render_timeline",
    "to_json",
]

_STYLES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "cyan": "36",
}
_STATUS_STYLES = {
    "completed": "green",
    "failed": "red",
    "timed_out": "red",
    "cancelled": "yellow",
    "cancelling": "yellow",
    "running": "cyan",
    "pending": "blue",
    "waiting": "cyan",
    "active": "cyan",
}
_SECRET_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@/\s]*@")


def redact(text: str) -> str:
    """`text` with any password in a URL (`scheme://user:password@host`) replaced by `***`."""
    return _SECRET_IN_URL.sub(r"\1***@", text)


class Terminal:
    """Where the CLI writes: results to `out`, errors and progress to `err`.

    Colour is used only when `out` is a terminal, `NO_COLOR` is unset or empty and `TERM` is not
    `dumb`; a progress bar only when `err` is a terminal.
    """

    def __init__(self, out: TextIO, err: TextIO, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.out = out
        self.err = err
        self.color = out.isatty() and not env.get("NO_COLOR") and env.get("TERM") != "dumb"
        self.live_progress = err.isatty()

    def paint(self, text: str, style: str | None) -> str:
        """`text` in `style` (a name of `_STYLES`) when colour is on, else unchanged."""
        if not self.color or style is None or not text:
            return text
        return f"\x1b[{_STYLES[style]}m{text}\x1b[0m"

    def status(self, status: str) -> str:
        """A run, step, wait or hook status, coloured by what it means."""
        return self.paint(status, _STATUS_STYLES.get(status))

    def line(self, text: str = "") -> None:
        """Write one line of results."""
        print(text, file=self.out, flush=True)

    def error(self, message: str) -> None:
        """Write one error line to `err`, passwords redacted (a multi-line message is joined)."""
        one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
        print(f"runfold: error: {redact(one_line)}", file=self.err)

    def json(self, value: object) -> None:
        """Write `value` (already made of JSON types) as indented JSON."""
        print(json.dumps(value, indent=2, ensure_ascii=False), file=self.out)

    def table(
        self,
        headers: Sequence[str],
        rows: Iterable[Sequence[str]],
        *,
        indent: str = "",
        status_column: int | None = None,
    ) -> None:
        """Rows under bold headers, columns aligned; `status_column` is coloured by status."""
        body = [list(row) for row in rows]
        widths = [len(h) for h in headers]
        for row in body:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        self.line(
            indent
            + "  ".join(
                self.paint(h.ljust(w), "bold") for h, w in zip(headers, widths, strict=True)
            ).rstrip()
        )
        for row in body:
            cells = []
            for number, (cell, width) in enumerate(zip(row, widths, strict=True)):
                padded = cell.ljust(width)
                cells.append(self.status(padded) if number == status_column else padded)
            self.line((indent + "  ".join(cells)).rstrip())

    def progress(self, done: int, total: int, label: str) -> None:
        """Redraw a progress bar on `err` (terminals only); ends the line when `done == total`."""
        if not self.live_progress:
            return
        width = 30
        filled = width * done // total if total else width
        bar = "#" * filled + "." * (width - filled)
        end = "\n" if done >= total else ""
        print(f"\r{label} [{bar}] {done}/{total}", end=end, file=self.err, flush=True)


# --- values -------------------------------------------------------------------------------------


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


def _when(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def elapsed(since: datetime, at: datetime) -> str:
    """`+S.mmms`: the time from `since` to `at`."""
    return f"+{(at - since).total_seconds():.3f}s"


def format_value(value: object) -> str:
    """A short, one-line text form of a field value (bytes previewed, times ISO 8601)."""
    if isinstance(value, bytes):
        return preview(value)
    if isinstance(value, datetime):
        return _when(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
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
        fields = ", ".join(_fields(value))
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


def _fields(value: Any, skip: str | None = None) -> list[str]:
    """`name=value` for the fields of an attrs instance that are neither secret nor default."""
    parts = []
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        if field.repr is False or _is_default(field, item) or (skip is not None and item == skip):
            continue
        parts.append(f"{field.name}={format_value(item)}")
    return parts


def describe_event(envelope: Envelope) -> tuple[str, str]:
    """An event's subject (its step, wait, hook or write id, else "") and its other fields."""
    event = envelope.event
    subject = correlation_id(event) or ""
    return subject, " ".join(_fields(event, skip=subject or None))


def render_timeline(terminal: Terminal, history: Sequence[Envelope], indent: str = "") -> None:
    """One line per event: sequence, time since the first event, type, subject, fields."""
    if not history:
        return
    start = history[0].recorded_at
    rows = []
    for envelope in history:
        subject, details = describe_event(envelope)
        rows.append(
            (
                str(envelope.sequence),
                elapsed(start, envelope.recorded_at),
                envelope.event.event_type,
                subject,
                details,
            )
        )
    terminal.table(("SEQ", "AT", "EVENT", "SUBJECT", "DETAILS"), rows, indent=indent)


def render_snapshot(terminal: Terminal, run: Snapshot) -> None:
    """A run as it stands: its fields, then its steps, waits, hooks, progress and children."""
    line, paint = terminal.line, terminal.paint
    line(f"{paint('run', 'bold')} {run.run_id}  {terminal.status(run.status)}")
    ended = f", ended {elapsed(run.created_at, run.completed_at)}" if run.completed_at else ""
    fields = [
        (
            "workflow",
            run.workflow_name + (f" v{run.workflow_version}" if run.workflow_version else ""),
        ),
        ("created", f"{_when(run.created_at)}{ended}"),
        ("input", preview(run.input, 72)),
    ]
    if run.status in TERMINAL_RUN_STATUSES:
        if run.output is not None:
            fields.append(("output", preview(run.output, 72)))
        if run.error is not None:
            code = f" [{run.error_code}]" if run.error_code else ""
            fields.append(("error", preview(run.error, 72) + code))
    if run.cancellation is not None:
        fields.append(("cancel", f"requested at {_when(run.cancellation.requested_at)}"))
    if run.deadline is not None:
        fields.append(("deadline", _when(run.deadline)))
    if run.parent_run_id is not None:
        fields.append(("parent", run.parent_run_id))
    fields.append(("attributes", format_value(run.attributes) or "-"))
    fields.append(("events", str(run.last_sequence)))
    for name, text in fields:
        line(f"  {paint(name.ljust(10), 'dim')}  {text}")
    sections: list[tuple[Sequence[str], list[tuple[str, ...]]]] = [
        (
            ("STEP", "STATUS", "ATTEMPTS", "RESULT"),
            [
                (s.step_id, s.status, str(s.attempt), _step_result(s.status, s.output, s.error))
                for s in run.steps.values()
            ],
        ),
        (
            ("WAIT", "STATUS", "RESUME AT"),
            [(w.wait_id, w.status, _when(w.resume_at)) for w in run.waits.values()],
        ),
        (
            ("HOOK", "STATUS", "DELIVERIES", "LAST PAYLOAD"),
            [
                (
                    h.hook_id,
                    h.status,
                    str(len(h.deliveries)),
                    preview(h.deliveries[-1].payload) if h.deliveries else "-",
                )
                for h in run.hooks.values()
            ],
        ),
        (
            ("PROGRESS", "DONE", "MESSAGE"),
            [
                (
                    p.progress_id,
                    f"{p.completed}/{p.total}" if p.total is not None else str(p.completed),
                    p.message or "",
                )
                for p in run.progress.values()
            ],
        ),
        (
            ("REFERENCE", "KIND", "OPERATION", "CHILD RUN"),
            [
                (c.reference_id, c.kind, c.operation_id, c.child_run_id or "-")
                for c in run.children.values()
            ],
        ),
    ]
    for headers, rows in sections:
        if rows:
            terminal.table(
                headers, rows, indent="  ", status_column=1 if len(headers) > 1 else None
            )


def _step_result(status: str, output: bytes | None, error: bytes | None) -> str:
    if status == "completed":
        after = f"  (after: {preview(error, 32)})" if error is not None else ""
        return preview(output) + after
    return preview(error) if error is not None else ""


# --- JSON ---------------------------------------------------------------------------------------


def to_json(value: object) -> Any:
    """`value` made of JSON types, ready for `json.dumps`.

    Attrs classes become objects (secrets left out), `bytes` the text they hold if UTF-8 else
    `{"base64": …}`, times ISO 8601, durations seconds.
    """
    cls = type(value)
    if attrs.has(cls):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in attrs.fields(cls)
            if f.repr is not False
        }
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_json(item) for item in value]
    return value


def envelope_json(envelope: Envelope) -> dict[str, Any]:
    """An envelope as JSON: sequence, type, recorded_at, position and the event's fields."""
    return {
        "sequence": envelope.sequence,
        "type": envelope.event.event_type,
        "recorded_at": envelope.recorded_at.isoformat(),
        "position": envelope.position,
        "event": to_json(envelope.event),
    }
