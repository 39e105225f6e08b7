"""The run page's timeline chart: a run's history laid out as rows of bars and marks over time.

One row for the run, one per step (a bar per attempt, coloured by how it ended, a dashed gap for
a retry's backoff), one per wait (from its creation to when it rang, its due time marked) and one
per hook (its life, a mark per delivery). This module only computes geometry, in SVG user units;
the template draws it, escaping every label like any other stored text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

import attrs

from runfold.kernel import (
    Envelope,
    HookCreated,
    HookDisposed,
    HookReceived,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunTimedOut,
    Snapshot,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)

__all__ = ["Bar", "Mark", "Row", "Tick", "Timeline", "build_timeline"]

WIDTH = 1000.0
LABEL_WIDTH = 190.0
RIGHT_MARGIN = 16.0
AXIS_HEIGHT = 26.0
ROW_HEIGHT = 28.0
MIN_BAR = 3.0
LABEL_CHARS = 26


@attrs.frozen(kw_only=True, slots=True)
class Bar:
    """A span on a row: an attempt, a wait, a hook's life, a retry's backoff or the run itself.

    `kind` names its CSS class (`attempt-completed`, `attempt-retried`, `attempt-interrupted`,
    `backoff`, `wait` …).
    """

    x: float
    width: float
    kind: str
    title: str


@attrs.frozen(kw_only=True, slots=True)
class Mark:
    """A moment on a row: a hook delivery, a wait's due time, a progress report."""

    x: float
    kind: str
    title: str


@attrs.frozen(kw_only=True, slots=True)
class Row:
    """One row of the chart; `label` is the full name, `short` what fits beside the plot."""

    label: str
    short: str
    kind: str
    y: float
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]


@attrs.frozen(kw_only=True, slots=True)
class Tick:
    """A time-axis tick: `x` and the elapsed time it stands for."""

    x: float
    text: str


@attrs.frozen(kw_only=True, slots=True)
class Timeline:
    """The whole chart: its size, rows and axis ticks."""

    width: float
    height: float
    label_width: float
    plot_end: float
    rows: tuple[Row, ...]
    ticks: tuple[Tick, ...]


@attrs.define
class _RowDraft:
    label: str
    kind: str
    bars: list[Bar] = attrs.Factory(list)
    marks: list[Mark] = attrs.Factory(list)


