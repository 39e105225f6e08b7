"""`await step(fn, *args)` in the interpreter: schedule the step, or resume with its outcome.

The step at call id n is the run's step `n`: scheduled (`ScheduleStep`) until it ended, then
its recorded output is fed to the coroutine (or its error raised there as `StepError`), on
every replay alike. Its arguments are encoded once per call and must match the recorded input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runfold.engine import RuntimeDecision, ScheduleStep
from runfold.flow.calls import StepCall
from runfold.flow.encoding import payload_error
from runfold.flow.errors import StepError
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = ["on_step"]


def on_step(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: StepCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Schedule the step, or feed its recorded outcome to the coroutine (None then)."""
    interpreter.bodies[call.name] = call.fn
    step_input = session.call_input
    if step_input is None:  # encoded once per call, however often the call is decided on
        try:
            step_input = session.call_input = interpreter.codec.encode(list(call.args))
        except Exception as exc:  # raised at the call, as a bad argument would be
            what = f"the arguments of step {call.name!r} (call {call_id})"
            session.resume(error=payload_error(what, exc))
            return None
    # One lookup (a snapshot's mapping answers a miss of `get` without raising).
    step = snapshot.steps.get(call_id)
    if step is None:
        interpreter.other_kind(session, snapshot, call_id, steps=False)
        return ScheduleStep(
            step_id=call_id,
            step_name=call.name,
            input=step_input,
            retry=call.retry,
            timeout=call.timeout,
        )
    if step.step_name != call.name:
        interpreter.mismatch(session, snapshot, f"step {step.step_name!r}")
    if step.input != step_input:
        interpreter.mismatch(session, snapshot, f"step {step.step_name!r} with another input")
    if step.status in ("pending", "running"):
        # The policy of the code now: one a deploy changed applies from the next attempt.
        return ScheduleStep(
            step_id=call_id,
            step_name=call.name,
            input=step_input,
            retry=call.retry,
            timeout=call.timeout,
        )
    if step.status == "completed":
        output = step.output if step.output is not None else b""
        interpreter.consumed(session, durable, ("step", call_id), ("completed", output))
        produced = session.produced
        if produced is not None and produced[0] == call_id and produced[1] == output:
            session.resume(produced[2])  # what decoding `output` gives
        else:
            session.resume(interpreter.codec.decode(output))
        return None
    message = (step.error or b"").decode(errors="replace")
    interpreter.consumed(session, durable, ("step", call_id), (step.status, step.error))
    session.resume(error=StepError(call.name, message))
    return None
