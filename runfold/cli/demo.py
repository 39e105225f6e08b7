"""`runfold demo`: an order-fulfilment workflow driven by `Engine` on a real store.

The workflow sets attributes, reserves stock and charges the card in parallel (the card gateway
times out once: the step is retried with backoff), records progress, sleeps on a durable timer,
waits for the warehouse to call back on a hook, and completes. The host loop here is what a real
host does: sleep until the run's next wakeup, `resume_due`, deliver hooks as callbacks arrive.

`demo_command` is the command itself: it opens the store for writing (creating it) and exits 1
if the run did not complete.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

import click

from runfold.cli.exit_codes import EXIT_FAILED, EXIT_OK
from runfold.cli.options import store_option
from runfold.cli.output import Part, Terminal, render_snapshot, render_timeline
from runfold.cli.store_access import label, store_url, work_on_store
from runfold.cli.values import duration, elapsed, format_value, preview, timestamp
from runfold.engine import (
    AwaitHook,
    Cancel,
    Complete,
    Engine,
    Fail,
    ReportProgress,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepFailure,
    StepInvocation,
    UpdateAttributes,
    WaitUntil,
    WorkflowInvocation,
)
from runfold.handler import CommandHandler, new_run_id
from runfold.kernel import (
    AttributesSet,
    Envelope,
    Event,
    HookCreated,
    HookReceived,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunSummary,
    Snapshot,
    StepCompleted,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.stores.protocol import EventStore

__all__ = ["WORKFLOW", "OrderFulfilment", "run_demo"]

WORKFLOW = "order-fulfilment"
"""The workflow name the demo's runs are created with."""
RETRY = RetryPolicy(
    max_attempts=3,
    initial_interval=timedelta(milliseconds=250),
    non_retryable_error_codes=("card_declined",),
)
COOL_OFF = timedelta(milliseconds=300)
STEPS = ("reserve-stock", "charge-card")


def warehouse_token(run_id: str) -> str:
    """The hook token the warehouse calls back on (in real life: a random secret)."""
    return f"warehouse:{run_id}"


class OrderFulfilment:
    """The demo's `WorkflowRuntime`: the workflow as a function of the run, and its steps."""

    workflow_names = (WORKFLOW,)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        """Decide the order's next move from what the run has recorded so far."""
        run = invocation.snapshot
        order = json.loads(run.input)
        if run.cancellation is not None:
            return Cancel()
        if "customer" not in run.attributes:
            tags = {"customer": order["customer"], "region": order["region"]}
            return UpdateAttributes(changes=tags, write_id="order-tags")
        steps = [run.steps.get(step_id) for step_id in STEPS]
        failed = next((s for s in steps if s is not None and s.status == "failed"), None)
        if failed is not None:
            return Fail(error=failed.error or b"", error_code=f"{failed.step_id}_failed")
        if not all(s is not None and s.status == "completed" for s in steps):
            return ScheduleSteps(
                steps=[
                    ScheduleStep(step_id=step_id, step_name=step_id, input=run.input, retry=RETRY)
                    for step_id in STEPS
                ]
            )
        if "paid" not in run.progress:
            return ReportProgress(
                progress_id="paid", completed=2, total=4, message="stock reserved, card charged"
            )
        charged_at = run.steps["charge-card"].completed_at
        assert charged_at is not None
        cool_off = run.waits.get("cool-off")
        if cool_off is None or cool_off.status == "waiting":
            return WaitUntil(wait_id="cool-off", resume_at=charged_at + COOL_OFF)
        if "packed" not in run.progress:
            return ReportProgress(
                progress_id="packed", completed=3, total=4, message="packed after the cool-off"
            )
        shipped = run.hooks.get("shipped")
        if shipped is None or not shipped.deliveries:
            return AwaitHook(hook_id="shipped", token=warehouse_token(run.run_id))
        if "shipped" not in run.progress:
            return ReportProgress(
                progress_id="shipped", completed=4, total=4, message="handed to the carrier"
            )
        tracking = json.loads(shipped.deliveries[0].payload)["tracking"]
        return Complete(output=json.dumps({"status": "shipped", "tracking": tracking}).encode())

    async def run_step(self, invocation: StepInvocation) -> bytes:
        """Reserve the stock or charge the card; the gateway times out on the first attempt."""
        order = json.loads(invocation.input)
        await asyncio.sleep(0.05)  # the remote call
        if invocation.step_name == "charge-card":
            if invocation.attempt == 1:
                raise StepFailure(b"card gateway timed out", code="gateway_timeout")
            return json.dumps({"charged": order["total"]}).encode()
        return json.dumps({"reserved": order["items"]}).encode()


