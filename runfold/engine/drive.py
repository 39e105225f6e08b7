"""One drive of one run: ask the workflow, record its decisions, run its steps.

This is the loop behind `Engine.drive`, built of pieces a reader finds by name:

- `Journal` (`runfold.engine.journal`): what the drive decided and has not appended yet, decided
  at once by the kernel on a provisional snapshot and appended together at the last moment that
  keeps the durability contract: before a step body runs, when the run waits, and when it ends.
  So a sequential workflow commits once per step, the outcome of step N with the start of step
  N+1, and the run's creation goes with its first decision. A crash between two appends loses
  only decisions that the next drive makes again, since the workflow is deterministic.
- `Custody` (`runfold.engine.custody`): for a worker of a fleet, the claim of the run before
  the first decision and its release when the run waits.
- `StepRunner` (`runfold.engine.steps`): the starts, bodies and outcomes of steps.
- `Drive`, here: the loop that asks the workflow and hands each decision to one of them.
"""

from __future__ import annotations

import itertools
import logging
from datetime import timedelta

import attrs

from runfold.engine.custody import Custody
from runfold.engine.errors import InvalidDecision, ReplayLimitExceeded
from runfold.engine.journal import Execute, Journal, Notify, StepsInFlight
from runfold.engine.lease import Lease
from runfold.engine.raised import as_failure, is_code_failure
from runfold.engine.runtime import (
    AwaitHook,
    Cancel,
    CloseHook,
    Complete,
    Fail,
    LinkChildOperation,
    ReportProgress,
    ScheduleStep,
    ScheduleSteps,
    TimeOut,
    UpdateAttributes,
    WaitUntil,
    WorkflowInvocation,
    WorkflowRuntime,
)
from runfold.engine.steps import StepRunner
from runfold.handler import CommandHandler
from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
    CancelRun,
    Command,
    CompleteRun,
    CompleteWait,
    CreateHook,
    CreateWait,
    DisposeHook,
    FailRun,
    HistoryLimitExceeded,
    LinkChild,
    NonDeterministic,
    OwnershipLost,
    RecordProgress,
    RunOwned,
    SetAttributes,
    Snapshot,
    StartRun,
    StoreError,
    TimeOutRun,
)
from runfold.kernel.fast import fast_init

__all__ = ["Drive", "DriveSetup"]

_log = logging.getLogger("runfold.engine")


@fast_init  # made for every drive
@attrs.frozen(kw_only=True)
class DriveSetup:
    """What a drive takes from its engine.

    The handler, the runtime, how to append and whom to tell (the observers, if any), the steps
    in flight, the worker's lease, and the engine's settings.
    """

    handler: CommandHandler
    runtime: WorkflowRuntime
    execute: Execute
    notify: Notify | None
    in_flight: StepsInFlight
    lease: Lease | None
    max_replay_iterations: int | None
    step_timeout: timedelta | None
    jitter: float


