"""`TracingObserver`: the engine's runs and step attempts as OpenTelemetry spans.

An `EngineObserver` (`Engine(handler, runtime, observers=[TracingObserver()])`) that turns the
events an engine appends into spans: one per run, from its creation to its end, and one per step
attempt, a child of the run's, from its start to its outcome. Waits, cancellation requests and
hook deliveries are span events of the run; a failed attempt, a failed run and a run timed out
have an error status and an `exception` event, as OpenTelemetry's conventions for errors have
it. Times are the events' `recorded_at`, so spans show the durable timeline, not when the
observer ran.

What a span holds comes from the events: run and step ids, workflow and step names, attempts,
error codes and errors (cut to `MAX_MESSAGE_CHARS`). Never a hook token, an input, an output or
a delivered payload. Needs the `otel` extra (`pip install 'runfold[otel]'`): the OpenTelemetry
API; an SDK and an exporter are the application's choice, as with any instrumented library.

A process sees the events its own engine appends. A run resumed by another process after a
restart gets a second run span there, from the first event that process appends; spans of a run
still open when `max_open_runs` is passed are ended early and marked `runfold.incomplete`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("runfold.otel needs OpenTelemetry: pip install 'runfold[otel]'") from exc

from runfold.kernel import (
    CancelRequested,
    ChildLinked,
    Envelope,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    RunTimedOut,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.store_retry import StoreFault

__all__ = ["MAX_MESSAGE_CHARS", "TracingObserver", "record_store_retry"]

MAX_MESSAGE_CHARS = 512
"""The most characters of an error payload a span event carries."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def record_store_retry(fault: StoreFault) -> None:
    """A `StoreRetry.on_retry` that marks the current span with a `runfold.store_retry` event.

    `CommandHandler(store, store_retry=StoreRetry(on_retry=record_store_retry))`: the span the
    application has open around a handler or engine call (a request, a job) shows each store
    fault ridden through: the error's code and message, the run, the fault's number, the
    seconds since the first and the pause before the next try.
    """
    trace.get_current_span().add_event(
        "runfold.store_retry",
        {
            "runfold.error.code": fault.error.code,
            "runfold.error.message": str(fault.error)[:MAX_MESSAGE_CHARS],
            "runfold.run_id": fault.run_id or "",
            "runfold.store_retry.failures": fault.failures,
            "runfold.store_retry.elapsed": fault.elapsed,
            "runfold.store_retry.pause": fault.pause,
        },
    )


