"""How the CLI writes: rich tables and colour on a terminal that wants them, plain text when
piped, JSON for scripts; and the text forms of events, timelines and snapshots.

Each value is shown as `runfold.cli.values` writes it, as the inspector shows it too.
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
from typing import Any, TextIO, TypeAlias

import attrs
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from runfold.cli.inert import inert, inert_json
from runfold.cli.values import (
    elapsed,
    field_texts,
    format_value,
    hook_status,
    preview,
    timestamp,
)
from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    Envelope,
    Snapshot,
    correlation_id,
)
from runfold.kernel.naming import step_label, step_names

__all__ = [
    "MAX_JSON_DEPTH",
    "Part",
    "Terminal",
    "describe_event",
    "envelope_json",
    "payload_json",
    "render_snapshot",
    "render_timeline",
    "to_json",
]

Part: TypeAlias = str | tuple[str, str]
"""A piece of a line: plain text, or `(text, style)` with a rich style ("green", "bold")."""

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
    "retained": "cyan",
}
_LINE_BREAKS = re.compile(r"[\r\n]+")
_PIPED_WIDTH = 1_000_000  # piped lines are never wrapped: scripts cut them as they like


class Terminal:
    """Where the CLI writes: results to `out`, errors and progress to `err`, through rich.

    rich decides about colour: only when `out` is a terminal, `NO_COLOR` is unset or empty and
    `TERM` is not `dumb`. A progress bar is drawn only when `err` is a terminal.
    """

    def __init__(self, out: TextIO, err: TextIO, environ: Mapping[str, str] | None = None) -> None:
        # rich reads NO_COLOR and TERM from `_environ` when given one (how tests pass theirs).
        env = dict(os.environ if environ is None else environ)
        terminal = out.isatty()
        self.console = Console(
            file=out,
            width=None if terminal else _PIPED_WIDTH,
            highlight=False,
            soft_wrap=not terminal,
            _environ=env,
        )
        self.errors = Console(file=err, width=_PIPED_WIDTH, highlight=False, _environ=env)
        self.color = self.console.color_system is not None
        self.live_progress = err.isatty()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def status(self, status: str) -> Part:
        """A run, step, wait or hook status, styled by what it means."""
        style = _STATUS_STYLES.get(status)
        return (status, style) if style else status

    def line(self, *parts: Part) -> None:
        """Write one line of results made of `parts` (made `inert`, never read as markup)."""
        self.console.print(Text.assemble(*(_inert_part(part) for part in parts)), soft_wrap=True)

    def error(self, message: str) -> None:
        """Write one error line to `err` (a multi-line message is joined; made `inert`)."""
        one_line = " ".join(part.strip() for part in _LINE_BREAKS.split(message) if part.strip())
        self.errors.print(Text(f"runfold: error: {inert(one_line)}"), soft_wrap=True)

    def json(self, value: object) -> None:
        """Write `value` (already made of JSON types) as indented JSON (made `inert_json`)."""
        document = json.dumps(value, indent=2, ensure_ascii=False)
        self.console.file.write(inert_json(document) + "\n")
        self.console.file.flush()

    def table(
        self,
        headers: Sequence[str],
        rows: Iterable[Sequence[str]],
        *,
        indent: str = "",
        status_column: int | None = None,
    ) -> None:
        """Rows under bold headers, columns aligned; `status_column` is styled by status.

        A table is never squeezed to fit a narrow terminal: cutting or folding its cells would
        cut the run ids people copy from it. One wider than the terminal is printed at its
        natural width, and the terminal wraps its long lines.
        """
        table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0))
        for header in headers:
            table.add_column(header, no_wrap=True)
        for row in rows:
            table.add_row(
                *(
                    Text.assemble(_inert_part(self.status(cell)))
                    if number == status_column
                    else Text(inert(cell))
                    for number, cell in enumerate(row)
                )
            )
        natural = Measurement.get(
            self.console, self.console.options.update(width=_PIPED_WIDTH), table
        ).maximum
        width = self.console.width
        self.console.width = max(width, natural)  # rich clamps a print's width to the console's
        try:
            with self.console.capture() as captured:
                self.console.print(table)
        finally:
            self.console.width = width
        for text in captured.get().splitlines():
            self.console.file.write(f"{indent}{text}".rstrip() + "\n")
        self.console.file.flush()

    def progress(self, done: int, total: int, label: str) -> None:
        """Draw a progress bar on `err` (terminals only); it ends when `done == total`."""
        if not self.live_progress:
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                console=self.errors,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total)
        assert self._task is not None
        self._progress.update(self._task, completed=done, total=total)
        if done >= total:
            self._progress.stop()
            self._progress = None


def _inert_part(part: Part) -> Part:
    """A piece of a line with its text made `inert` (its style is ours, not stored)."""
    return inert(part) if isinstance(part, str) else (inert(part[0]), part[1])


def describe_event(envelope: Envelope, steps: Mapping[str, str] | None = None) -> tuple[str, str]:
    """An event's subject (its step, wait, hook or write id, else "") and its other fields.

    `steps` labels step ids (`step_names`): a step event's subject is its label, `charge #2`.
    """
    event = envelope.event
    entity = correlation_id(event) or ""
    subject = steps.get(entity, entity) if steps and hasattr(event, "step_id") else entity
    details = field_texts(event, skip=entity or None)
    if subject != entity:  # the label names the step: its step_name field would repeat it
        details = [part for part in details if not part.startswith("step_name=")]
    return subject, " ".join(details)


def render_timeline(terminal: Terminal, history: Sequence[Envelope], indent: str = "") -> None:
    """One line per event: sequence, time since the first event, type, subject, fields."""
    if not history:
        return
    start = history[0].recorded_at
    steps = step_names(history)
    rows = []
    for envelope in history:
        subject, details = describe_event(envelope, steps)
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
    line = terminal.line
    line(("run", "bold"), f" {run.run_id}  ", terminal.status(run.status))
    ended = f", ended {elapsed(run.created_at, run.completed_at)}" if run.completed_at else ""
    fields = [("workflow", run.workflow_name)]
    if run.workflow_version:  # "v" before a digest's "code-…" read as a name: a row of its own
        fields.append(("version", run.workflow_version))
    fields += [
        ("created", f"{timestamp(run.created_at)}{ended}"),
        ("input", preview(run.input, 72)),
    ]
    if run.status in TERMINAL_RUN_STATUSES:
        if run.output is not None:
            fields.append(("output", preview(run.output, 72)))
        if run.error is not None:
            code = f" [{run.error_code}]" if run.error_code else ""
            fields.append(("error", preview(run.error, 72) + code))
    if run.cancellation is not None:
        fields.append(("cancel", f"requested at {timestamp(run.cancellation.requested_at)}"))
    if run.deadline is not None:
        fields.append(("deadline", timestamp(run.deadline)))
    if run.parent_run_id is not None:
        fields.append(("parent", run.parent_run_id))
    fields.append(("attributes", format_value(run.attributes) or "-"))
    fields.append(("events", str(run.last_sequence)))
    for name, text in fields:
        line("  ", (name.ljust(10), "dim"), f"  {text}")
    sections: list[tuple[Sequence[str], list[tuple[str, ...]]]] = [
        (
            ("STEP", "STATUS", "ATTEMPTS", "RESULT"),
            [
                (
                    step_label(s.step_id, s.step_name),
                    s.status,
                    str(s.attempt),
                    _step_result(s.status, s.output, s.error),
                )
                for s in run.steps.values()
            ],
        ),
        (
            ("WAIT", "STATUS", "RESUME AT"),
            [(w.wait_id, w.status, timestamp(w.resume_at)) for w in run.waits.values()],
        ),
        (
            ("HOOK", "STATUS", "DELIVERIES", "LAST PAYLOAD"),
            [
                (
                    h.hook_id,
                    hook_status(run, h),
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


MAX_JSON_DEPTH = 64
"""A JSON payload nested deeper than this is shown as its text, never re-nested."""


def payload_json(payload: bytes) -> dict[str, Any]:
    """A payload as labelled JSON: `{"json": …}`, `{"text": …}` or `{"base64": …}`.

    JSON is nested as it is; other UTF-8 is text, and so is JSON nested deeper than
    `MAX_JSON_DEPTH` (re-nesting it would only exhaust the stack); anything else is base64.
    """
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(payload).decode()}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
        return {"text": text}
    return {"json": value} if _within_depth(value, MAX_JSON_DEPTH) else {"text": text}


def _within_depth(value: object, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests no deeper than `limit`, found without recursing."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return True


def to_json(value: object) -> Any:
    """`value` made of JSON types, ready for `json.dumps`.

    Attrs classes become objects (secrets left out), `bytes` labelled payloads (`payload_json`),
    times ISO 8601 UTC with `Z`, durations seconds.
    """
    cls = type(value)
    if attrs.has(cls):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in attrs.fields(cls)
            if f.repr is not False
        }
    if isinstance(value, bytes):
        return payload_json(value)
    if isinstance(value, datetime):
        return timestamp(value)
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
        "recorded_at": timestamp(envelope.recorded_at),
        "position": envelope.position,
        "event": to_json(envelope.event),
    }
