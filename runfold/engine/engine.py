"""`Engine`: the reference loop that turns workflow code into a durable history.

The engine asks the runtime what a run should do next, turns the answer into kernel commands and
records them through `CommandHandler.execute_many`, so the kernel decides every rule and every
store keeps it; the engine only orchestrates (the loop of one drive is `runfold.engine.drive`).
It reaches the store only through the handler, and works from the snapshots the handler returns.

Commits: the commands of the workflow's decisions go in one append with the next step's start,
the run's wait or its end, so a sequential workflow commits once per step.

Concurrency: a decision made on a snapshot that another writer has since moved past is never an
error: a refused command on a stale view makes the engine look again and re-ask the workflow.
Only a refusal on the freshest view is raised. So several engines (or several tasks of one) may
drive the same run: each step outcome and the run's end are recorded once, because the kernel
refuses a second one.

Services: an engine serves the workflows its runtime declares (`workflow_names`): it never
writes to a run of another workflow, and asks the store only for their wakeups.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import attrs

from runfold.engine.drive import Drive, DriveSetup
from runfold.engine.errors import RunDefinitionConflict, WorkflowNotServed
from runfold.engine.journal import StepsInFlight
from runfold.engine.lease import Lease
from runfold.engine.observing import ObserverFanOut
from runfold.engine.queues import hold_dedup
from runfold.engine.resuming import due_by_run, resume_run, settle
from runfold.engine.retry import DEFAULT_JITTER
from runfold.engine.runtime import DEFAULT_STEP_TIMEOUT, EngineObserver, WorkflowRuntime
from runfold.engine.survey import LIVE, engine_summary, live_summaries, open_suspensions
from runfold.engine.suspensions import EngineSummary, Resumption, Suspension
from runfold.engine.turns import DriveTurns
from runfold.handler import CommandHandler, Outcome, new_run_id
from runfold.kernel import (
    BatchDecision,
    CancelRun,
    Command,
    CompleteWait,
    CreateRun,
    Ownership,
    RequestCancel,
    RunCreated,
    RunOwned,
    Snapshot,
    StartRun,
    TimeOutRun,
    Wakeup,
    decide,
)

__all__ = ["Engine"]


class Engine:
    """Drives workflow runs: asks `runtime` what each run does next and records it durably.

    Every decision goes through the handler, so the kernel decides every rule; several engines
    may drive the same run, and each step outcome and the run's end are recorded once. The
    engine serves only the workflows `runtime.workflow_names` declares.

    Args:
        handler: Supplies the store, the clock and the limits.
        runtime: The workflow code: what a run does next, and the step bodies.
        observers: See every envelope the engine appends.
        max_replay_iterations: How often one `drive` may ask the runtime before it raises
            `ReplayLimitExceeded`; None (the default): no bound, a drive goes on until the run
            ends or waits (the run's `Limits.max_events_per_run` bounds a workflow that never
            does: past it the run fails with `HistoryLimitExceeded`).
        jitter: The share of a retry delay the replay-stable jitter may take off.
        lease: The lease of the fleet worker this engine drives runs for (a `Worker` sets
            it). With one, every drive first claims its run for the worker (the claim goes in
            the drive's first append), acts only as its owner, and releases the run when it
            waits; a run another live worker owns is left alone. Without one, runs are driven
            unowned, as by a single process.
        step_timeout: How long an attempt of a step body may run before it fails as timed out
            (`StepTimedOut`), unless its `ScheduleStep.timeout` says otherwise; None: no bound.

    Raises:
        ValueError: `max_replay_iterations` is below 1, `jitter` is outside [0, 1],
            `step_timeout` is not positive, or the runtime declares no workflow.
    """

    def __init__(
        self,
        handler: CommandHandler,
        runtime: WorkflowRuntime,
        observers: Iterable[EngineObserver] = (),
        *,
        max_replay_iterations: int | None = None,
        jitter: float = DEFAULT_JITTER,
        lease: Lease | None = None,
        step_timeout: timedelta | None = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        if max_replay_iterations is not None and max_replay_iterations < 1:
            raise ValueError("max_replay_iterations must be at least 1")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter must be between 0 and 1")
        if step_timeout is not None and step_timeout <= timedelta(0):
            raise ValueError("step_timeout must be positive (or None)")
        served = runtime.workflow_names
        if isinstance(served, str) or not served:
            raise ValueError("runtime.workflow_names must name at least one workflow")
        self.handler = handler
        self.runtime = runtime
        self._fan_out = ObserverFanOut(observers)
        self.observers = self._fan_out.observers
        self.max_replay_iterations = max_replay_iterations
        self.jitter = jitter
        self.step_timeout = step_timeout
        self.workflow_names: frozenset[str] = frozenset(served)
        self._in_flight = StepsInFlight()
        self._turns = DriveTurns(handler.snapshot)
        self.lease = lease

    # --- run lifecycle ------------------------------------------------------------------------

    async def start(
        self,
        workflow_name: str,
        input: bytes,
        *,
        run_id: str | None = None,
        workflow_version: str | None = None,
        deployment_id: str | None = None,
        context: bytes | None = None,
        attributes: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
        deadline: datetime | None = None,
        queued: bool = False,
        queue: str | None = None,
        priority: int = 0,
        dedup_id: str | None = None,
    ) -> Snapshot:
        """Create and start a run (a new id unless `run_id` is given), then `drive` it.

        The run's creation goes in one append with the workflow's first decision. Idempotent
        for a given `run_id`: the same definition again drives the existing run (or just
        returns it once ended).

        `queued` only records the run (pending, owned by nobody) and returns it: a `Worker` of
        the fleet starts and drives it. A process that runs no workflows starts runs this way.
        `queue` records it on that queue (queued, whatever `queued` says), with its `priority`
        there (lower first) and a deduplication id: a `Worker` serving the queue starts it within
        the queue's limits (`Queue`).

        Raises:
            RunDefinitionConflict: `run_id` belongs to a run created with another definition.
            QueueDeduplicated: `dedup_id` is held by another live run of the queue.
            WorkflowNotServed: The runtime does not declare `workflow_name`.
            InvalidCommand: The definition is malformed (ids, sizes, attributes, deadline).
            RunfoldError: Whatever `drive` raises.
        """
        generated = run_id is None
        run_id = run_id if run_id is not None else new_run_id()
        create = CreateRun(
            workflow_name=workflow_name,
            input=input,
            workflow_version=workflow_version,
            deployment_id=deployment_id,
            context=context,
            attributes=attributes if attributes is not None else {},
            parent_run_id=parent_run_id,
            deadline=deadline,
            queue_name=queue,
            priority=priority,
            dedup_id=dedup_id,
        )
        queued = queued or queue is not None
        # What the kernel would record: validates the definition before anything is read.
        intended = decide(
            None, create, now=self.handler.clock(), limits=self.handler.limits, run_id=run_id
        ).events[0]
        # A new id names no run yet: nothing to look up (the append at sequence 0 checks it).
        current = None if generated else await self.handler.lookup(run_id)
        if current is None:
            self._check_served(run_id, workflow_name)
            if queued:
                if queue is not None and dedup_id is not None:
                    await hold_dedup(
                        self.handler.store, queue, dedup_id, run_id, self.handler.clock()
                    )
                return (await self.execute(run_id, (create,))).snapshot
            return await self._one_drive_at_a_time(run_id, None, (StartRun(create=create),), None)
        first = (await self.handler.history(run_id, limit=1))[0].event
        if not isinstance(first, RunCreated) or not isinstance(intended, RunCreated):
            raise AssertionError("a run's first event is run_created")
        if attrs.evolve(first, spec_version=intended.spec_version) != intended:
            raise RunDefinitionConflict(
                f"run {run_id!r} already exists with another definition", run_id=run_id
            )
        if queued:
            return current
        try:
            return await self._drive(current)
        except RunOwned:  # another live worker drives it: the start took effect
            return await self.handler.snapshot(run_id)

    async def drive(self, run_id: str, *, displacing: str | None = None) -> Snapshot:
        """Apply the runtime's next decisions for the run until it ends or waits.

        It waits on a timer, a hook, a delayed retry, or steps this engine is running. A pending
        run is started; a run past its deadline is timed out. Nothing half-done is left behind:
        every append is atomic, and driving again continues from the last one. The runtime's own
        exceptions from `run_workflow` propagate unchanged.

        Raises:
            RunNotFound: The run has no history.
            WorkflowNotServed: The run's workflow is not one the runtime declares.
            Rejection: The kernel refused a decision on the freshest view (`NonDeterministic`,
                `TerminalState`, …).
            InvalidDecision: The runtime returned a decision the engine cannot apply.
            ReplayLimitExceeded: The run did not settle within `max_replay_iterations` (only
                when one is set).
            RunOwned: With a `lease`: another worker owns the run (and is not `displacing`,
                the owner whose lease the caller found lapsed).
            OwnershipLost: With a `lease`: the worker lost the run while driving it.
        """
        return await self._drive(await self.handler.snapshot(run_id), displacing)

    async def _drive(self, snapshot: Snapshot, displacing: str | None = None) -> Snapshot:
        self._check_served(snapshot.run_id, snapshot.workflow_name)
        if snapshot.is_terminal:
            return snapshot
        return await self._one_drive_at_a_time(snapshot.run_id, snapshot, (), displacing)

    async def _one_drive_at_a_time(
        self,
        run_id: str,
        snapshot: Snapshot | None,
        pending: tuple[Command, ...],
        displacing: str | None,
    ) -> Snapshot:
        """Drive the run in its turn (`DriveTurns`): one drive of it at a time here."""

        def driver(
            snapshot: Snapshot | None, pending: tuple[Command, ...], displacing: str | None
        ) -> Awaitable[Snapshot]:
            return Drive(self._setup(), run_id, snapshot, pending, displacing=displacing).run()

        return await self._turns.drive(run_id, snapshot, pending, displacing, driver)

    def _setup(self) -> DriveSetup:
        """What a drive takes from this engine now (a `Worker` may change the lease)."""
        return DriveSetup(
            handler=self.handler,
            runtime=self.runtime,
            execute=self.handler.execute_many,
            notify=self._fan_out.notify if self._fan_out.observers else None,
            in_flight=self._in_flight,
            lease=self.lease,
            max_replay_iterations=self.max_replay_iterations,
            step_timeout=self.step_timeout,
            jitter=self.jitter,
        )

    async def resume_wait(self, run_id: str, wait_id: str) -> Snapshot:
        """Complete a wait (due or not: the caller decides when) and drive the run.

        A wait already completed or cancelled, or of a run that ended, is left as it is.

        Raises:
            RunNotFound: The run has no history.
            WaitNotFound: The run has no such wait.
            WorkflowNotServed: The run's workflow is not one the runtime declares.
            RunfoldError: Whatever `drive` raises.
        """
        self._check_served(run_id, (await self.handler.snapshot(run_id)).workflow_name)
        await self._settle(run_id, CompleteWait(wait_id=wait_id))
        return await self.drive(run_id)

    async def resume_due(
        self, now: datetime | None = None, *, limit: int = 100
    ) -> tuple[Resumption, ...]:
        """Resume what is due at `now` (default: the clock), with one `store.due_wakeups` query.

        Only the wakeups of runs of the served workflows are asked for. Due waits are completed
        and deadlines passed time their run out; then each run is driven once (a delayed retry
        runs again when the workflow re-schedules its step, once due by the handler's clock). A
        run whose drive fails does not stop the others: its `Resumption` carries the error,
        which is also logged. At most `limit` wakeups are handled per call.

        A run interrupted inside a step (its process died) has no wakeup: `recover` finds it.

        Raises:
            StoreUnavailable: The store could not be reached (safe to retry).
            StoreClosed: The store was closed.
        """
        now = now if now is not None else self.handler.clock()
        wakeups = await self.handler.store.due_wakeups(
            now, limit=limit, workflow_names=self.workflow_names
        )
        resumed = []
        for run_id, due in due_by_run(wakeups, fleet=self.lease is not None).items():
            resumption = await resume_run(run_id, due, self._settle, self.drive)
            if resumption is not None:
                resumed.append(resumption)
        return tuple(resumed)

    async def recover(self) -> tuple[Resumption, ...]:
        """Drive every live run of the served workflows once: what a process does on start-up.

        It finds, through the store's run index (pending, running and cancelling runs of each
        served workflow), the runs a dead process left mid-way: a step started and never
        finished (it gets a new attempt), a run created and not started, a decision not yet
        made. Runs that wait on a timer or a hook are only looked at. Each run is driven on its
        own: one that fails is reported in its `Resumption` (and logged) and never stops the
        others.

        Call it where no other live engine is running the same runs' steps (at start-up, or
        from one process at a time): a step another process is running looks the same as one
        whose process died, and would be started again.

        Raises:
            StoreUnavailable: The store could not be reached (safe to retry).
            StoreClosed: The store was closed.
        """
        resumed = []
        for workflow_name in sorted(self.workflow_names):
            for status in LIVE:
                async for summary in live_summaries(self.handler, status, workflow_name):
                    resumption = await resume_run(summary.run_id, (), self._settle, self.drive)
                    if resumption is not None:
                        resumed.append(resumption)
        return tuple(resumed)

    async def deliver(self, token: str, payload: bytes, delivery_id: str | None = None) -> Snapshot:
        """Deliver `payload` to the live hook holding `token`, then drive its run.

        A repeated `delivery_id` with the same payload is recorded once. A run of a fleet is
        driven only by its workers: without a `lease`, once a worker ever claimed the run, or
        while it is queued (pending), the delivery is recorded and a worker takes the run on
        (its `ready` wakeup). A run of a workflow the engine does not serve is not driven here
        either.

        Raises:
            HookNotFound: No live hook holds the token.
            InvalidCommand: The token is not text UTF-8 can encode; nothing was read.
            RunExpired: The hook is retained past the end of its run.
            EntityConflict: `delivery_id` was already received with another payload.
            RunfoldError: Whatever `drive` raises.
        """
        outcome = await self.handler.deliver(token, payload, delivery_id)
        await self._fan_out.notify(outcome.appended)
        return await self._take_input(outcome.snapshot)

    async def request_cancel(self, run_id: str, reason: str | None = None) -> Snapshot:
        """Ask a run to cancel, then drive it so the workflow can end it.

        A run of a fleet is driven as `deliver` says.

        Its open steps, waits and hooks are cancelled; the workflow, seeing
        `snapshot.cancellation`, must end the run as cancelled or failed (it may run cleanup
        steps first).

        Raises:
            TerminalState: The run already ended otherwise.
            EntityConflict: The run is already cancelling for another reason.
            RunfoldError: Whatever `drive` raises.
        """
        outcome = await self.execute(run_id, (RequestCancel(reason=reason),))
        return await self._take_input(outcome.snapshot)

    async def _take_input(self, snapshot: Snapshot) -> Snapshot:
        """Drive a run that input (a delivery, a cancellation request) just reached, unless it
        is a fleet's and this engine is none of its workers.

        A run a worker ever claimed belongs to the fleet, and so does a queued run no worker
        has started yet (pending): an engine without a lease (a web process, say) leaves it
        be, and the run's `ready` wakeup (or its queue) hands it to a worker. With a
        lease, a run another live worker owns is left to it: the owner sees the input. A run
        of a workflow this engine does not serve is left to a process that does.
        """
        if (self.lease is None and (snapshot.owner_epoch > 0 or snapshot.status == "pending")) or (
            snapshot.workflow_name not in self.workflow_names
        ):
            return snapshot
        try:
            return await self._drive(snapshot)
        except RunOwned:
            return await self.handler.snapshot(snapshot.run_id)

    async def cancel(self, run_id: str, reason: str | None = None) -> Snapshot:
        """End a run as cancelled now, without asking the workflow (no cleanup).

        Idempotent on a cancelled run.

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run already ended otherwise.
        """
        return (await self.execute(run_id, (CancelRun(reason=reason),))).snapshot

    async def time_out(self, run_id: str, reason: str | None = None) -> Snapshot:
        """End a live run as timed out now, recording its deadline (or now if it has none).

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run already ended.
        """
        snapshot = await self.handler.snapshot(run_id)
        deadline = snapshot.deadline if snapshot.deadline is not None else self.handler.clock()
        command = TimeOutRun(deadline=deadline, reason=reason)
        return (await self.execute(run_id, (command,))).snapshot

    # --- looking around -----------------------------------------------------------------------

    async def next_wakeup(self) -> Wakeup | None:
        """The earliest pending wakeup of a live run of the served workflows, or None.

        A host sleeps until it.
        """
        return await self.handler.store.next_wakeup(workflow_names=self.workflow_names)

    async def open_suspensions(self, now: datetime | None = None) -> tuple[Suspension, ...]:
        """Every open wait, delayed retry, deadline and awaited hook of the live runs.

        `due` is judged at `now` (default: the clock); sorted by run id, then kind, then subject
        id.
        """
        now = now if now is not None else self.handler.clock()
        return await open_suspensions(self.handler, now)

    async def summary(self, now: datetime | None = None) -> EngineSummary:
        """Runs by status across the store, and the open work of live runs at `now`."""
        return await engine_summary(self.handler, now if now is not None else self.handler.clock())

    # --- appending and checks --------------------------------------------------------------------

    def _check_served(self, run_id: str, workflow_name: str) -> None:
        if workflow_name not in self.workflow_names:
            raise WorkflowNotServed(
                f"run {run_id!r} is of workflow {workflow_name!r}, which this engine's runtime "
                "does not declare",
                run_id=run_id,
            )

    async def execute(
        self,
        run_id: str,
        commands: Sequence[Command],
        *,
        known_sequence: int | None = None,
        now: datetime | None = None,
        decided: BatchDecision | None = None,
        acting_as: Ownership | None = None,
    ) -> Outcome:
        """`CommandHandler.execute_many`, then the observers see what was appended.

        How a process that runs no workflow records a command a drive would have: the engine's
        observers see it, as they see what drives append.
        """
        outcome = await self.handler.execute_many(
            run_id,
            commands,
            known_sequence=known_sequence,
            now=now,
            decided=decided,
            acting_as=acting_as,
        )
        if self.observers:
            await self._fan_out.notify(outcome.appended)
        return outcome

    async def _settle(self, run_id: str, command: Command) -> None:
        """Execute a command that may have been made moot by someone else (`settle`)."""
        await settle(self.execute, run_id, command)