def _nanos(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _message(payload: bytes | str | None) -> str:
    if payload is None:
        return ""
    text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
    return text[:MAX_MESSAGE_CHARS]


class _Run:
    """The open spans of one run, and the step names its `step_created` events gave."""

    __slots__ = ("span", "step_names", "steps")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.step_names: dict[str, str] = {}
        self.steps: dict[str, Span] = {}


class TracingObserver:
    """An `EngineObserver` that exports the engine's runs and step attempts as spans.

    Args:
        tracer_provider: Where spans go; the global provider when None.
        max_open_runs: How many runs may have an open span at once (the oldest is ended early,
            marked `runfold.incomplete`): a run that waits for weeks holds one meanwhile.

    Raises:
        ValueError: `max_open_runs` is below 1.
    """

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, max_open_runs: int = 10_000
    ) -> None:
        if max_open_runs < 1:
            raise ValueError("max_open_runs must be at least 1")
        self._tracer = trace.get_tracer("runfold", tracer_provider=tracer_provider)
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._max_open_runs = max_open_runs

    async def on_event(self, envelope: Envelope) -> None:
        """Open, annotate or end the spans `envelope`'s event concerns."""
        event = envelope.event
        run = self._run(envelope)
        at = _nanos(envelope.recorded_at)
        handle = _HANDLERS.get(type(event))
        if handle is not None:
            handle(self, run, envelope.run_id, event, at)

    # --- runs ---------------------------------------------------------------------------------

    def _run(self, envelope: Envelope) -> _Run:
        found = self._runs.get(envelope.run_id)
        if found is not None:
            self._runs.move_to_end(envelope.run_id)
            return found
        event = envelope.event
        name = event.workflow_name if isinstance(event, RunCreated) else "unknown"
        attributes: dict[str, Any] = {
            "runfold.run_id": envelope.run_id,
            "runfold.workflow_name": name,
        }
        if not isinstance(event, RunCreated):
            attributes["runfold.resumed_at_sequence"] = envelope.sequence
        span = self._tracer.start_span(
            f"run {name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_nanos(envelope.recorded_at),
        )
        found = self._runs[envelope.run_id] = _Run(span)
        while len(self._runs) > self._max_open_runs:
            _, oldest = self._runs.popitem(last=False)
            self._end_run(oldest, None, incomplete=True)
        return found

    def _end_run(self, run: _Run, at: int | None, *, incomplete: bool = False) -> None:
        for step in run.steps.values():
            if incomplete:
                step.set_attribute("runfold.incomplete", True)
            step.end(end_time=at)
        run.steps.clear()
        if incomplete:
            run.span.set_attribute("runfold.incomplete", True)
        run.span.end(end_time=at)

    def _ended(self, run: _Run, run_id: str, event: Event, at: int) -> None:
        status = event.event_type.removeprefix("run_")
        run.span.set_attribute("runfold.run_status", status)
        if isinstance(event, RunFailed):
            _error(run.span, event.error_code or "run_failed", event.error, at)
        elif isinstance(event, RunTimedOut):
            _error(run.span, "timed_out", event.reason or "the run timed out", at)
        elif isinstance(event, RunCompleted):
            run.span.set_status(Status(StatusCode.OK))
        elif isinstance(event, RunCancelled) and event.reason:
            run.span.set_attribute("runfold.cancel_reason", event.reason)
        self._end_run(run, at)
        self._runs.pop(run_id, None)

    # --- steps --------------------------------------------------------------------------------

    def _created(self, run: _Run, run_id: str, event: StepCreated, at: int) -> None:
        run.step_names[event.step_id] = event.step_name

    def _started(self, run: _Run, run_id: str, event: StepStarted, at: int) -> None:
        previous = run.steps.pop(event.step_id, None)
        if previous is not None:  # a new attempt after an interrupted one
            previous.set_attribute("runfold.interrupted", True)
            _error(previous, "interrupted", "the attempt was interrupted", at)
            previous.end(end_time=at)
        name = run.step_names.get(event.step_id, event.step_id)
        attributes: dict[str, str | int | bool] = {
            "runfold.run_id": run_id,
            "runfold.step_id": event.step_id,
            "runfold.step_name": name,
            "runfold.attempt": event.attempt,
        }
        if event.after_interruption:  # the attempt before died with its process, maybe not here
            attributes["runfold.after_interruption"] = True
        run.steps[event.step_id] = self._tracer.start_span(
            f"step {name}",
            context=trace.set_span_in_context(run.span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=at,
        )

    def _outcome(
        self,
        run: _Run,
        run_id: str,
        event: StepCompleted | StepFailed | StepRetrying | StepCancelled,
        at: int,
    ) -> None:
        step_id: str = event.step_id
        span = run.steps.pop(step_id, None)
        if not isinstance(event, StepRetrying):  # the step is done: its name is not needed
            run.step_names.pop(step_id, None)
        if span is None:
            return
        if isinstance(event, StepCompleted):
            span.set_status(Status(StatusCode.OK))
        elif isinstance(event, StepFailed):
            _error(span, "step_failed", event.error, at)
            span.set_attribute("runfold.retryable", event.retryable)
        elif isinstance(event, StepRetrying):
            _error(span, "step_retrying", event.error, at)
            if event.retry_after is not None:
                span.set_attribute("runfold.retry_after", event.retry_after.isoformat())
        elif isinstance(event, StepCancelled):
            span.add_event("cancelled", {"runfold.reason": event.reason or ""}, timestamp=at)
        span.end(end_time=at)

    # --- marks on the run ---------------------------------------------------------------------

    def _mark(self, run: _Run, run_id: str, event: Event, at: int) -> None:
        attributes: dict[str, Any] = {}
        match event:
            case WaitCreated():
                attributes = {"runfold.wait_id": event.wait_id}
                attributes["runfold.resume_at"] = event.resume_at.isoformat()
            case WaitCompleted():
                attributes = {"runfold.wait_id": event.wait_id}
            case HookCreated() | HookDisposed():
                attributes = {"runfold.hook_id": event.hook_id}  # never the token
            case HookConflict():
                attributes = {"runfold.hook_id": event.hook_id}
                attributes["runfold.holder_run_id"] = event.holder_run_id
            case HookReceived():
                attributes = {"runfold.hook_id": event.hook_id}
                if event.delivery_id is not None:
                    attributes["runfold.delivery_id"] = event.delivery_id
            case CancelRequested():
                attributes = {"runfold.reason": event.reason or ""}
            case ChildLinked():
                attributes = {"runfold.child_reference": event.reference_id}
        run.span.add_event(event.event_type, attributes, timestamp=at)


def _error(span: Span, code: str, error: bytes | str | None, at: int) -> None:
    """An error status and an `exception` event, by OpenTelemetry's conventions for errors."""
    message = _message(error)
    span.set_status(Status(StatusCode.ERROR, message or code))
    span.set_attribute("error.type", code)
    span.add_event(
        "exception", {"exception.type": code, "exception.message": message}, timestamp=at
    )


_Handler = Callable[[TracingObserver, _Run, str, Any, int], None]
_HANDLERS: dict[type[Event], _Handler] = {
    RunCompleted: TracingObserver._ended,
    RunFailed: TracingObserver._ended,
    RunCancelled: TracingObserver._ended,
    RunTimedOut: TracingObserver._ended,
    RunStarted: TracingObserver._mark,
    StepCreated: TracingObserver._created,
    StepStarted: TracingObserver._started,
    StepCompleted: TracingObserver._outcome,
    StepFailed: TracingObserver._outcome,
    StepRetrying: TracingObserver._outcome,
    StepCancelled: TracingObserver._outcome,
    WaitCreated: TracingObserver._mark,
    WaitCompleted: TracingObserver._mark,
    HookCreated: TracingObserver._mark,
    HookDisposed: TracingObserver._mark,
    HookReceived: TracingObserver._mark,
    HookConflict: TracingObserver._mark,
    CancelRequested: TracingObserver._mark,
    ChildLinked: TracingObserver._mark,
}
