"""`Flow`: durable functions on a store, through the reference `Engine`.

A `Flow` is the `WorkflowRuntime` of an `Engine` whose workflow code is `@workflow` functions:
the `Interpreter` answers `run_workflow`, step bodies are the functions passed to `step`, and
the engine records everything through the `CommandHandler`, one commit per step.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection, Iterable
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

import attrs

from runfold.engine import (
    DEFAULT_LEASE,
    Engine,
    Resumption,
    RuntimeDecision,
    Schedule,
    StepInvocation,
    Worker,
    WorkflowInvocation,
)
from runfold.flow.definition import Workflow, registered_workflows
from runfold.flow.encoding import JsonCodec, PayloadCodec
from runfold.flow.errors import FlowError, UnknownWorkflow
from runfold.flow.interpreter import Interpreter
from runfold.handler import CommandHandler
from runfold.kernel import Envelope, Snapshot
from runfold.stores.protocol import EventStore

__all__ = ["Flow", "FlowRun", "current_step"]

# What a step body commonly returns, and can never be awaited: `inspect.isawaitable` is skipped.
_NEVER_AWAITABLE = frozenset({str, bytes, int, float, bool, type(None), list, dict, tuple})

_CURRENT_STEP: ContextVar[StepInvocation | None] = ContextVar("runfold_flow_step", default=None)


def current_step() -> StepInvocation:
    """The attempt of the step body running now (its `idempotency_key`, its `attempt`).

    Raises:
        FlowError: No step body is running.
    """
    found = _CURRENT_STEP.get()
    if found is None:
        raise FlowError("current_step() is for step bodies run by a Flow")
    return found


@attrs.frozen(kw_only=True)
class FlowRun:
    """A run as a `Flow` reports it: status, and the output decoded once it completed."""

    run_id: str
    status: str
    output: Any
    """The decoded output of a completed run, else None."""
    error: str | None
    """The error of a failed run, else None."""
    snapshot: Snapshot = attrs.field(repr=False)


class Flow:
    """Runs `@workflow` functions durably on `store`.

    Args:
        store: Any `EventStore`.
        workflows: What this Flow serves (starts, drives, recovers); default: every workflow
            defined in the process when the Flow is made.
        codec: Encodes inputs, outputs, step arguments and results (default `JsonCodec`).
        clock: The time source of the handler and of new sleeps (default: UTC now).
        max_sessions: How many live workflow coroutines to keep between decisions.

    Raises:
        ValueError: There is no workflow to serve.
    """

    def __init__(
        self,
        store: EventStore,
        workflows: Iterable[Workflow] | None = None,
        *,
        codec: PayloadCodec | None = None,
        clock: Callable[[], datetime] | None = None,
        max_sessions: int = 1024,
    ) -> None:
        served = tuple(workflows) if workflows is not None else registered_workflows()
        if not served:
            raise ValueError("a Flow needs at least one @workflow to serve")
        self.codec: PayloadCodec = codec if codec is not None else JsonCodec()
        self.handler = (
            CommandHandler(store) if clock is None else CommandHandler(store, clock=clock)
        )
        self.workflows = {w.name: w for w in served}
        self.interpreter = Interpreter(
            self.workflows, self.codec, self.handler.clock, max_sessions=max_sessions
        )
        self.engine = Engine(self.handler, self, observers=(self,))
        self.worker: Worker | None = None
        """The worker `serve` runs, while it serves."""

    # --- what people call ---------------------------------------------------------------------

    async def start(
        self, workflow: Workflow, input: Any, *, run_id: str | None = None, queued: bool = False
    ) -> FlowRun:
        """Start a run of `workflow` with `input` and drive it until it ends or waits.

        Idempotent for a given `run_id`: the same input again returns the existing run.
        `queued` records the run and returns it pending, without running anything: a worker of
        the fleet (`serve`, in this process or another) starts it. `result(run_id, wait=...)`
        waits for its end.

        Raises:
            UnknownWorkflow: This Flow does not serve `workflow`.
            RunDefinitionConflict: `run_id` is a run with another workflow or input.
            FlowNonDeterminism: The code asks for something other than the history holds.
        """
        if workflow.name not in self.workflows:
            raise UnknownWorkflow(f"this Flow does not serve workflow {workflow.name!r}")
        snapshot = await self.engine.start(
            workflow.name, self.codec.encode(input), run_id=run_id, queued=queued
        )
        if queued and self.worker is not None:
            self.worker.wake()
        return self.report(snapshot)

    async def deliver(self, token: str, payload: Any, *, delivery_id: str | None = None) -> FlowRun:
        """Deliver `payload` to the `wait_for_event` holding `token`, and drive its run.

        A repeated `delivery_id` with the same payload is recorded once.

        Raises:
            HookNotFound: No live hook holds the token.
            InvalidCommand: The token is not text UTF-8 can encode; nothing was read.
            RunExpired: The hook is retained past the end of its run.
            EntityConflict: `delivery_id` was already received with another payload.
        """
        encoded = self.codec.encode(payload)
        return self.report(await self.engine.deliver(token, encoded, delivery_id))

    async def recover(self) -> tuple[Resumption, ...]:
        """Drive every live run of the served workflows once (at start-up).

        A run that fails to drive is reported in its `Resumption` and does not stop the others.
        """
        return await self.engine.recover()

    async def run_until_idle(self, now: datetime | None = None) -> tuple[Resumption, ...]:
        """Resume due sleeps and retries until nothing is due at `now` (default: the clock).

        Stops early when a round only met runs that fail to drive (they are in the result).
        """
        resumed: list[Resumption] = []
        while True:
            found = await self.engine.resume_due(now)
            resumed.extend(found)
            if all(r.error is not None for r in found):
                return tuple(resumed)

    async def serve(
        self,
        *,
        worker_id: str | None = None,
        lease: timedelta = DEFAULT_LEASE,
        concurrency: int = 16,
        poll_interval: float = 1.0,
        grace: float = 30.0,
        handle_signals: bool = True,
    ) -> None:
        """Serve this Flow's workflows as one worker of a fleet, until SIGTERM, Ctrl-C or `stop`.

        Any number of processes may serve one store: each run is driven by one worker at a time
        (its owner), due sleeps and retries and the runs of dead workers go to exactly one of
        them. Runs this Flow `start`s while it serves are claimed by this worker; workflows
        with a `schedule` are started at each tick. The arguments are `Worker`'s;
        `handle_signals` makes SIGTERM and SIGINT stop gracefully.

        Raises:
            TypeError: The store keeps no worker leases (`WorkerLeases`).
        """
        schedules = [
            Schedule(
                workflow_name=w.name,
                cron=w.schedule,
                input_for=lambda tick: self.codec.encode(tick.isoformat()),
            )
            for w in self.workflows.values()
            if w.schedule is not None
        ]
        worker = Worker(
            self.engine,
            worker_id=worker_id,
            lease=lease,
            concurrency=concurrency,
            poll_interval=poll_interval,
            grace=grace,
            schedules=schedules,
        )
        self.worker = worker
        if handle_signals:
            worker.install_signal_handlers()
        try:
            await worker.serve()
        finally:
            self.worker = None
            self.engine.lease = None

    def stop(self) -> None:
        """Stop `serve` gracefully (what SIGTERM does); no-op when not serving."""
        if self.worker is not None:
            self.worker.stop()

    async def result(self, run_id: str, *, wait: float | None = None) -> FlowRun:
        """The run as it stands; with `wait`, once it ended or `wait` seconds passed.

        Any process may wait, one that serves no workflow included: it reads what the run
        appended since (one read) at growing intervals, from 10 ms to at most 0.5 s, so a run
        that ends is seen within half a second of it.

        Raises:
            RunNotFound: The run has no history.
        """
        snapshot = await self.handler.snapshot(run_id)
        if wait is None or snapshot.is_terminal:
            return self.report(snapshot)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        pause = 0.01
        while not snapshot.is_terminal and loop.time() < deadline:
            await asyncio.sleep(min(pause, max(deadline - loop.time(), 0)))
            pause = min(pause * 2, 0.5)
            snapshot = await self.handler.snapshot(run_id)
        return self.report(snapshot)

    def report(self, snapshot: Snapshot) -> FlowRun:
        """`snapshot` as a `FlowRun`."""
        output = None
        if snapshot.status == "completed" and snapshot.output is not None:
            output = self.codec.decode(snapshot.output)
        error = None if snapshot.error is None else snapshot.error.decode(errors="replace")
        return FlowRun(
            run_id=snapshot.run_id,
            status=snapshot.status,
            output=output,
            error=error,
            snapshot=snapshot,
        )

    # --- the engine's runtime and observer ----------------------------------------------------

    @property
    def workflow_names(self) -> Collection[str]:
        """The names of the served workflows."""
        return tuple(self.workflows)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        """The interpreter's decision; a replay first reads the stored run to trust it."""
        snapshot = invocation.snapshot
        replay = self.interpreter.needs_replay(snapshot)
        durable = None
        if replay and _has_results(snapshot):
            durable = await self.handler.lookup(snapshot.run_id)
        return self.interpreter.decide(snapshot, durable, replay=replay)

    async def run_step(self, invocation: StepInvocation) -> bytes:
        """Run the step's function on its decoded arguments; its result, encoded."""
        interpreter = self.interpreter
        held = interpreter.at_step(invocation.run_id, invocation.step_id)
        if held is not None:  # the run's coroutine is at this step: its own call
            fn = held[1].fn
            args = interpreter.arguments(held, invocation.input)
        else:
            found = interpreter.bodies.get(invocation.step_name)
            if found is None:
                raise FlowError(f"no function is known for step {invocation.step_name!r}")
            fn, args = found, self.codec.decode(invocation.input)
        token = _CURRENT_STEP.set(invocation)
        try:
            result = fn(*args)
            if type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result):
                result = await result
        finally:
            _CURRENT_STEP.reset(token)
        output = self.codec.encode(result)
        if held is not None:
            interpreter.ran(held, invocation.step_id, output, result)
        return output

    async def on_event(self, envelope: Envelope) -> None:
        """Confirm what the engine appended to the live sessions."""
        self.interpreter.observe(envelope)


def _has_results(snapshot: Snapshot) -> bool:
    """Whether a replay of `snapshot` could feed the coroutine anything recorded (a step's or a
    wait's outcome, a hook's payload); a run with none, just created, needs no stored copy to
    confirm them against."""
    return bool(len(snapshot.steps) or len(snapshot.waits) or len(snapshot.hooks))
