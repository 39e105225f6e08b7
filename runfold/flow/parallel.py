"""Parallel steps: `await asyncio.gather(step(a), step(b), ...)` in workflow code.

`step(...)` returns a `Pending` that passes for an asyncio future, so `asyncio.gather` keeps
it as it is (no task on the event loop) and returns a gathering future, which the workflow
awaits: the coroutine yields it to the interpreter. `gathered` recognises it
(`runfold.flow.gathering`); the steps are
then a `Gathered` call, whose steps take the next call ids in argument order (not in the
order they finish), so a replay finds each where the code asks for it.

The interpreter schedules every step not yet ended in one `ScheduleSteps` (their starts go in
one append, their bodies run concurrently, each is retried on its own) and resumes the
coroutine once all have ended, resolving the steps in id order: `gather` then returns their
results, or raises the first failed step's `StepError` by id (`return_exceptions=True` gives
the errors in the list), the same on every replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runfold.engine import RuntimeDecision, ScheduleStep, ScheduleSteps
from runfold.flow.calls import StepCall
from runfold.flow.errors import FlowNonDeterminism, StepError
from runfold.flow.gathering import Gathered
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = ["on_gathered"]


def on_gathered(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    group: Gathered,
) -> RuntimeDecision | None:
    """Schedule the group's steps not yet ended, or resolve them all and resume (None)."""
    codec = interpreter.codec
    calls = [p.call for p in group.children]
    if group.inputs is None:
        group.inputs = [codec.encode(list(c.args)) for c in calls if isinstance(c, StepCall)]
    steps = snapshot.steps
    todo: list[ScheduleStep] = []
    for offset, pending in enumerate(group.children):
        call = pending.call
        assert isinstance(call, StepCall)
        interpreter.bodies[call.name] = call.fn
        call_id = str(group.first + offset)
        step_input = group.inputs[offset]
        step = steps.get(call_id)
        recorded = None
        if step is None:
            recorded = interpreter.recorded_at(snapshot, call_id)
        elif step is not None and step.step_name != call.name:
            recorded = f"step {step.step_name!r}"
        elif step is not None and step.input != step_input:
            recorded = f"step {step.step_name!r} with another input"
        if recorded is not None:
            raise FlowNonDeterminism(
                run_id=snapshot.run_id,
                call=group.first + offset,
                recorded=recorded,
                asked=f"step {call.name!r}",
            )
        if step is None or step.status in ("pending", "running"):
            todo.append(
                ScheduleStep(
                    step_id=call_id, step_name=call.name, input=step_input, retry=call.retry
                )
            )
    if todo:
        return todo[0] if len(todo) == 1 else ScheduleSteps(steps=todo)
    for offset, pending in enumerate(group.children):
        call_id = str(group.first + offset)
        step = steps[call_id]
        if step.status == "completed":
            output = step.output if step.output is not None else b""
            interpreter.consumed(session, durable, ("step", call_id), ("completed", output))
            pending.resolve(codec.decode(output))
        else:
            interpreter.consumed(session, durable, ("step", call_id), (step.status, step.error))
            message = (step.error or b"").decode(errors="replace")
            pending.resolve(error=StepError(step.step_name, message))
    session.resume(None)
    return None