def build_timeline(
    history: Sequence[Envelope], *, now: datetime | None = None, run: Snapshot | None = None
) -> Timeline:
    """Lay out `history` (a run's events in order) as a chart.

    `now` extends the chart for a live run, so running attempts and open waits reach the present;
    a wait's due time in the future widens it too. With `run`, the run's snapshot, `history` may
    be some of its events only (those of the steps, waits and hooks a page shows): the run's row
    and the time axis then span the whole run, from its creation to its end (or `now`).
    """
    if not history and run is None:
        return Timeline(
            width=WIDTH,
            height=AXIS_HEIGHT,
            label_width=LABEL_WIDTH,
            plot_end=WIDTH - RIGHT_MARGIN,
            rows=(),
            ticks=(),
        )
    if run is not None:
        start = run.created_at
        end = max(run.updated_at, now or start)
    else:
        start = history[0].recorded_at
        end = max(history[-1].recorded_at, now or start)
    for envelope in history:
        if isinstance(envelope.event, WaitCreated):
            end = max(end, envelope.event.resume_at)
        if isinstance(envelope.event, StepRetrying) and envelope.event.retry_after is not None:
            end = max(end, envelope.event.retry_after)
    span = max((end - start).total_seconds(), 0.001)
    plot = WIDTH - LABEL_WIDTH - RIGHT_MARGIN

    def x_at(moment: datetime) -> float:
        return LABEL_WIDTH + plot * (moment - start).total_seconds() / span

    def bar(since: datetime, until: datetime, kind: str, title: str) -> Bar:
        left = x_at(since)
        return Bar(x=left, width=max(x_at(until) - left, MIN_BAR), kind=kind, title=title)

    def when(moment: datetime) -> str:
        return f"+{(moment - start).total_seconds():.3f}s"

    whole = _RowDraft(label="run", kind="run")
    rows: dict[str, _RowDraft] = {}
    started: dict[str, tuple[int, datetime]] = {}
    opened: dict[str, tuple[datetime, str]] = {}  # waits and hooks not yet over
    run_end: tuple[datetime, str] | None = None
    if run is not None and run.is_terminal and run.completed_at is not None:
        run_end = (run.completed_at, run.status)

    def row(key: str, label: str, kind: str) -> _RowDraft:
        return rows.setdefault(key, _RowDraft(label=label, kind=kind))

    def close_attempt(step_id: str, at: datetime, outcome: str) -> None:
        attempt = started.pop(step_id, None)
        if attempt is None:
            return
        number, since = attempt
        title = f"{step_id} attempt {number}: {outcome} ({when(since)} → {when(at)})"
        row(f"step:{step_id}", step_id, "step").bars.append(
            bar(since, at, f"attempt-{outcome}", title)
        )

    for envelope in history:
        event, at = envelope.event, envelope.recorded_at
        match event:
            case StepCreated():
                row(f"step:{event.step_id}", event.step_id, "step")
            case StepStarted():
                # An attempt still open here had no outcome: its process died inside the body
                # (`after_interruption`; histories from before the marker leave it out).
                close_attempt(event.step_id, at, "interrupted")
                started[event.step_id] = (event.attempt, at)
            case StepCompleted():
                close_attempt(event.step_id, at, "completed")
            case StepFailed():
                close_attempt(event.step_id, at, "failed")
            case StepCancelled():
                close_attempt(event.step_id, at, "cancelled")
            case StepRetrying():
                close_attempt(event.step_id, at, "retried")
                due = event.retry_after or at
                row(f"step:{event.step_id}", event.step_id, "step").bars.append(
                    bar(at, due, "backoff", f"{event.step_id}: retry due at {when(due)}")
                )
            case WaitCreated():
                key = f"wait:{event.wait_id}"
                row(key, event.wait_id, "wait").marks.append(
                    Mark(
                        x=x_at(event.resume_at),
                        kind="due",
                        title=f"{event.wait_id}: due at {when(event.resume_at)}",
                    )
                )
                opened[key] = (at, event.wait_id)
            case WaitCompleted():
                _close(opened, rows, f"wait:{event.wait_id}", at, "wait", bar, when)
            case HookCreated():
                key = f"hook:{event.hook_id}"
                row(key, event.hook_id, "hook")
                opened[key] = (at, event.hook_id)
            case HookReceived():
                key = f"hook:{event.hook_id}"
                row(key, event.hook_id, "hook").marks.append(
                    Mark(
                        x=x_at(at),
                        kind="delivery",
                        title=f"{event.hook_id}: delivery at {when(at)}",
                    )
                )
            case HookDisposed():
                _close(opened, rows, f"hook:{event.hook_id}", at, "hook", bar, when)
            case ProgressRecorded():
                total = f"/{event.total}" if event.total is not None else ""
                whole.marks.append(
                    Mark(
                        x=x_at(at),
                        kind="progress",
                        title=f"progress {event.progress_id}: {event.completed}{total}",
                    )
                )
            case RunCompleted() | RunFailed() | RunCancelled() | RunTimedOut():
                run_end = (at, event.event_type.removeprefix("run_"))
    # Whatever is still open when the history ends runs on to the chart's end.
    for step_id in list(started):
        close_attempt(step_id, end, "running")
    for key in list(opened):
        _close(opened, rows, key, end, "open", bar, when)
    if run_end is None:
        whole.bars.append(bar(start, end, "run-live", f"run: live ({when(start)} → now)"))
    else:
        at, outcome = run_end
        whole.bars.append(bar(start, at, f"run-{outcome}", f"run: {outcome} at {when(at)}"))
    drafts = [whole, *rows.values()]
    return Timeline(
        width=WIDTH,
        height=AXIS_HEIGHT + ROW_HEIGHT * len(drafts) + 6,
        label_width=LABEL_WIDTH,
        plot_end=WIDTH - RIGHT_MARGIN,
        rows=tuple(
            Row(
                label=draft.label,
                short=_shorten(draft.label),
                kind=draft.kind,
                y=AXIS_HEIGHT + ROW_HEIGHT * number,
                bars=tuple(draft.bars),
                marks=tuple(draft.marks),
            )
            for number, draft in enumerate(drafts)
        ),
        ticks=_ticks(span, plot),
    )


def _close(
    opened: dict[str, tuple[datetime, str]],
    rows: dict[str, _RowDraft],
    key: str,
    at: datetime,
    outcome: str,
    bar: Callable[[datetime, datetime, str, str], Bar],
    when: Callable[[datetime], str],
) -> None:
    """End the span of an open wait or hook at `at`; `outcome` "open" marks it still going."""
    found = opened.pop(key, None)
    if found is None:
        return
    since, name = found
    kind = key.partition(":")[0]
    state = "still open" if outcome == "open" else "over"
    css = f"{kind}-open" if outcome == "open" else kind
    rows[key].bars.append(bar(since, at, css, f"{name}: {state} at {when(at)}"))


def _shorten(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def _ticks(span: float, plot: float) -> tuple[Tick, ...]:
    """Axis ticks at a round step, about six of them, each label distinct: 1, 2 or 5 times a
    power of ten below a minute, then whole minutes, hours and days."""
    step = _round_step(span / 6)
    count = math.floor(span * 1.0001 / step)
    return tuple(
        Tick(x=LABEL_WIDTH + plot * (n * step) / span, text=_duration(n * step, step))
        for n in range(count + 1)
    )


_LONG_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
"""Round steps from a minute to a day, in seconds."""


def _round_step(raw: float) -> float:
    if 30 <= raw <= _LONG_STEPS[-1]:
        return float(next(step for step in _LONG_STEPS if step >= raw))
    unit = 86400 if raw > _LONG_STEPS[-1] else 1
    power = 10.0 ** math.floor(math.log10(raw / unit))
    return float(unit * next(m * power for m in (1, 2, 5, 10) if m * power >= raw / unit))


def _duration(seconds: float, step: float) -> str:
    """A tick's label, with as many decimals as its step needs (`0.5ms`, never `0ms` twice)."""
    if step < 1:
        decimals = max(0, -math.floor(math.log10(step * 1000) + 1e-9))
        return f"{seconds * 1000:.{decimals}f}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if step >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
