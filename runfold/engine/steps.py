"""How a drive runs a run's steps: start them in one append, run their bodies, record outcomes.

`StepRunner` is the piece of a drive (`runfold.engine.drive.Drive`) about steps: it proposes
their starts and outcomes on the drive's `Journal` and runs their bodies through the runtime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator, Sequence
from datetime import timedelta
from typing import Any

from runfold.engine.errors import InvalidDecision, StepTimedOut
from runfold.engine.journal import Journal
from runfold.engine.raised import as_failure, error_payload, is_code_failure, unrecordable
from runfold.engine.retry import DEFAULT_RETRY, retry_delay
from runfold.engine.runtime import ScheduleStep, StepFailure, StepInvocation, WorkflowRuntime
from runfold.kernel import (
    Command,
    CompleteStep,
    CreateStep,
    FailStep,
    InvalidCommand,
    LazyStep,
    Rejection,
    RetryPolicy,
    RetryStep,
    StartStep,
    StepState,
)

__all__ = ["StepRunner", "describe"]

_log = logging.getLogger("runfold.engine")


def _changed_policy(step: StepState, call: ScheduleStep) -> RetryPolicy | None:
    """The policy `call` gives an existing step when it differs from the recorded one, else None.

    A step without a policy follows `DEFAULT_RETRY`, so None on either side means that one:
    going back to the default records it explicitly.
    """
    recorded = step.retry if step.retry is not None else DEFAULT_RETRY
    wanted = call.retry if call.retry is not None else DEFAULT_RETRY
    return None if wanted == recorded else wanted


def _numeric(step_id: str) -> tuple[int, str]:
    """A sort key putting step ids that are numbers in numeric order (call ids), then others."""
    return (int(step_id), "") if step_id.isdigit() else (1 << 62, step_id)


def describe(exc: BaseException) -> bytes:
    """An exception as a step's error payload: its class and message, bounded.

    Any message is recorded: a lone surrogate as its escape, a `__str__` that raises as a note.
    """
    return error_payload(exc)


class _Resumed:
    """Awaits the rest of a body whose first step already ran and suspended on `yielded`.

    A body that returns without suspending (most of them, on a quick store) is run to its end
    by that first step, outside any timeout scope: the scope, its timer and its entry and exit
    cost a step nothing until the body waits on something (`StepRunner.body`).
    """

    __slots__ = ("it", "yielded")

    def __init__(self, it: Generator[Any, Any, bytes], yielded: Any) -> None:
        self.it = it
        self.yielded = yielded

    def __await__(self) -> Generator[Any, Any, bytes]:
        it, yielded = self.it, self.yielded
        while True:  # `yield from it`, its first value already taken
            try:
                sent = yield yielded
            except GeneratorExit:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:
                try:
                    yielded = it.throw(exc)
                except StopIteration as stop:
                    result: bytes = stop.value
                    return result
            else:
                try:
                    yielded = it.send(sent)
                except StopIteration as stop:
                    result = stop.value
                    return result


class StepRunner:
    """Runs the steps a workflow schedules on a drive's journal: starts, bodies, outcomes."""

    __slots__ = ("jitter", "journal", "run_id", "runtime", "step_timeout")

    def __init__(
        self,
        journal: Journal,
        runtime: WorkflowRuntime,
        *,
        step_timeout: timedelta | None,
        jitter: float,
    ) -> None:
        self.journal = journal
        self.run_id = journal.run_id
        self.runtime = runtime
        self.step_timeout = step_timeout
        self.jitter = jitter

    async def schedule(self, calls: Sequence[ScheduleStep]) -> bool:
        """Start the steps of one decision that can run now, run their bodies, record outcomes.

        The starts go in one append, the bodies run concurrently. Returns False when none can
        run (each waits for a delayed retry or is being run by this engine already).
        """
        journal = self.journal
        run_id = self.run_id
        chosen, exhausted, waiting = self._choose(calls)
        if exhausted:  # failed for good: the workflow looks again first
            for failure in exhausted:
                await journal.record(failure, repr(failure))
            return True
        if not chosen:
            if waiting:
                return False
            raise InvalidDecision(
                f"the workflow of run {run_id!r} scheduled only finished steps "
                f"({', '.join(sorted(call.step_id for call in calls))}): it must move on "
                "with their outcomes",
                run_id=run_id,
            )
        ids = [call.step_id for call, _ in chosen]
        # Claimed before the first await, so a concurrent drive of this engine leaves them be.
        journal.hold(ids)
        for call, step in chosen:
            if step is None:
                lazy = LazyStep(step_name=call.step_name, input=call.input, retry=call.retry)
                start = StartStep(step_id=call.step_id, lazy=lazy)
            else:
                start = StartStep(step_id=call.step_id, retry=_changed_policy(step, call))
            try:
                journal.propose(start)
            except Rejection as exc:
                return await self._start_refused(exc, call, ids)
        # The starts are durable before any body runs. Refused, they are not ours to run.
        if await journal.flush() == "refused":
            journal.let_go(ids)
            return True
        steps = journal.snapshot.steps
        if len(chosen) == 1:  # no task to spawn for the common case
            call = chosen[0][0]
            step = steps[call.step_id]
            command = await self.body(step, call.timeout)
            try:
                journal.propose(command)  # pending, to go with the workflow's next decision
            except Rejection:
                await self.outcome(step, command, commit=False)
            return True
        await self.run_bodies([(steps[call.step_id], call.timeout) for call, _ in chosen])
        return True

    async def schedule_one(self, call: ScheduleStep) -> bool:
        """`schedule` of one step: the usual one, which the run has not seen, the shortest way."""
        journal = self.journal
        step_id = call.step_id
        view = journal.view
        assert view is not None
        if view.steps.get(step_id) is not None:  # a retry, a step run before: as usual
            return await self.schedule((call,))
        journal.hold_one(step_id)
        lazy = LazyStep(step_name=call.step_name, input=call.input, retry=call.retry)
        try:
            journal.propose(StartStep(step_id=step_id, lazy=lazy))
        except Rejection as exc:
            return await self._start_refused(exc, call, (step_id,))
        flushed = await journal.flush()
        if flushed == "refused":
            journal.let_go((step_id,))
            return True
        # Shown, the step is as started here (attempt 1): its state is read only if needed.
        step = journal.snapshot.steps[step_id] if flushed != "shown" else None
        command = await self.body(step, call.timeout, call)
        try:
            journal.propose(command)  # pending, to go with the workflow's next decision
        except Rejection:
            await self.outcome(journal.snapshot.steps[step_id], command, commit=False)
        return True

    async def _start_refused(self, exc: Rejection, call: ScheduleStep, ids: Sequence[str]) -> bool:
        """After the kernel refused the start of `call`'s step: let the steps `ids` go, and
        look again if others moved the run, else raise."""
        journal = self.journal
        journal.let_go(ids)
        if await journal.moved_on():
            return True  # another writer created, started or finished it first
        if isinstance(exc, InvalidCommand):  # a name, an input the kernel refuses
            raise unrecordable(repr(call), exc, self.run_id) from exc
        raise exc

    def _choose(
        self, calls: Sequence[ScheduleStep]
    ) -> tuple[list[tuple[ScheduleStep, StepState | None]], list[Command], bool]:
        """The calls to start now (with their step records), the failures of steps that have no
        attempt left, and whether any call waits (a delayed retry, a body run elsewhere)."""
        journal = self.journal
        view = journal.snapshot
        run_id = self.run_id
        if not calls:
            raise InvalidDecision("ScheduleSteps needs at least one step", run_id=run_id)
        chosen: list[tuple[ScheduleStep, StepState | None]] = []
        seen: set[str] = set()
        exhausted: list[Command] = []
        waiting = False
        now = journal.clock()
        for call in calls:
            if call.step_id in seen:
                raise InvalidDecision(
                    f"step {call.step_id!r} is scheduled twice in one decision", run_id=run_id
                )
            seen.add(call.step_id)
            step = view.steps.get(call.step_id)
            if step is not None:
                create = CreateStep(
                    step_id=call.step_id,
                    step_name=call.step_name,
                    input=call.input,
                    retry=call.retry,
                )
                journal.same_definition(create, now)
                if step.status not in ("pending", "running"):
                    continue
                delayed = step.retry_after is not None and step.retry_after > now
                # Claimed by another drive of this engine (its body is running there); a claim
                # of this drive's own only holds an outcome not yet appended.
                elsewhere = journal.elsewhere(call.step_id)
                if delayed or elsewhere:
                    waiting = True
                    continue
                # The workflow's policy now: a deploy may have changed the recorded one, and
                # the new one applies from the next attempt.
                policy = call.retry if call.retry is not None else DEFAULT_RETRY
                if step.attempt >= policy.max_attempts:
                    # No attempt is left: the last was interrupted (the process died), or the
                    # new policy allows no more than the step has made.
                    how = "was interrupted" if step.status == "running" else "was the last"
                    error = f"attempt {step.attempt} of {policy.max_attempts} {how}"
                    exhausted.append(FailStep(step_id=step.step_id, error=error.encode()))
                    continue
            chosen.append((call, step))
        return chosen, exhausted, waiting

    async def run_bodies(self, steps: Sequence[tuple[StepState, timedelta | None]]) -> None:
        """Run the step bodies concurrently (each with its own timeout), propose their outcomes.

        Each outcome but the last is committed as soon as it is known (those known at once in
        one append); the last are pending, to go with the workflow's next decision.
        """
        tasks = {asyncio.ensure_future(self.body(step, timeout)): step for step, timeout in steps}
        errors: list[BaseException] = []
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: _numeric(tasks[t].step_id)):
                    step = tasks.pop(task)
                    try:
                        await self.outcome(step, task.result(), commit=False)
                    except Exception as exc:
                        errors.append(exc)
                if tasks and not errors:  # the outcomes known so far, in one append
                    await self.journal.flush()
        finally:
            for task in tasks:
                task.cancel()
        for extra in errors[1:]:
            _log.error("another step of run %r failed to record as well: %r", self.run_id, extra)
        if errors:
            raise errors[0]

    async def body(
        self, step: StepState | None, timeout: timedelta | None, new: ScheduleStep | None = None
    ) -> Command:
        """Run one attempt of the step's body: the command that records its outcome.

        The attempt fails as timed out after `timeout` (None: the engine's `step_timeout`).
        `step` None is the step `new` schedules, just created and started (attempt 1) as the
        journal's view shows: its state is read off the view only if its body fails.
        """
        limit = timeout if timeout is not None else self.step_timeout
        scope: asyncio.Timeout | None = None
        if step is not None:
            invocation = StepInvocation(
                run_id=self.run_id,
                step_id=step.step_id,
                step_name=step.step_name,
                input=step.input,
                attempt=step.attempt,
                previous_error=step.error,
            )
        else:
            assert new is not None
            invocation = StepInvocation(
                run_id=self.run_id,
                step_id=new.step_id,
                step_name=new.step_name,
                input=new.input,
                attempt=1,
                previous_error=None,
            )
        try:
            if limit is None:
                output = await self.runtime.run_step(invocation)
            else:
                # The body's first step runs bare; the limit counts from its first suspension.
                it = self.runtime.run_step(invocation).__await__()
                try:
                    yielded = it.send(None)
                except StopIteration as stop:
                    output = stop.value
                else:
                    when = asyncio.get_running_loop().time() + limit.total_seconds()
                    scope = asyncio.timeout_at(when)
                    async with scope:
                        output = await _Resumed(it, yielded)
        except Exception as exc:
            failure: Exception = exc
            if scope is not None and limit is not None and scope.expired():
                failure = StepTimedOut(
                    f"step {invocation.step_name!r} (id {invocation.step_id!r}) of run "
                    f"{self.run_id!r} did not return within {limit} (attempt "
                    f"{invocation.attempt})",
                    run_id=self.run_id,
                    step_id=invocation.step_id,
                    timeout=limit,
                )
            return self.after_failure(self._state(step, invocation), failure)
        except BaseException as exc:  # SystemExit and the like: the body's failure all the same
            if not is_code_failure(exc):
                raise  # the drive's task is cancelled (or the process dies): nothing is recorded
            where = f"step {invocation.step_name!r} (id {invocation.step_id!r})"
            failure = as_failure(exc, run_id=self.run_id, where=where)
            return self.after_failure(self._state(step, invocation), failure)
        return CompleteStep(step_id=invocation.step_id, output=output)

    def _state(self, step: StepState | None, invocation: StepInvocation) -> StepState:
        """`step`, or (None) the state of the step `invocation` runs, as the view shows it."""
        return step if step is not None else self.journal.snapshot.steps[invocation.step_id]

    def after_failure(self, step: StepState, exc: Exception) -> Command:
        """The command recording a failed attempt.

        That is a delayed retry while the step's policy allows one, else the step's failure.
        """
        if isinstance(exc, StepFailure):
            error, code, retryable = exc.error, exc.code, exc.retryable
        else:
            error, code, retryable = describe(exc), type(exc).__name__, True
        policy = step.retry if step.retry is not None else DEFAULT_RETRY
        if code is not None and code in policy.non_retryable_error_codes:
            retryable = False
        if not retryable or step.attempt >= policy.max_attempts:
            return FailStep(step_id=step.step_id, error=error, retryable=retryable)
        delay = retry_delay(
            policy,
            run_id=self.run_id,
            step_id=step.step_id,
            attempt=step.attempt,
            jitter=self.jitter,
        )
        return RetryStep(
            step_id=step.step_id, error=error, retry_after=self.journal.clock() + delay
        )

    def superseded(self, attempt: StepState) -> bool:
        """Whether the run ended or the step left the attempt `attempt` describes.

        Another writer finished it, cancelled it or started another attempt.
        """
        view = self.journal.snapshot
        now = view.steps.get(attempt.step_id)
        return (
            view.is_terminal
            or now is None
            or (now.status, now.attempt) != ("running", attempt.attempt)
        )

    async def outcome(self, step: StepState, command: Command, *, commit: bool) -> None:
        """Propose the command recording a finished attempt (appended at once if `commit`).

        An outcome the kernel cannot take (an output over the payload limit, say) fails the
        step for good instead, so the step is neither stuck nor run again. An outcome made moot
        by others (the step finished, the run ended) is dropped.
        """
        journal = self.journal
        try:
            try:
                journal.propose(command)
            except InvalidCommand as exc:
                _log.warning(
                    "the outcome of step %r of run %r cannot be recorded: %s",
                    step.step_id,
                    self.run_id,
                    exc,
                )
                journal.propose(
                    FailStep(step_id=step.step_id, error=describe(exc), retryable=False)
                )
        except Rejection:
            if self.superseded(step) or (await journal.moved_on() and self.superseded(step)):
                _log.debug("outcome of step %r of run %r was superseded", step.step_id, self.run_id)
                return
            raise
        if commit:
            await journal.flush()