class Story:
    """An `EngineObserver` telling the run's story as it happens, one line per notable event."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self.starts: dict[str, datetime] = {}  # each run's first event seen: its time zero

    async def on_event(self, envelope: Envelope) -> None:
        """Print a line for the events a person watching would care about."""
        start = self.starts.setdefault(envelope.run_id, envelope.recorded_at)
        parts = self._tell(envelope.event, envelope.recorded_at)
        if parts is not None:
            when = elapsed(start, envelope.recorded_at).rjust(9)
            self.terminal.line("  ", (when, "dim"), "  ", *parts)

    def _tell(self, event: Event, at: datetime) -> list[Part] | None:
        match event:
            case RunStarted():
                return ["run started"]
            case AttributesSet():
                return [f"attributes {format_value(event.changes)}"]
            case StepStarted():
                return [f"step {event.step_id}: attempt {event.attempt} started"]
            case StepCompleted():
                output = preview(event.output)
                return [f"step {event.step_id}: ", ("completed", "green"), f" {output}"]
            case StepRetrying():
                assert event.retry_after is not None
                wait = duration((event.retry_after - at).total_seconds())
                return [
                    f"step {event.step_id}: ",
                    ("failed", "yellow"),
                    f" ({preview(event.error)}), retrying in {wait}",
                ]
            case StepFailed():
                return [f"step {event.step_id}: ", ("failed", "red"), f" ({preview(event.error)})"]
            case ProgressRecorded():
                total = event.total or event.completed
                bar = "#" * event.completed + "-" * (total - event.completed)
                return [f"progress [{bar}] {event.completed}/{total} {event.message or ''}"]
            case WaitCreated():
                return [
                    f"timer {event.wait_id}: sleeping "
                    f"{duration((event.resume_at - at).total_seconds())}"
                ]
            case WaitCompleted():
                return [f"timer {event.wait_id}: rang"]
            case HookCreated():
                return [f"hook {event.hook_id}: waiting for the warehouse to call back"]
            case HookReceived():
                return [f"hook {event.hook_id}: received {preview(event.payload)}"]
            case RunCompleted():
                return ["run ", ("completed", "green"), f": {preview(event.output)}"]
            case RunFailed() | RunCancelled():
                return ["run ", (event.event_type, "red")]
        return None


async def _host(engine: Engine, run: Snapshot, terminal: Terminal) -> Snapshot | None:
    """What a host does for one run until it ends: sleep until its next wakeup, `resume_due`,
    deliver the warehouse's callback when the run waits for it. None if it waits for
    something the demo cannot provide."""
    handler = engine.handler
    while not run.is_terminal:
        shipped = run.hooks.get("shipped")
        if shipped is not None and shipped.status == "active" and not shipped.deliveries:
            terminal.line(f"  {'':>9}  ", ("the warehouse calls back", "dim"))
            callback = json.dumps({"tracking": "ZX81-0042"}).encode()
            run = await engine.deliver(
                warehouse_token(run.run_id), callback, delivery_id="shipment-1"
            )
            continue
        due = min((w.due_at for w in run.wakeups()), default=None)
        if due is None:
            terminal.error(
                f"run {run.run_id} waits for nothing the demo can provide ({run.status})"
            )
            return None
        await asyncio.sleep(max(0.0, (due - handler.clock()).total_seconds()))
        for resumed in await engine.resume_due():
            if resumed.run_id == run.run_id and resumed.error is not None:
                raise resumed.error
        run = await handler.snapshot(run.run_id)
    return run


async def run_demo(store: EventStore, terminal: Terminal, store_label: str) -> bool:
    """Run one order through `Engine` on `store`, telling it as it goes; True if it completed.

    Then print the run's timeline, its final snapshot and the store's order runs.
    """
    handler = CommandHandler(store)
    engine = Engine(handler, OrderFulfilment(), [Story(terminal)])
    await _finish_interrupted(engine, terminal)
    run_id = new_run_id("order_")
    order = {"order": 1042, "customer": "acme", "region": "eu", "items": 3, "total": "EUR 42.00"}
    terminal.line(("runfold demo", "bold"), f": {WORKFLOW} run {run_id} on {store_label}")
    started = await engine.start(WORKFLOW, json.dumps(order).encode(), run_id=run_id)
    ended = await _host(engine, started, terminal)
    if ended is None:
        return False
    run = ended

    terminal.line()
    terminal.line(("timeline", "bold"))
    render_timeline(terminal, await handler.history(run_id), indent="  ")
    terminal.line()
    render_snapshot(terminal, run)
    terminal.line()
    runs: list[RunSummary] = []
    cursor: str | None = None
    while True:
        page = await store.list_runs(workflow_name=WORKFLOW, cursor=cursor, limit=500)
        runs.extend(page.items)
        if not page.has_more or page.cursor is None:
            break
        cursor = page.cursor
    terminal.line((f"{len(runs)} run(s)", "bold"), f" of {WORKFLOW} in {store_label}")
    terminal.table(
        ("RUN", "STATUS", "CREATED", "EVENTS"),
        [(s.run_id, s.status, timestamp(s.created_at), str(s.last_sequence)) for s in runs[:5]],
        indent="  ",
        status_column=1,
    )
    if len(runs) > 5:
        terminal.line(f"  … and {len(runs) - 5} more (runfold runs --workflow {WORKFLOW})")
    return run.status == "completed"


async def _finish_interrupted(engine: Engine, terminal: Terminal) -> None:
    """Finish the demo runs an earlier, interrupted demo left live (Ctrl-C, a crash).

    `Engine.recover` drives each from where its history stops (a step that was running gets a
    new attempt); each is then hosted to its end like a new one.
    """
    for resumed in await engine.recover():
        run_id = resumed.run_id
        terminal.line(("runfold demo", "bold"), f": finishing interrupted run {run_id}")
        if resumed.snapshot is None:
            terminal.line(f"  run {run_id} could not be driven: {resumed.error}")
            continue
        ended = await _host(engine, resumed.snapshot, terminal)
        if ended is not None:
            terminal.line(f"  run {run_id} ", terminal.status(ended.status))
        terminal.line()


@click.command("demo")
@store_option
@click.pass_context
def demo_command(ctx: click.Context, command_store: str | None) -> int:
    """Run an order-fulfilment workflow through the engine and tell it as it goes.

    Parallel steps, a failure retried with backoff, a durable timer, a hook called back from
    outside; then the run's timeline, its snapshot and the store's runs of the workflow. A demo
    run left unfinished (the demo was interrupted) is finished first. Creates the store.
    """

    async def work(store: EventStore, terminal: Terminal) -> int:
        completed = await run_demo(store, terminal, label(store_url(ctx, command_store)))
        return EXIT_OK if completed else EXIT_FAILED

    return work_on_store(ctx, command_store, work, read_only=False)
