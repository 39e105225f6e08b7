"""One drive of one run: ask the workflow, record its decisions, run its steps.

This is the loop behind `Engine.drive`. The commands a workflow's decisions make are decided at
once, by the kernel, on a provisional snapshot (the durable run and what is pending), and are
appended together at the last moment that keeps the durability contract: before a step body
runs (its start must be durable first), when the run waits, and when it ends. So a sequential
workflow commits once per step, the outcome of step N with the start of step N+1, and the run's
creation goes with its first decision. A crash between two appends loses only decisions that the
next drive makes again, since the workflow is deterministic.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

from runfold.engine.errors import InvalidDecision, ReplayLimitExceeded, RunDefinitionConflict
from runfold.engine.raised import as_failure, error_payload, is_code_failure, unrecordable
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
)
from runfold.engine.steps import StepRunner
from runfold.kernel import (
    BatchDecision,
    CancelRun,
    ClaimRun,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateWait,
    DisposeHook,
    EntityConflict,
    Event,
    FailRun,
    FailStep,
    HistoryLimitExceeded,
    InvalidCommand,
    LinkChild,
    NonDeterministic,
    Ownership,
    OwnershipLost,
    RecordProgress,
    Rejection,
    ReleaseRun,
    RetryStep,
    RunOwned,
    SetAttributes,
    Snapshot,
    StartRun,
    StoreError,
    TimeOutRun,
    decide,
    decide_many,
    join_decisions,
)

if TYPE_CHECKING:
    from runfold.engine.engine import Engine

__all__ = ["Drive"]

_log = logging.getLogger("runfold.engine")
_OUTCOMES = (CompleteStep, RetryStep, FailStep)

Flushed: TypeAlias = Literal["shown", "moved", "refused"]
"""How `Drive.flush` went (see there)."""


class Drive(StepRunner):
    """One run driven until it ends or waits.

    It holds the durable snapshot, what is pending on it, and the provisional snapshot the
    workflow is shown (the two together).
    """

    __slots__ = (
        "at",
        "claims",
        "created",
        "decision",
        "displacing",
        "durable",
        "engine",
        "ownership",
        "pending",
        "proposed",
        "run_id",
        "view",
    )

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        durable: Snapshot | None,
        pending: Sequence[Command] = (),
        *,
        displacing: str | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        self.durable = durable
        self.view = durable
        self.pending: list[Command] = []
        self.proposed: list[Event] = []  # what the pending commands decided on the view
        self.created: list[str] = []  # the steps their lazy starts created
        self.at: datetime | None = None  # when they were decided: the append's decision time
        self.claims: set[str] = set()  # step ids this drive runs or holds an outcome of
        self.ownership: Ownership | None = None  # the claim of the engine's worker it acts on
        self.displacing = displacing  # the lapsed owner its claim may take the run from
        self.decision: BatchDecision | None = None  # the kernel's decision of what is pending
        for command in pending:
            self.propose(command)

    # --- the loop -----------------------------------------------------------------------------

    async def run(self) -> Snapshot:
        """Drive until the run ends or waits, and return it as stored."""
        try:
            bound = self.engine.max_replay_iterations  # None: until it ends or waits
            for _ in range(bound) if bound is not None else itertools.count():
                view = self.view
                if view is not None and view.is_terminal:
                    if await self.flush() == "shown":
                        return self.snapshot
                    continue
                if self.engine.lease is not None:
                    self.own()
                try:
                    moved = await self.advance()
                except (InvalidDecision, HistoryLimitExceeded) as exc:
                    moved = self.fail_run(exc)  # the workflow's mistake: asking again is no use
                if moved:
                    continue
                self.let_go()
                if await self.flush() == "shown":  # it waits: what led there is recorded
                    return self.snapshot
            await self.flush()
            raise ReplayLimitExceeded(
                f"run {self.run_id!r} neither ended nor suspended after "
                f"{bound} decisions; drive it again to continue",
                run_id=self.run_id,
            )
        except Exception as exc:
            # What the workflow decided before its failure stands: record it, so driving again
            # continues after it (a step's outcome is not lost to a later bug). A store that
            # failed is not asked again: whether it wrote is for the next drive to see.
            if self.pending and not isinstance(exc, StoreError | OwnershipLost | RunOwned):
                try:
                    await self.flush()
                except Exception:
                    _log.exception("recording the decisions of run %r failed", self.run_id)
            raise
        finally:
            self.engine.release(self.run_id, self.claims)

    @property
    def snapshot(self) -> Snapshot:
        """The provisional snapshot (the durable one once nothing is pending)."""
        assert self.view is not None
        return self.view

    async def advance(self) -> bool:
        """Take the run one decision further; False when it waits."""
        view = self.snapshot
        now = self.engine.handler.clock()
        if view.deadline is not None and view.deadline <= now:
            return await self.record(
                TimeOutRun(deadline=view.deadline, reason="deadline passed"), "the deadline"
            )
        if view.status == "pending":
            return await self.record(StartRun(), "starting the run")
        try:
            decision = await self.engine.runtime.run_workflow(WorkflowInvocation(snapshot=view))
        except BaseException as exc:  # SystemExit and the like: an error to report, not an exit
            if isinstance(exc, Exception) or not is_code_failure(exc):
                raise
            raise as_failure(exc, run_id=self.run_id, where="run_workflow") from exc
        command: Command
        match decision:
            case ScheduleStep():
                return await self.schedule((decision,), now)
            case ScheduleSteps():
                return await self.schedule(decision.steps, now)
            case WaitUntil():
                return await self.wait(decision, now)
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
                deadline = view.deadline if view.deadline is not None else now
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
        return await self.record(command, repr(decision))

    # --- pending commands ---------------------------------------------------------------------

    def propose(self, command: Command) -> bool:
        """Decide `command` on the provisional snapshot and add it to what is pending.

        Returns False when it changes nothing.

        Raises:
            Rejection: The kernel refused it on the provisional snapshot.
        """
        at = self.at if self.at is not None else self.engine.handler.clock()
        batch = decide_many(
            self.view,
            (command,),
            now=at,
            limits=self.engine.handler.limits,
            run_id=self.run_id,
            acting_as=self.ownership,
        )
        if not batch.events:
            return False
        self.at = at
        self.decision = batch if self.decision is None else join_decisions(self.decision, batch)
        self.pending.append(command)
        self.proposed.extend(batch.events)
        self.created.extend(batch.created_steps)
        self.view = batch.snapshot
        return True

    async def record(self, command: Command, what: str) -> bool:
        """Propose `command` for the decision `what`; True when the run moved.

        A refusal (or a command that changes nothing) on a view that others have moved past
        means "look again"; on the freshest view it is the workflow's to bear and is raised:
        asking again would give the same answer forever.
        """
        try:
            if self.propose(command):
                return True
        except Rejection as exc:
            if await self.moved_on():
                return True
            if isinstance(exc, InvalidCommand):  # the decision itself is malformed
                raise unrecordable(what, exc, self.run_id) from exc
            raise
        if await self.moved_on():
            return True
        raise InvalidDecision(
            f"{what} changed nothing on run {self.run_id!r}: the workflow would be asked the "
            "same question again",
            run_id=self.run_id,
        )

    def fail_run(self, exc: InvalidDecision | HistoryLimitExceeded) -> bool:
        """Propose the run's failure with `exc`, a decision that can never be recorded.

        Raises `exc` itself if even the failure cannot be (the run ended meanwhile, say).
        """
        failure = FailRun(error=error_payload(exc), error_code=type(exc).__name__)
        try:
            return self.propose(failure)
        except Rejection:
            raise exc from None

    async def flush(self) -> Flushed:
        """Append what is pending in one batch.

        Returns "shown" when the run is now what the view said; "moved" when the batch went in
        but others had appended first or the store decided otherwise (a hook token held
        elsewhere); "refused" when the stored run refused a command (others moved it): what
        came before that command went in, the rest did not. Either way but "shown", the
        workflow must look again.
        """
        if not self.pending:
            return "shown"
        commands = tuple(self.pending)
        proposed = list(self.proposed)
        decided = self.decision  # what the handler would decide again on the same snapshot
        self.check_lease()
        try:
            outcome = await self.engine.execute(
                self.run_id,
                commands,
                known_sequence=self.durable.last_sequence if self.durable is not None else None,
                now=self.at,
                decided=decided,
                acting_as=self.ownership,
            )
        except OwnershipLost:
            raise
        except Rejection as exc:
            await self.refused(commands, exc)
            return "refused"
        self.settle(commands, outcome.snapshot)
        if outcome.missed or len(outcome.appended) != len(proposed):
            return "moved"
        # The handler appends the proposed events themselves when it decided nothing anew, so
        # identity settles the common case before any field is compared.
        for envelope, event in zip(outcome.appended, proposed, strict=True):
            if envelope.event is not event and envelope.event != event:
                return "moved"
        return "shown"

    def settle(self, commands: Sequence[Command], durable: Snapshot) -> None:
        """The pending `commands` are durable: `durable` is the run now."""
        self.pending.clear()
        self.proposed.clear()
        self.created.clear()
        self.decision = None
        self.at = None
        self.durable = self.view = durable
        done = {c.step_id for c in commands if isinstance(c, _OUTCOMES)}
        if done & self.claims:
            self.engine.release(self.run_id, done & self.claims)
            self.claims -= done

    async def refused(self, commands: Sequence[Command], exc: Rejection) -> None:
        """Handle the stored run's refusal of command `exc.command_index` of a pending batch.

        The view took it, so others moved the run (the kernel decides alike on both). What came
        before that command is recorded; the rest is dropped, and the view becomes the stored
        run, for the workflow to decide again on it.
        """
        place = exc.command_index
        refused = commands[place]
        if isinstance(refused, StartRun) and isinstance(exc, NonDeterministic):
            raise RunDefinitionConflict(
                f"run {self.run_id!r} already exists with another definition", run_id=self.run_id
            ) from exc
        _log.debug("run %r moved on under %s: %s", self.run_id, type(refused).__name__, exc)
        while place > 0:  # the run may keep moving: each try keeps what still stands
            try:
                outcome = await self.engine.execute(
                    self.run_id, commands[:place], now=self.at, acting_as=self.ownership
                )
            except Rejection as again:
                place = again.command_index
                continue
            self.settle(commands[:place], outcome.snapshot)
            return
        self.pending.clear()
        self.proposed.clear()
        self.created.clear()
        self.decision = None
        self.at = None
        self.durable = self.view = await self.engine.handler.snapshot(self.run_id)

    async def moved_on(self) -> bool:
        """Record what is pending, then tell whether others moved the stored run.

        True (and the view is then the stored run) if others appended since the workflow was
        shown the view.
        """
        if self.pending and await self.flush() != "shown":
            return True
        before = self.durable.last_sequence if self.durable is not None else 0
        fresh = await self.engine.handler.lookup(self.run_id)
        if fresh is None or fresh.last_sequence <= before:
            return False
        self.durable = self.view = fresh
        return True

    # --- ownership ----------------------------------------------------------------------------

    def own(self) -> None:
        """Make the run the engine's worker's own before deciding on it (its claim is pending).

        A run the view shows owned by the worker under the claim this drive acts on needs
        nothing; one it owns under an earlier claim of this process is adopted; a free one is
        claimed, and one whose owner this drive was sent to displace is taken over.

        Raises:
            RunOwned: Another worker owns the run.
        """
        lease = self.engine.lease
        assert lease is not None
        owner = self.snapshot.owner
        if owner is not None and owner.owner_id == lease.worker_id:
            self.ownership = owner
            return
        self.ownership = None
        self.propose(ClaimRun(owner_id=lease.worker_id, displacing=self.displacing))
        self.ownership = self.snapshot.owner

    def let_go(self) -> None:
        """The run waits: release it with what is pending (another worker resumes it when due).

        A claim of a free run that is all that is pending is dropped instead: nothing happened,
        so nothing is written. A claim that displaced a lapsed owner is written with its release,
        or the run would stay the dead owner's orphan. The drive keeps acting as the owner until
        what is pending is appended, so that append is fenced like every other; a run that
        another drive of this engine is running a step of stays claimed: that drive releases it.
        """
        view = self.snapshot
        if self.ownership is None or not view.is_live:
            return
        running = self.engine.running
        if any(s not in self.claims and running(self.run_id, s) for s in view.live_step_ids):
            return
        free = self.durable is None or self.durable.owner is None
        if free and len(self.pending) == 1 and isinstance(self.pending[0], ClaimRun):
            self.pending.clear()
            self.proposed.clear()
            self.created.clear()
            self.at = None
            self.decision = None
            self.view = self.durable
            self.ownership = None
        else:
            self.propose(ReleaseRun(owner_id=self.ownership.owner_id))

    def check_lease(self) -> None:
        """Refuse to write for a worker whose lease no longer holds by this process's clock.

        Raises:
            OwnershipLost: The lease lapsed (the process was paused or cut off too long).
        """
        lease = self.engine.lease
        if self.ownership is not None and lease is not None and not lease.holds():
            raise OwnershipLost(
                f"worker {lease.worker_id!r} let its lease lapse: it records nothing more on run "
                f"{self.run_id!r}",
                run_id=self.run_id,
            )

    # --- waits and hooks ----------------------------------------------------------------------

    def same_definition(self, command: Command, now: datetime) -> None:
        """Raise the kernel's `NonDeterministic` if `command` redefines an existing entity."""
        try:
            decide(self.view, command, now=now, limits=self.engine.handler.limits)
        except NonDeterministic:
            raise
        except EntityConflict:
            pass  # the same definition: the entity the workflow issued before

    async def wait(self, decision: WaitUntil, now: datetime) -> bool:
        """Create the wait on first use, complete it once due; False while it is not."""
        view = self.snapshot
        create = CreateWait(wait_id=decision.wait_id, resume_at=decision.resume_at)
        wait = view.waits.get(decision.wait_id)
        if wait is None:
            return await self.record(create, repr(decision))
        self.same_definition(create, now)
        if wait.status != "waiting":
            raise InvalidDecision(
                f"wait {wait.wait_id!r} of run {self.run_id!r} is already {wait.status}: a "
                "workflow moves on from a finished wait (cleanup after a cancellation needs new "
                "ids)",
                run_id=self.run_id,
            )
        if wait.resume_at <= now:
            return await self.record(CompleteWait(wait_id=wait.wait_id), repr(decision))
        return False

    async def hook(self, decision: AwaitHook) -> bool:
        """Create the hook on first use; False while it waits for a delivery."""
        view = self.snapshot
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
            return await self.record(command, repr(decision))
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
