"""`Flow`: durable functions on a store, through the reference `Engine`.

A `Flow` is the `WorkflowRuntime` of an `Engine` whose workflow code is `@workflow` functions:
the `Interpreter` answers `run_workflow`, step bodies are the functions passed to `step`, and
the engine records everything through the `CommandHandler`, one commit per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from runfold.engine import (
    DEFAULT_LEASE,
    Engine,
    Queue,
    Resumption,
    RunDefinitionConflict,
    Schedule,
    Worker,
)
from runfold.flow.bodies import StepBodies
from runfold.flow.continuation import cancel_chain, follow, last_run
from runfold.flow.definition import Workflow, registered_workflows
from runfold.flow.encoding import JsonCodec, PayloadCodec
from runfold.flow.errors import UnknownWorkflow
from runfold.flow.events import EventBoard
from runfold.flow.family import Family
from runfold.flow.fork import restart_at, write_fork
from runfold.flow.interpreter import Interpreter
from runfold.flow.messages import post_message
from runfold.flow.outcome import FlowRun, flow_run
from runfold.flow.runtime import FlowRuntime
from runfold.flow.versions import code_version
from runfold.handler import CommandHandler
from runfold.kernel import (
    EntityConflict,
    Snapshot,
    TerminalState,
)
from runfold.stores.protocol import EventStore

__all__ = ["Flow"]


class Flow(FlowRuntime):
    """Runs `@workflow` functions durably on `store`.

    Args:
        store: Any `EventStore`.
        workflows: What this Flow serves (starts, drives, recovers); default: every workflow
            defined in the process when the Flow is made.
        codec: Encodes inputs, outputs, step arguments and results (default `JsonCodec`).
        clock: The time source of the handler and of new sleeps (default: UTC now).
        max_sessions: How many live workflow coroutines to keep between decisions.
        step_threads: How many threads run plain `def` step bodies (an `async def` body runs
            on the event loop), so a slow or blocking body never stalls other runs. 0 runs
            them on the loop too: no thread hop per step (tens of microseconds idle, more on
            a busy machine), for bodies that never block.
        version: Recorded as the workflow version of every run this Flow starts
            (`workflow_info().workflow_version`; DBOS's application version); default
            `code_version` of the served workflows, a digest of their code.

    Raises:
        ValueError: There is no workflow to serve, or `step_threads` is negative.
    """

    def __init__(
        self,
        store: EventStore,
        workflows: Iterable[Workflow] | None = None,
        *,
        codec: PayloadCodec | None = None,
        clock: Callable[[], datetime] | None = None,
        max_sessions: int = 1024,
        step_threads: int = 16,
        version: str | None = None,
    ) -> None:
        served = tuple(workflows) if workflows is not None else registered_workflows()
        if not served:
            raise ValueError("a Flow needs at least one @workflow to serve")
        self.version = version if version is not None else code_version(served)
        self.hashed_version = version is None
        """Whether `version` is the default, `code_version` of the served workflows."""
        self.bodies = StepBodies(step_threads)
        self.codec: PayloadCodec = codec if codec is not None else JsonCodec()
        self.handler = (
            CommandHandler(store) if clock is None else CommandHandler(store, clock=clock)
        )
        self.workflows = {w.name: w for w in served}
        self.interpreter = Interpreter(
            self.workflows, self.codec, self.handler.clock, max_sessions=max_sessions
        )
        self.engine = Engine(self.handler, self, observers=(self,))
        self.family = Family(
            self.engine, self.interpreter, self.codec, lambda: self.version, lambda: self.worker
        )
        self.worker: Worker | None = None
        """The worker `serve` runs, while it serves."""
        self.events = EventBoard()  # where `get_event` callers wait

    # --- what people call ---------------------------------------------------------------------

    async def start(
        self,
        workflow: Workflow,
        input: Any,
        *,
        run_id: str | None = None,
        timeout: timedelta | None = None,
        queued: bool = False,
        queue: str | None = None,
        priority: int = 0,
        dedup_id: str | None = None,
    ) -> FlowRun:
        """Start a run of `workflow` with `input` and drive it until it ends or waits.

        Idempotent for a given `run_id`: the same input again returns the existing run. With a
        `timeout`, the run times out (`timed_out`, its timers and open work with it) that long
        after its first start: a retried start of the same run keeps the first deadline.
        `queued` records the run and returns it pending, without running anything: a worker of
        the fleet (`serve`, in this process or another) starts it. `result(run_id, wait=...)`
        waits for its end. `queue` records it on that queue (queued, as with `queued`), with
        its `priority` there (0 first, then lower numbers first) and a deduplication id: a
        worker serving the queue (`serve(queues=...)`) starts it within the queue's limits.

        Raises:
            UnknownWorkflow: This Flow does not serve `workflow`.
            QueueDeduplicated: `dedup_id` is held by a live run of `queue`; nothing recorded.
            RunDefinitionConflict: `run_id` is a run with another workflow or input (or
                a deadline where none was asked, or none where one was, or another
                `version` given to the Flow; a default version, a digest of the code, is
                not compared).
            FlowNonDeterminism: The code asks for something other than the history holds.
            ValueError: `timeout` is not positive.
        """
        if workflow.name not in self.workflows:
            raise UnknownWorkflow(f"this Flow does not serve workflow {workflow.name!r}")
        deadline = None
        if timeout is not None:
            if timeout <= timedelta(0):
                raise ValueError("a run's timeout must be positive")
            # The deadline is fixed at the first start: a retry finds it recorded.
            existing = None if run_id is None else await self.handler.lookup(run_id)
            if existing is not None and existing.deadline is not None:
                deadline = existing.deadline
            else:
                deadline = self.handler.clock() + timeout
        encoded = self.codec.encode(input)
        start = functools.partial(
            self.engine.start,
            workflow.name,
            encoded,
            run_id=run_id,
            deadline=deadline,
            queued=queued,
            queue=queue,
            priority=priority,
            dedup_id=dedup_id,
        )
        try:
            snapshot = await start(workflow_version=self.version)
        except RunDefinitionConflict:
            # A start retried by newer code, whose digest differs, is the same start; so is one
            # that raced the run's first start, whose deadline was fixed a moment earlier.
            existing = None if run_id is None else await self.handler.lookup(run_id)
            if existing is None:
                raise
            version = existing.workflow_version if self.hashed_version else self.version
            if deadline is not None and existing.deadline is not None:
                deadline = existing.deadline
            if (version, deadline) == (self.version, start.keywords["deadline"]):
                raise
            snapshot = await start(workflow_version=version, deadline=deadline)
        queued = queued or queue is not None
        if queued and self.worker is not None:
            self.worker.wake()
        return await self.settled(snapshot)

    async def deliver(self, token: str, payload: Any, *, delivery_id: str | None = None) -> FlowRun:
        """Deliver `payload` to the `wait_for_event` holding `token`, and drive its run.

        A repeated `delivery_id` with the same payload is recorded once. A run of a fleet is
        driven by its workers: a process that does not serve (`serve`) only records the
        delivery, and a worker, woken by it, takes the run on.

        Raises:
            HookNotFound: No live hook holds the token.
            InvalidCommand: The token is not text UTF-8 can encode; nothing was read.
            RunExpired: The hook is retained past the end of its run.
            EntityConflict: `delivery_id` was already received with another payload.
        """
        encoded = self.codec.encode(payload)
        return await self.settled(await self.engine.deliver(token, encoded, delivery_id))

    async def send(
        self,
        run_id: str,
        message: Any,
        *,
        topic: str | None = None,
        idempotency_key: str | None = None,
    ) -> FlowRun:
        """Send `message` to the run on `topic` (DBOS's `send`), for its `recv` to take.

        It is recorded in the run at once (a delivery of the run's mailbox hook for the topic,
        which this call creates when the workflow has not asked yet), so it is kept until a
        `recv` takes it; the run is then driven. The same `idempotency_key` again records the
        message once (and is taken as sent once the run ended). A run that continued as new
        passes it to the last run of its chain.

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run has ended.
            EntityConflict: `idempotency_key` was already used with another message.
        """
        encoded = self.codec.encode(message)
        snapshot = await post_message(self.engine, run_id, encoded, topic, idempotency_key)
        return await self.settled(snapshot)

    async def cancel(self, run_id: str, reason: str | None = None) -> FlowRun:
        """Cancel a live run (and, as it ends, its live children), and drive it to its end.

        A run that continued as new stands for the last run of its chain.

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run already ended otherwise.
            EntityConflict: The run is already cancelling for another reason.
        """
        return await self.settled(await cancel_chain(self.engine, run_id, reason))

    async def cancel_child(self, run_id: str, reason: str) -> None:
        """Ask a child run to cancel from its parent's step (`ChildHandle.cancel`).

        As `cancel`, without driving anything but the child: the parent's drive is running.
        A child that continued as new stands for the last run of its chain; one that ended or
        is already cancelling is left as it is.
        """
        with contextlib.suppress(TerminalState, EntityConflict):
            await cancel_chain(self.engine, run_id, reason)

    async def fork(self, run_id: str, *, from_step: int, new_run_id: str | None = None) -> FlowRun:
        """A new run of `run_id`'s workflow and input, reusing its outcomes before `from_step`.

        Calls 1 to `from_step - 1` are not run again: their recorded outcomes are copied; the
        rest runs on this Flow's code (see `runfold.flow.fork`). The new run (`new_run_id`, else
        a new id) is linked to the old by its `$forked_from` and `$forked_at` attributes, and
        driven until it ends or waits.

        Raises:
            RunNotFound: `run_id` has no history.
            ForkRefused: A call before `from_step` has no outcome a new run can reuse.
            UnknownWorkflow: This Flow does not serve the run's workflow.
            EntityConflict: `new_run_id` is taken.
        """
        new_id = await write_fork(
            self.handler, self.workflows, self.version, run_id, from_step, new_run_id
        )
        return await self.settled(await self.engine.drive(new_id))

    async def restart(self, run_id: str, *, new_run_id: str | None = None) -> FlowRun:
        """Fork a failed or cancelled run from its first call that did not complete.

        Raises:
            RunNotFound: `run_id` has no history.
            ForkRefused: The run did not fail and was not cancelled, or holds, before that
                call, one whose outcome a new run cannot reuse.
        """
        old = await self.handler.snapshot(run_id)
        return await self.fork(run_id, from_step=restart_at(old), new_run_id=new_run_id)

    async def settled(self, snapshot: Snapshot) -> FlowRun:
        """`snapshot` reported once the follow-ups of children and parents are done.

        It is read again if they did anything: they may have moved the run.
        """
        if await self.family.settle():
            snapshot = await self.handler.snapshot(snapshot.run_id)
        return self.report(await last_run(self.handler, snapshot))

    async def recover(self) -> tuple[Resumption, ...]:
        """Drive every live run of the served workflows once (at start-up).

        A run that fails to drive is reported in its `Resumption` and does not stop the others.
        """
        resumed = await self.engine.recover()
        await self.family.orphans(r.snapshot for r in resumed if r.snapshot is not None)
        await self.family.settle()
        return resumed

    async def run_until_idle(self, now: datetime | None = None) -> tuple[Resumption, ...]:
        """Resume due sleeps and retries until nothing is due at `now` (default: the clock).

        Stops early when a round only met runs that fail to drive (they are in the result).
        """
        resumed: list[Resumption] = []
        while True:
            found = await self.engine.resume_due(now)
            await self.family.settle()
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
        queues: Sequence[Queue] = (),
        versions: Collection[str] | None = None,
    ) -> None:
        """Serve this Flow's workflows as one worker of a fleet, until SIGTERM, Ctrl-C or `stop`.

        Any number of processes may serve one store: each run is driven by one worker at a time
        (its owner), due sleeps and retries and the runs of dead workers go to exactly one of
        them. Runs this Flow `start`s while it serves are claimed by this worker; workflows
        with a `schedule` are started at each tick; runs on `queues` are started within their
        limits, across the fleet (runs on no queue are served always). With `versions` (DBOS's
        application version), it claims only runs started on one of those code versions, so a
        blue/green deploy's old workers drain the old version's runs (such a worker serves no
        queue). The arguments are `Worker`'s; `handle_signals` makes SIGTERM and SIGINT stop
        gracefully.

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
            queues=queues,
            versions=versions,
        )
        self.worker = worker
        if handle_signals:
            worker.install_signal_handlers()
        follow_ups = asyncio.create_task(self.family.keep_settling(), name="flow follow-ups")
        try:
            await worker.serve()
        finally:
            follow_ups.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow_ups
            self.worker = None
            self.engine.lease = None

    def stop(self) -> None:
        """Stop `serve` gracefully (what SIGTERM does); no-op when not serving."""
        if self.worker is not None:
            self.worker.stop()

    async def result(self, run_id: str, *, wait: float | None = None) -> FlowRun:
        """The run as it stands; with `wait`, once it ended or `wait` seconds passed.

        A run that ended with `continue_as_new` is followed to the last run of its chain: the
        `FlowRun` is that run's (its `run_id` the last run's). Any process may wait, one that
        serves no workflow included. It is woken when the run ends (`RunSignals`: within the
        process on every store, from any process on PostgreSQL), and reads the run again at
        least every `RESULT_RECHECK` seconds, since a signal may be lost with a connection,
        or come from another process on SQLite.

        Raises:
            RunNotFound: The run has no history.
        """
        return self.report(await follow(self.handler, run_id, wait))

    async def get_event(self, run_id: str, key: str, *, timeout: float | None = 60.0) -> Any:
        """The latest value the run published under `key` with `set_event`, decoded.

        DBOS's `get_event`: it waits until the key is set, for at most `timeout` seconds (None:
        no bound). None once the timeout passed, or the run (the last of its chain, for a run
        that continued as new) ended without setting it.

        Any process may ask: a set in this process wakes the call at once; one in another
        process is seen within half a second (the run is read at growing intervals).

        Raises:
            RunNotFound: The run has no history.
            ValueError: `timeout` is negative.
        """
        if timeout is not None and timeout < 0:
            raise ValueError("a get_event timeout cannot be negative")
        found, value = await self.events.get(self.handler, run_id, key, timeout)
        return self.codec.decode(value) if found else None

    def report(self, snapshot: Snapshot) -> FlowRun:
        """`snapshot` as a `FlowRun`."""
        return flow_run(snapshot, self.codec)
