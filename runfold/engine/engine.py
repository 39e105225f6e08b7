"""`Engine`: the reference loop that turns workflow code into a durable history.

The engine asks the runtime what a run should do next, turns the answer into kernel commands and
executes them through `CommandHandler.execute`, so the kernel decides every rule and every store
keeps it; the engine only orchestrates. Definition checks that write nothing (is this step, this
wait, the same one the workflow issued before?) ask the pure `decide` on the snapshot the workflow
saw, so they too are the kernel's judgement.

Concurrency: a decision made on a snapshot that another writer has since moved past is never an
error: a refused command on a stale view makes the engine look again and re-ask the workflow.
Only a refusal on the freshest view is raised. So several engines (or several tasks of one) may
drive the same run: each step outcome and the run's end are recorded once, because the kernel
refuses a second one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Literal, TypeAlias

import attrs

from runfold.engine.errors import InvalidDecision, ReplayLimitExceeded, RunDefinitionConflict
from runfold.engine.retry import DEFAULT_JITTER, DEFAULT_RETRY, retry_delay
from runfold.engine.runtime import (
    AwaitHook,
    Cancel,
    Complete,
    EngineObserver,
    Fail,
    LinkChildOperation,
    ReportProgress,
    ScheduleStep,
    ScheduleSteps,
    StepFailure,
    StepInvocation,
    TimeOut,
    UpdateAttributes,
    WaitUntil,
    WorkflowInvocation,
    WorkflowRuntime,
)
from runfold.handler import CommandHandler, Outcome, new_run_id
from runfold.kernel import (
    LIVE_RUN_STATUSES,
    CancelRun,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    EntityConflict,
    Envelope,
    Event,
    FailRun,
    FailStep,
    LazyStep,
    Limits,
    LinkChild,
    NonDeterministic,
    RecordProgress,
    Rejection,
    RequestCancel,
    RetryStep,
    RunCreated,
    RunExpired,
    RunNotFound,
    RunStatus,
    RunSummary,
    SetAttributes,
    Snapshot,
    StartRun,
    StartStep,
    StepState,
    StoreClosed,
    StoreUnavailable,
    TerminalState,
    TimeOutRun,
    Wakeup,
    apply,
    decide,
    project_run,
)
from runfold.stores.protocol import EventStore

__all__ = ["Engine", "EngineSummary", "Resumption", "Suspension", "SuspensionKind"]

_log = logging.getLogger("runfold.engine")

SuspensionKind: TypeAlias = Literal["wait", "retry", "deadline", "hook"]
"""What a `Suspension` waits on: a wait, a delayed step retry, the deadline, or a hook."""
_KIND_ORDER: dict[str, int] = {"wait": 0, "retry": 1, "deadline": 2, "hook": 3}
_LIVE: tuple[RunStatus, ...] = ("pending", "running", "cancelling")
_PAGE = 500
_MAX_ERROR_CHARS = 4096


@attrs.frozen(kw_only=True)
class Suspension:
    """Open work of a live run: a wait, a delayed retry, the deadline, or a hook.

    Each is due at `due_at`, except a hook awaiting a delivery (`due_at=None`, never `due`).
    """

    run_id: str
    kind: SuspensionKind
    subject_id: str
    due_at: datetime | None
    due: bool


@attrs.frozen(kw_only=True)
class Resumption:
    """What `Engine.resume_due` did for one run: its due wakeups, and how the drive ended.

    Either `snapshot` is where the drive ended or `error` is what stopped it; other runs are
    resumed regardless.
    """

    run_id: str
    wakeups: tuple[Wakeup, ...]
    snapshot: Snapshot | None
    error: Exception | None


@attrs.frozen(kw_only=True)
class EngineSummary:
    """Counts across the store: runs by status, and the open work of live runs."""

    runs: int
    by_status: Mapping[str, int]
    open_waits: int
    active_hooks: int
    delayed_retries: int
    due: int
    """Waits, retries and deadlines already due (what `resume_due` would pick up)."""


class _View:
    """One drive's picture of a run: the history read so far and its snapshot, kept in step."""

    __slots__ = ("history", "limits", "snapshot", "store")

    def __init__(self, store: EventStore, limits: Limits, history: list[Envelope]) -> None:
        self.store = store
        self.limits = limits
        self.history = history
        self.snapshot = project_run(history, limits=limits)

    async def refresh(self) -> bool:
        """Catch up with what was appended since; True if anything was."""
        newer = await self.store.read(self.snapshot.run_id, after=self.snapshot.last_sequence)
        if not newer:
            return False
        self.snapshot = apply(self.snapshot, newer, limits=self.limits)
        self.history.extend(newer)
        return True