class Drive:
    """One run driven until it ends or waits."""

    __slots__ = ("custody", "journal", "run_id", "setup", "steps")

    def __init__(
        self,
        setup: DriveSetup,
        run_id: str,
        durable: Snapshot | None,
        pending: tuple[Command, ...] = (),
        *,
        displacing: str | None = None,
    ) -> None:
        self.setup = setup
        self.run_id = run_id
        self.journal = Journal(
            run_id,
            durable,
            handler=setup.handler,
            execute=setup.execute,
            notify=setup.notify,
            in_flight=setup.in_flight,
            lease=setup.lease,
        )
        self.custody = (
            Custody(self.journal, setup.lease, displacing) if setup.lease is not None else None
        )
        self.steps = StepRunner(
            self.journal, setup.runtime, step_timeout=setup.step_timeout, jitter=setup.jitter
        )
        for command in pending:
            self.journal.propose(command)

    async def run(self) -> Snapshot:
        """Drive until the run ends or waits, and return it as stored."""
        journal, custody = self.journal, self.custody
        try:
            bound = self.setup.max_replay_iterations  # None: until it ends or waits
            for _ in range(bound) if bound is not None else itertools.count():
                view = journal.view
                if view is not None and view.status in TERMINAL_RUN_STATUSES:  # `is_terminal`
                    if await journal.flush() == "shown":
                        return journal.snapshot
                    continue
                if custody is not None:
                    custody.own()
                try:
                    moved = await self.advance()
                except (InvalidDecision, HistoryLimitExceeded) as exc:
                    moved = journal.fail_run(exc)  # the workflow's mistake: asking again is no use
                if moved:
                    continue
                if custody is not None:
                    custody.let_go()
                if await journal.flush() == "shown":  # it waits: what led there is recorded
                    return journal.snapshot
            await journal.flush()
            raise ReplayLimitExceeded(
                f"run {self.run_id!r} neither ended nor suspended after "
                f"{bound} decisions; drive it again to continue",
                run_id=self.run_id,
            )
        except Exception as exc:
            # What the workflow decided before its failure stands: record it, so driving again
            # continues after it (a step's outcome is not lost to a later bug). A store that
            # failed is not asked again: whether it wrote is for the next drive to see.
            if journal.pending and not isinstance(exc, StoreError | OwnershipLost | RunOwned):
                try:
                    await journal.flush()
                except Exception:
                    _log.exception("recording the decisions of run %r failed", self.run_id)
            raise
        finally:
            journal.let_go(journal.held)

    async def advance(self) -> bool:
        """Take the run one decision further; False when it waits."""
        journal = self.journal
        view = journal.view  # `journal.snapshot`, without the property's call
        assert view is not None
        deadline = view.deadline
        if deadline is not None and deadline <= journal.clock():
            return await journal.record(
                TimeOutRun(deadline=deadline, reason="deadline passed"), "the deadline"
            )
        if view.status == "pending":
            return await journal.record(StartRun(), "starting the run")
        try:
            decision = await self.setup.runtime.run_workflow(WorkflowInvocation(snapshot=view))
        except BaseException as exc:  # SystemExit and the like: an error to report, not an exit
            if isinstance(exc, Exception) or not is_code_failure(exc):
                raise
            raise as_failure(exc, run_id=self.run_id, where="run_workflow") from exc
        command: Command
        match decision:
            case ScheduleStep():
                return await self.steps.schedule_one(decision)
            case ScheduleSteps():
                return await self.steps.schedule(decision.steps)
            case WaitUntil():
                return await self.wait(decision)
            case AwaitHook():
                return await self.hook(decision)
            case Complete():
                command = CompleteRun(output=decision.output)
            case Fail():
                command = FailRun(error=decision.error, error_code=decision.error_code)
            case Cancel():
                if view.cancellation is None:
                    raise InvalidDecision(
                        f"the workflow cancelled run {self.run_id!r}, but no cancellation "
                        "was requested",
                        run_id=self.run_id,
                    )
                command = CancelRun(reason=view.cancellation.reason)
            case TimeOut():
                at = deadline if deadline is not None else journal.clock()
                command = TimeOutRun(deadline=at, reason=decision.reason)
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
                command = SetAttributes(
                    changes=decision.changes,
                    write_id=decision.write_id,
                    allow_reserved=decision.reserved,
                )
            case CloseHook():
                command = DisposeHook(hook_id=decision.hook_id)
            case _:
                raise InvalidDecision(
                    f"run_workflow returned {decision!r}, which is not a RuntimeDecision",
                    run_id=self.run_id,
                )
        return await journal.record(command, repr(decision))

    # --- waits and hooks ----------------------------------------------------------------------

    async def wait(self, decision: WaitUntil) -> bool:
        """Create the wait on first use, complete it once due; False while it is not."""
        journal = self.journal
        view = journal.snapshot
        now = journal.clock()
        create = CreateWait(wait_id=decision.wait_id, resume_at=decision.resume_at)
        wait = view.waits.get(decision.wait_id)
        if wait is None:
            return await journal.record(create, repr(decision))
        journal.same_definition(create, now)
        if wait.status != "waiting":
            raise InvalidDecision(
                f"wait {wait.wait_id!r} of run {self.run_id!r} is already {wait.status}: a "
                "workflow moves on from a finished wait (cleanup after a cancellation needs new "
                "ids)",
                run_id=self.run_id,
            )
        if wait.resume_at <= now:
            return await journal.record(CompleteWait(wait_id=wait.wait_id), repr(decision))
        return False

    async def hook(self, decision: AwaitHook) -> bool:
        """Create the hook on first use; False while it waits for a delivery."""
        view = self.journal.snapshot
        hook = view.hooks.get(decision.hook_id)
        if hook is None:
            conflict = view.hook_conflicts.get(decision.hook_id)
            if conflict is not None:
                raise InvalidDecision(
                    f"hook {decision.hook_id!r} of run {self.run_id!r} was not created: run "
                    f"{conflict.holder_run_id!r} held its token; the workflow must use another "
                    "hook or end the run",
                    run_id=self.run_id,
                )
            command = CreateHook(
                hook_id=decision.hook_id,
                token=decision.token,
                metadata=decision.metadata,
                is_webhook=decision.is_webhook,
                retain_token_until=decision.retain_token_until,
            )
            return await self.journal.record(command, repr(decision))
        recorded = (hook.token, hook.metadata, hook.is_webhook, hook.retain_token_until)
        if recorded != (
            decision.token,
            decision.metadata,
            decision.is_webhook,
            decision.retain_token_until,
        ):
            raise NonDeterministic(
                f"hook {hook.hook_id!r} already exists in run {self.run_id!r} with another "
                "definition",
                run_id=self.run_id,
            )
        if hook.status != "active":
            raise InvalidDecision(
                f"hook {hook.hook_id!r} of run {self.run_id!r} is already {hook.status}: a "
                "workflow moves on from a finished hook (cleanup after a cancellation needs new "
                "ids)",
                run_id=self.run_id,
            )
        return False
