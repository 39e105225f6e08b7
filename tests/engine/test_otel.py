"""`runfold.otel.TracingObserver`: an engine's runs and step attempts as spans, checked with the
OpenTelemetry SDK's in-memory exporter on every store."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from runfold import CommandHandler, EventStore
from runfold.engine import (
    AwaitHook,
    Complete,
    Engine,
    Fail,
    RuntimeDecision,
    ScheduleStep,
    StepFailure,
    StepInvocation,
    WaitUntil,
    WorkflowInvocation,
)
from runfold.errors import StoreUnavailable
from runfold.events import RetryPolicy
from runfold.otel import MAX_MESSAGE_CHARS, TracingObserver, record_store_retry
from runfold.store_retry import StoreFault
from runfold.testing import SimulatedCrash
from tests.conftest import T0, Clock
from tests.engine.test_engine import Scripted

TOKEN = "hook-secret-5d1e"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    yield found
    found.clear()


def traced(
    store: EventStore, clock: Clock, exporter: InMemorySpanExporter, runtime: Scripted
) -> Engine:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Engine(
        CommandHandler(store, clock=clock), runtime, observers=[TracingObserver(provider)]
    )


def order(invocation: WorkflowInvocation) -> RuntimeDecision:
    """A flaky payment, a timer, an approval hook, then completion."""
    run = invocation.snapshot
    pay = run.steps.get("pay")
    if pay is None or pay.status not in ("completed", "failed"):
        retry = RetryPolicy(max_attempts=3, initial_interval=timedelta(0))
        return ScheduleStep(step_id="pay", step_name="charge-card", input=b"", retry=retry)
    if pay.status == "failed":
        return Fail(error=pay.error or b"", error_code="payment_failed")
    wait = run.waits.get("cool-off")
    if wait is None or wait.status == "waiting":
        return WaitUntil(wait_id="cool-off", resume_at=T0 + timedelta(hours=1))
    hook = run.hooks.get("approval")
    if hook is None or not hook.deliveries:
        return AwaitHook(hook_id="approval", token=TOKEN)
    return Complete(output=b"shipped")


async def flaky(invocation: StepInvocation) -> bytes:
    if invocation.attempt == 1:
        raise StepFailure(b"card network timeout", code="timeout")
    return b"paid"


def attributes(item: ReadableSpan | SpanEvent) -> Mapping[str, Any]:
    return item.attributes or {}


def spans(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    return by_name


async def test_a_run_and_its_step_attempts_become_spans(
    store: EventStore, clock: Clock, exporter: InMemorySpanExporter
) -> None:
    engine = traced(store, clock, exporter, Scripted(order, {"charge-card": flaky}))
    await engine.start("wf", b"", run_id="r")
    clock.now = T0 + timedelta(hours=2)
    await engine.resume_due()
    run = await engine.deliver(TOKEN, b"ok", delivery_id="d-1")
    assert run.status == "completed"

    found = spans(exporter)
    [run_span] = found["run wf"]
    attempts = sorted(found["step charge-card"], key=lambda s: attributes(s)["runfold.attempt"])
    assert [attributes(s)["runfold.attempt"] for s in attempts] == [1, 2]
    for attempt in attempts:
        assert attempt.parent is not None and attempt.parent.span_id == run_span.context.span_id
        assert attempt.context.trace_id == run_span.context.trace_id
        assert attributes(attempt)["runfold.run_id"] == "r"
        assert attributes(attempt)["runfold.step_id"] == "pay"
    first, second = attempts
    assert not any("runfold.after_interruption" in attributes(s) for s in attempts)
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "card network timeout"
    [exception] = [e for e in first.events if e.name == "exception"]
    assert attributes(exception)["exception.message"] == "card network timeout"
    assert second.status.status_code is StatusCode.OK
    assert run_span.status.status_code is StatusCode.OK
    assert attributes(run_span)["runfold.run_status"] == "completed"
    marks = [e.name for e in run_span.events]
    assert marks == [
        "run_started",
        "wait_created",
        "wait_completed",
        "hook_created",
        "hook_received",
    ]
    # Times are the events': the run span lasts from creation to the end, hours later.
    assert run_span.end_time is not None and run_span.start_time is not None
    assert run_span.end_time - run_span.start_time >= 2 * 3600 * 10**9
    finished = exporter.get_finished_spans()
    every = [str(v) for s in finished for v in attributes(s).values()]
    every += [str(v) for s in finished for e in s.events for v in attributes(e).values()]
    assert not any(TOKEN in value for value in every), "a hook token reached a span"


async def test_an_attempt_after_a_crash_says_so(
    store: EventStore, clock: Clock, exporter: InMemorySpanExporter
) -> None:
    async def dies(invocation: StepInvocation) -> bytes:
        raise SimulatedCrash  # the process dies inside the body

    untraced = Engine(CommandHandler(store, clock=clock), Scripted(order, {"charge-card": dies}))
    with pytest.raises(SimulatedCrash):
        await untraced.start("wf", b"", run_id="r")
    engine = traced(store, clock, exporter, Scripted(order, {"charge-card": flaky}))
    await engine.drive("r")  # the process that recovered the run

    [attempt] = spans(exporter)["step pay"]  # this process never saw the step's creation
    assert attributes(attempt)["runfold.attempt"] == 2
    assert attributes(attempt)["runfold.after_interruption"] is True
    assert attempt.status.status_code is StatusCode.OK


async def test_a_failed_run_has_an_error_status(
    store: EventStore, clock: Clock, exporter: InMemorySpanExporter
) -> None:
    async def declined(invocation: StepInvocation) -> bytes:
        raise StepFailure(b"x" * (MAX_MESSAGE_CHARS * 2), code="declined", retryable=False)

    engine = traced(store, clock, exporter, Scripted(order, {"charge-card": declined}))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "failed"

    found = spans(exporter)
    [run_span] = found["run wf"]
    [attempt] = found["step charge-card"]
    assert attempt.status.status_code is StatusCode.ERROR
    assert attributes(attempt)["runfold.retryable"] is False
    assert len(attempt.status.description or "") == MAX_MESSAGE_CHARS
    assert run_span.status.status_code is StatusCode.ERROR
    assert attributes(run_span)["error.type"] == "payment_failed"


async def test_open_spans_are_bounded(
    store: EventStore, clock: Clock, exporter: InMemorySpanExporter
) -> None:
    def waits(invocation: WorkflowInvocation) -> RuntimeDecision:
        return WaitUntil(wait_id="w", resume_at=T0 + timedelta(days=30))

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = Engine(
        CommandHandler(store, clock=clock),
        Scripted(waits),
        observers=[TracingObserver(provider, max_open_runs=2)],
    )
    for n in range(3):
        await engine.start("wf", b"", run_id=f"r{n}")
    [ended] = exporter.get_finished_spans()  # the oldest, ended early
    assert attributes(ended)["runfold.run_id"] == "r0"
    assert attributes(ended)["runfold.incomplete"] is True
    with pytest.raises(ValueError, match="max_open_runs"):
        TracingObserver(provider, max_open_runs=0)


def test_without_opentelemetry_the_import_says_which_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if not installed
        "import runfold.otel\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "pip install 'runfold[otel]'" in done.stderr


async def test_store_retries_mark_the_current_span(tmp_path: Any) -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fault = StoreFault(
        run_id="r", error=StoreUnavailable("connection lost"), failures=2, elapsed=0.1, pause=0.2
    )
    with provider.get_tracer("app").start_as_current_span("request"):
        record_store_retry(fault)
    [span] = exporter.get_finished_spans()
    [event] = span.events
    assert event.name == "runfold.store_retry"
    assert dict(event.attributes or {}) == {
        "runfold.error.code": "store_unavailable",
        "runfold.error.message": "connection lost",
        "runfold.run_id": "r",
        "runfold.store_retry.failures": 2,
        "runfold.store_retry.elapsed": 0.1,
        "runfold.store_retry.pause": 0.2,
    }