def _step_key(step: StepState | None) -> tuple[str, int] | None:
    return None if step is None else (step.status, step.attempt)


def _describe(exc: BaseException) -> bytes:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS].encode()


class Engine:
    """Drives workflow runs: asks `runtime` what each run does next and records it durably.

    Every decision goes through the handler, so the kernel decides every rule; several engines
    may drive the same run, and each step outcome and the run's end are recorded once.

    Args:
        handler: Supplies the store, the clock and the limits.
        runtime: The workflow code: what a run does next, and the step bodies.
        observers: See every envelope the engine appends.
        max_replay_iterations: How often one `drive` may ask the runtime before it raises
            `ReplayLimitExceeded`.
        jitter: The share of a retry delay the replay-stable jitter may take off.

    Raises:
        ValueError: `max_replay_iterations` is below 1, or `jitter` is outside [0, 1].
    """

    def __init__(
        self,
        handler: CommandHandler,
        runtime: WorkflowRuntime,
        observers: Iterable[EngineObserver] = (),
        *,
        max_replay_iterations: int = 1024,
        jitter: float = DEFAULT_JITTER,
    ) -> None:
        if max_replay_iterations < 1:
            raise ValueError("max_replay_iterations must be at least 1")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter must be between 0 and 1")
        self.handler = handler
        self.runtime = runtime
        self.observers = tuple(observers)
        self.max_replay_iterations = max_replay_iterations
        self.jitter = jitter
        self._in_flight: set[tuple[str, str]] = set()

    @property
    def store(self) -> EventStore:
        """The handler's store."""
        return self.handler.store

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
    ) -> Snapshot:
        """Create and start a run (a new id unless `run_id` is given), then `drive` it.

        Idempotent for a given `run_id`: the same definition again drives the existing run (or
        just returns it once ended).

        Raises:
            RunDefinitionConflict: `run_id` belongs to a run created with another definition.
            InvalidCommand: The definition is malformed (ids, sizes, attributes, deadline).
            RunfoldError: Whatever `drive` raises.
        """
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
        )
        # What the kernel would record: validates the definition before anything is written.
        intended = decide(
            None, create, now=self.handler.clock(), limits=self.handler.limits, run_id=run_id
        ).events[0]
        first = await self.store.read(run_id, limit=1)
        if first:
            self._same_start(run_id, first[0].event, intended)
        try:
            outcome = await self._execute(run_id, StartRun(create=create))
        except RunExpired:  # it ended already: starting it again is a no-op
            return await self.handler.snapshot(run_id)
        if not first and not any(isinstance(e.event, RunCreated) for e in outcome.appended):
            # Another caller created it between our read and our append.
            self._same_start(run_id, (await self.store.read(run_id, limit=1))[0].event, intended)
        return await self.drive(run_id)

    @staticmethod
    def _same_start(run_id: str, recorded: Event, intended: Event) -> None:
        if not isinstance(recorded, RunCreated) or not isinstance(intended, RunCreated):
            raise AssertionError("a run's first event is run_created")
        if attrs.evolve(recorded, spec_version=intended.spec_version) != intended:
            raise RunDefinitionConflict(
                f"run {run_id!r} already exists with another definition", run_id=run_id
            )

    async def drive(self, run_id: str) -> Snapshot:
        """Apply the runtime's next decisions for the run until it ends or waits.

        It waits on a timer, a hook, a delayed retry, or steps this engine is running. A pending
        run is started; a run past its deadline is timed out. Nothing half-done is left behind:
        every append is atomic, and driving again continues from the last one. The runtime's own
        exceptions from `run_workflow` propagate unchanged.

        Raises:
            RunNotFound: The run has no history.
            Rejection: The kernel refused a decision on the freshest view (`NonDeterministic`,
                `TerminalState`, …).
            InvalidDecision: The runtime returned a decision the engine cannot apply.
            ReplayLimitExceeded: The run did not settle within `max_replay_iterations`.
        """
        history = await self.store.read(run_id)
        if not history:
            raise RunNotFound(f"run {run_id!r} not found", run_id=run_id)
        view = _View(self.store, self.handler.limits, history)
        for _ in range(self.max_replay_iterations):
            if view.snapshot.is_terminal or not await self._advance(view):
                return view.snapshot
            await view.refresh()
        raise ReplayLimitExceeded(
            f"run {run_id!r} neither ended nor suspended after {self.max_replay_iterations} "
            "decisions; drive it again to continue",
            run_id=run_id,
        )

    async def resume_wait(self, run_id: str, wait_id: str) -> Snapshot:
        """Complete a wait (due or not: the caller decides when) and drive the run.

        A wait already completed or cancelled, or of a run that ended, is left as it is.

        Raises:
            RunNotFound: The run has no history.
            WaitNotFound: The run has no such wait.
            RunfoldError: Whatever `drive` raises.
        """
        await self._settle(run_id, CompleteWait(wait_id=wait_id))
        return await self.drive(run_id)

    async def resume_due(
        self, now: datetime | None = None, *, limit: int = 100
    ) -> tuple[Resumption, ...]:
        """Resume what is due at `now` (default: the clock), with one `store.due_wakeups` query.

        Due waits are completed and deadlines passed time their run out; then each run is
        driven once (a delayed retry runs again when the workflow re-schedules its step, once
        due by the handler's clock). A run whose drive fails does not stop the others: its
        `Resumption` carries the error, which is also logged. At most `limit` wakeups are
        handled per call.

        Raises:
            StoreUnavailable: The store could not be reached (safe to retry).
            StoreClosed: The store was closed.
        """
        now = now if now is not None else self.handler.clock()
        by_run: dict[str, list[Wakeup]] = {}
        for wakeup in await self.store.due_wakeups(now, limit=limit):
            by_run.setdefault(wakeup.run_id, []).append(wakeup)
        resumed = []
        for run_id, wakeups in by_run.items():
            try:
                for wakeup in wakeups:
                    if wakeup.kind == "wait":
                        await self._settle(run_id, CompleteWait(wait_id=wakeup.subject_id))
                    elif wakeup.kind == "deadline":
                        await self._settle(
                            run_id, TimeOutRun(deadline=wakeup.due_at, reason="deadline passed")
                        )
                snapshot = await self.drive(run_id)
            except (StoreUnavailable, StoreClosed):
                raise
            except Exception as exc:
                _log.warning("resuming run %r failed: %r", run_id, exc)
                resumed.append(
                    Resumption(run_id=run_id, wakeups=tuple(wakeups), snapshot=None, error=exc)
                )
            else:
                resumed.append(
                    Resumption(run_id=run_id, wakeups=tuple(wakeups), snapshot=snapshot, error=None)
                )
        return tuple(resumed)

    async def deliver(self, token: str, payload: bytes, delivery_id: str | None = None) -> Snapshot:
        """Deliver `payload` to the live hook holding `token`, then drive its run.

        A repeated `delivery_id` with the same payload is recorded once.

        Raises:
            HookNotFound: No live hook holds the token.
            RunExpired: The hook is retained past the end of its run.
            EntityConflict: `delivery_id` was already received with another payload.
            RunfoldError: Whatever `drive` raises.
        """
        outcome = await self.handler.deliver(token, payload, delivery_id)
        await self._notify(outcome.appended)
        return await self.drive(outcome.snapshot.run_id)

    async def request_cancel(self, run_id: str, reason: str | None = None) -> Snapshot:
        """Ask a run to cancel, then drive it so the workflow can end it.

        Its open steps, waits and hooks are cancelled; the workflow, seeing
        `snapshot.cancellation`, must end the run as cancelled or failed (it may run cleanup
        steps first).

        Raises:
            TerminalState: The run already ended otherwise.
            EntityConflict: The run is already cancelling for another reason.
            RunfoldError: Whatever `drive` raises.
        """
        await self._execute(run_id, RequestCancel(reason=reason))
        return await self.drive(run_id)

    async def cancel(self, run_id: str, reason: str | None = None) -> Snapshot:
        """End a run as cancelled now, without asking the workflow (no cleanup).

        Idempotent on a cancelled run.

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run already ended otherwise.
        """
        return (await self._execute(run_id, CancelRun(reason=reason))).snapshot

    async def time_out(self, run_id: str, reason: str | None = None) -> Snapshot:
        """End a live run as timed out now, recording its deadline (or now if it has none).

        Raises:
            RunNotFound: The run has no history.
            TerminalState: The run already ended.
        """
        snapshot = await self.handler.snapshot(run_id)
        deadline = snapshot.deadline if snapshot.deadline is not None else self.handler.clock()
        command = TimeOutRun(deadline=deadline, reason=reason)
        return (await self._execute(run_id, command)).snapshot

    # --- looking around -----------------------------------------------------------------------

    async def next_wakeup(self) -> Wakeup | None:
        """The earliest pending wakeup of any live run (so a host can sleep until it), or None."""
        return await self.store.next_wakeup()

    async def open_suspensions(self, now: datetime | None = None) -> tuple[Suspension, ...]:
        """Every open wait, delayed retry, deadline and awaited hook of the live runs.

        `due` is judged at `now` (default: the clock); sorted by run id, then kind, then subject
        id.
        """
        now = now if now is not None else self.handler.clock()
        found: list[Suspension] = []
        for status in _LIVE:
            async for summary in self._summaries(status):
                found.extend(self._suspensions(await self.handler.snapshot(summary.run_id), now))
        found.sort(key=lambda s: (s.run_id, _KIND_ORDER[s.kind], s.subject_id))
        return tuple(found)

    async def summary(self, now: datetime | None = None) -> EngineSummary:
        """Runs by status across the store, and the open work of live runs at `now`."""
        now = now if now is not None else self.handler.clock()
        by_status: dict[str, int] = {}
        open_work: list[Suspension] = []
        async for summary in self._summaries(None):
            by_status[summary.status] = by_status.get(summary.status, 0) + 1
            if summary.status in LIVE_RUN_STATUSES:
                snapshot = await self.handler.snapshot(summary.run_id)
                open_work.extend(self._suspensions(snapshot, now))
        kinds = [s.kind for s in open_work]
        return EngineSummary(
            runs=sum(by_status.values()),
            by_status=MappingProxyType(dict(sorted(by_status.items()))),
            open_waits=kinds.count("wait"),
            active_hooks=kinds.count("hook"),
            delayed_retries=kinds.count("retry"),
            due=sum(s.due for s in open_work),
        )

    async def _summaries(self, status: RunStatus | None) -> AsyncIterator[RunSummary]:
        cursor: str | None = None
        while True:
            page = await self.store.list_runs(status=status, cursor=cursor, limit=_PAGE)
            for summary in page.items:
                yield summary
            if not page.has_more or page.cursor is None:
                return
            cursor = page.cursor

    @staticmethod
    def _suspensions(snapshot: Snapshot, now: datetime) -> list[Suspension]:
        if not snapshot.is_live:
            return []
        found = [
            Suspension(
                run_id=snapshot.run_id,
                kind=w.kind,
                subject_id=w.subject_id,
                due_at=w.due_at,
                due=w.due_at <= now,
            )
            for w in snapshot.wakeups()
        ]
        found.extend(
            Suspension(
                run_id=snapshot.run_id, kind="hook", subject_id=h.hook_id, due_at=None, due=False
            )
            for h in snapshot.active_hooks()
        )
        return found

    # --- the loop -----------------------------------------------------------------------------

    async def _advance(self, view: _View) -> bool:
        """Take the run one decision further; False when it waits."""
        snapshot = view.snapshot
        now = self.handler.clock()
        if snapshot.deadline is not None and snapshot.deadline <= now:
            command: Command = TimeOutRun(deadline=snapshot.deadline, reason="deadline passed")
            return await self._act(view, command, "the deadline")
        if snapshot.status == "pending":
            return await self._act(view, StartRun(), "starting the run")
        invocation = WorkflowInvocation(snapshot=snapshot, history=tuple(view.history))
        decision = await self.runtime.run_workflow(invocation)
        match decision:
            case ScheduleStep():
                return await self._schedule(view, (decision,), now)
            case ScheduleSteps():
                return await self._schedule(view, decision.steps, now)
            case WaitUntil():
                return await self._wait(view, decision, now)
            case AwaitHook():
                return await self._hook(invocation, view, decision)
            case Complete():
                command = CompleteRun(output=decision.output)
            case Fail():
                command = FailRun(error=decision.error, error_code=decision.error_code)
            case Cancel():
                if snapshot.cancellation is None:
                    raise InvalidDecision(
                        f"the workflow cancelled run {snapshot.run_id!r}, but no cancellation "
                        "was requested",
                        run_id=snapshot.run_id,
                    )
                command = CancelRun(reason=snapshot.cancellation.reason)
            case TimeOut():
                deadline = snapshot.deadline if snapshot.deadline is not None else now
                command = TimeOutRun(deadline=deadline, reason=decision.reason)
            case ReportProgress():
                command = RecordProgress(
                    progress_id=decision.progress_id,
                    completed=decision.completed,
                    total=decision.total,
                    message=decision.message,
                    details=decision.details,
                )
            case LinkChildOperation():
                command = LinkChild(
                    reference_id=decision.reference_id,
                    kind=decision.kind,
                    operation_id=decision.operation_id,
                    child_run_id=decision.child_run_id,
                    metadata=decision.metadata,
                )
            case UpdateAttributes():
                command = SetAttributes(changes=decision.changes, write_id=decision.write_id)
            case _:
                raise InvalidDecision(
                    f"run_workflow returned {decision!r}, which is not a RuntimeDecision",
                    run_id=snapshot.run_id,
                )
        return await self._act(view, command, repr(decision))

    async def _act(self, view: _View, command: Command, what: str) -> bool:
        """Execute `command` for the decision `what`; True when the run moved.

        A refusal on a view that others have moved past means "look again" (True); on the
        freshest view it is the workflow's to bear and is raised. So is a command that changed
        nothing: asking again would give the same answer forever.
        """
        run_id = view.snapshot.run_id
        try:
            outcome = await self._execute(
                run_id, command, known_sequence=view.snapshot.last_sequence
            )
        except Rejection:
            if await view.refresh():
                return True
            raise
        if outcome.appended or outcome.missed:
            return True
        raise InvalidDecision(
            f"{what} changed nothing on run {run_id!r}: the workflow would be asked the same "
            "question again",
            run_id=run_id,
        )

    def _same_definition(self, snapshot: Snapshot, command: Command, now: datetime) -> None:
        """Raise the kernel's `NonDeterministic` if `command` redefines an existing entity."""
        try:
            decide(snapshot, command, now=now, limits=self.handler.limits)
        except NonDeterministic:
            raise
        except EntityConflict:
            pass  # the same definition: the entity the workflow issued before

    async def _wait(self, view: _View, decision: WaitUntil, now: datetime) -> bool:
        snapshot = view.snapshot
        create = CreateWait(wait_id=decision.wait_id, resume_at=decision.resume_at)
        wait = snapshot.waits.get(decision.wait_id)
        if wait is None:
            return await self._act(view, create, repr(decision))
        self._same_definition(snapshot, create, now)
        if wait.status != "waiting":
            raise InvalidDecision(
                f"wait {wait.wait_id!r} of run {snapshot.run_id!r} is already {wait.status}: a "
                "workflow moves on from a finished wait (cleanup after a cancellation needs new "
                "ids)",
                run_id=snapshot.run_id,
            )
        if wait.resume_at <= now:
            return await self._act(view, CompleteWait(wait_id=wait.wait_id), repr(decision))
        return False

    async def _hook(self, invocation: WorkflowInvocation, view: _View, decision: AwaitHook) -> bool:
        snapshot = view.snapshot
        hook = snapshot.hooks.get(decision.hook_id)
        if hook is None:
            holder = invocation.hook_conflict(decision.hook_id)
            if holder is not None:
                raise InvalidDecision(
                    f"hook {decision.hook_id!r} of run {snapshot.run_id!r} was not created: run "
                    f"{holder!r} held its token; the workflow must use another hook or end the run",
                    run_id=snapshot.run_id,
                )
            command = CreateHook(
                hook_id=decision.hook_id,
                token=decision.token,
                metadata=decision.metadata,
                is_webhook=decision.is_webhook,
                retain_token_until=decision.retain_token_until,
            )
            return await self._act(view, command, repr(decision))
        recorded = (hook.token, hook.metadata, hook.is_webhook, hook.retain_token_until)
        if recorded != (
            decision.token,
            decision.metadata,
            decision.is_webhook,
            decision.retain_token_until,
        ):
            raise NonDeterministic(
                f"hook {hook.hook_id!r} already exists in run {snapshot.run_id!r} with another "
                "definition",
                run_id=snapshot.run_id,
            )
        if hook.status != "active":
            raise InvalidDecision(
                f"hook {hook.hook_id!r} of run {snapshot.run_id!r} is already {hook.status}: a "
                "workflow moves on from a finished hook (cleanup after a cancellation needs new "
                "ids)",
                run_id=snapshot.run_id,
            )
        return False

    # --- steps --------------------------------------------------------------------------------

    async def _schedule(self, view: _View, calls: Sequence[ScheduleStep], now: datetime) -> bool:
        """Run the steps of one decision that can run now, concurrently; False when none can
        (each waits for a delayed retry or is being run by this engine already)."""
        snapshot = view.snapshot
        run_id = snapshot.run_id
        if not calls:
            raise InvalidDecision("ScheduleSteps needs at least one step", run_id=run_id)
        chosen: list[tuple[ScheduleStep, StepState | None]] = []
        seen: set[str] = set()
        waiting = False
        for call in calls:
            if call.step_id in seen:
                raise InvalidDecision(
                    f"step {call.step_id!r} is scheduled twice in one decision", run_id=run_id
                )
            seen.add(call.step_id)
            step = snapshot.steps.get(call.step_id)
            if step is not None:
                create = CreateStep(
                    step_id=call.step_id,
                    step_name=call.step_name,
                    input=call.input,
                    retry=call.retry,
                )
                self._same_definition(snapshot, create, now)
                if step.status not in ("pending", "running"):
                    continue
                delayed = step.retry_after is not None and step.retry_after > now
                if delayed or (run_id, call.step_id) in self._in_flight:
                    waiting = True
                    continue
            chosen.append((call, step))
        if not chosen:
            if waiting:
                return False
            raise InvalidDecision(
                f"the workflow of run {run_id!r} scheduled only finished steps "
                f"({', '.join(sorted(seen))}): it must move on with their outcomes",
                run_id=run_id,
            )
        # Claimed before the first await, so a concurrent drive of this engine leaves them be.
        claimed = {(run_id, call.step_id) for call, _ in chosen}
        self._in_flight.update(claimed)
        writing = asyncio.Lock()  # the batch's appends go one at a time: no self-made conflicts
        try:
            results = await asyncio.gather(
                *(self._attempt(run_id, call, step, writing) for call, step in chosen),
                return_exceptions=True,
            )
        finally:
            self._in_flight.difference_update(claimed)
        errors = [r for r in results if isinstance(r, BaseException)]
        for extra in errors[1:]:
            _log.error("another step of run %r failed to record as well: %r", run_id, extra)
        if errors:
            raise errors[0]
        return True

    async def _attempt(
        self, run_id: str, call: ScheduleStep, step: StepState | None, writing: asyncio.Lock
    ) -> None:
        """Start one attempt of a step (creating the step on first use), run its body, record
        the outcome. A step found running that this engine is not running was interrupted (a
        crash): it gets a new attempt."""
        lazy = None
        if step is None:
            lazy = LazyStep(step_name=call.step_name, input=call.input, retry=call.retry)
        try:
            async with writing:
                outcome = await self._execute(run_id, StartStep(step_id=call.step_id, lazy=lazy))
        except Rejection:
            if await self._moved(run_id, call.step_id, _step_key(step)):
                return  # another writer created, started or finished it first
            raise
        state = outcome.snapshot.steps[call.step_id]
        invocation = StepInvocation(
            run_id=run_id,
            step_id=state.step_id,
            step_name=state.step_name,
            input=state.input,
            attempt=state.attempt,
            previous_error=state.error,
        )
        try:
            output = await self.runtime.run_step(invocation)
        except Exception as exc:
            result = self._after_failure(run_id, state, exc)
        else:
            result = CompleteStep(step_id=state.step_id, output=output)
        try:
            async with writing:
                await self._execute(run_id, result)
        except Rejection:
            if await self._moved(run_id, state.step_id, ("running", state.attempt)):
                _log.debug("outcome of step %r of run %r was superseded", state.step_id, run_id)
                return
            raise

    def _after_failure(self, run_id: str, step: StepState, exc: Exception) -> Command:
        """The command recording a failed attempt: a delayed retry while the step's policy
        allows one, else the step's failure."""
        if isinstance(exc, StepFailure):
            error, code, retryable = exc.error, exc.code, exc.retryable
        else:
            error, code, retryable = _describe(exc), type(exc).__name__, True
        policy = step.retry if step.retry is not None else DEFAULT_RETRY
        if code is not None and code in policy.non_retryable_error_codes:
            retryable = False
        if not retryable or step.attempt >= policy.max_attempts:
            return FailStep(step_id=step.step_id, error=error, retryable=retryable)
        delay = retry_delay(
            policy, run_id=run_id, step_id=step.step_id, attempt=step.attempt, jitter=self.jitter
        )
        failed_at = self.handler.clock()
        return RetryStep(step_id=step.step_id, error=error, retry_after=failed_at + delay)

    async def _moved(self, run_id: str, step_id: str, before: tuple[str, int] | None) -> bool:
        """Whether the run ended or the step left the state `before` (status, attempt)."""
        snapshot = await self.handler.snapshot(run_id)
        return snapshot.is_terminal or _step_key(snapshot.steps.get(step_id)) != before

    # --- plumbing -----------------------------------------------------------------------------

    async def _settle(self, run_id: str, command: Command) -> None:
        """Execute a command that may have been made moot by someone else (a wait completed,
        a run ended); such a refusal is not an error here."""
        try:
            await self._execute(run_id, command)
        except (EntityConflict, TerminalState, RunExpired) as exc:
            _log.debug("%s on run %r was already settled: %s", type(command).__name__, run_id, exc)

    async def _execute(
        self, run_id: str, command: Command, *, known_sequence: int | None = None
    ) -> Outcome:
        outcome = await self.handler.execute(run_id, command, known_sequence=known_sequence)
        await self._notify(outcome.appended)
        return outcome

    async def _notify(self, envelopes: Sequence[Envelope]) -> None:
        for envelope in envelopes:
            for observer in self.observers:
                try:
                    await observer.on_event(envelope)
                except Exception:
                    _log.exception(
                        "observer %r failed on event %d of run %r; the run goes on",
                        observer,
                        envelope.sequence,
                        envelope.run_id,
                    )
