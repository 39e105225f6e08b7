"""`sleep` and `wait_for_event` in the interpreter: durable timers and hooks.

`sleep` at call id n is the run's wait `n`, due `delay` after the call was first reached.
`wait_for_event` at call id n awaits hook `n` (its metadata the event's name): the first
delivery resumes the coroutine; with a timeout, a wait `n` runs beside it, and once it is due
without a delivery the hook is closed and the coroutine resumed with None. A token held by a
finished `wait_for_event` of the same run is freed (`CloseHook`) before it is awaited again.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from runfold.engine import AwaitHook, CloseHook, RuntimeDecision, WaitUntil
from runfold.flow.calls import EventCall, SleepCall
from runfold.flow.errors import TokenInUse
from runfold.flow.history import describe_recorded
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = ["on_event", "on_sleep"]


def on_sleep(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: SleepCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Create or keep waiting on the wait, or resume the coroutine once it completed."""
    wait = snapshot.waits.get(call_id)
    if wait is None or call_id in snapshot.hooks:  # a hook: a wait_for_event's time-out
        interpreter.other_kind(session, snapshot, call_id)
        now = interpreter.clock()
        try:
            resume_at = now + call.delay
        except OverflowError:  # past year 9999: as good as for ever, which a wait can be
            resume_at = datetime.max.replace(tzinfo=now.tzinfo)
        return WaitUntil(wait_id=call_id, resume_at=resume_at)
    if wait.status == "waiting":
        return WaitUntil(wait_id=call_id, resume_at=wait.resume_at)
    interpreter.consumed(session, durable, ("wait", call_id), ("completed", None))
    session.resume(None)
    return None


def on_event(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: EventCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Create or keep awaiting the hook, or resume the coroutine with its first delivery.

    With a timeout, resume it with None once the timeout passed (the hook closed first).
    """
    metadata = call.hook_id.encode()
    hook = snapshot.hooks.get(call_id)
    if hook is None:
        conflict = snapshot.hook_conflicts.get(call_id)
        if conflict is not None:
            error = TokenInUse(call.hook_id, conflict.holder_run_id, run_id=snapshot.run_id)
            session.resume(error=error)
            return None
        interpreter.other_kind(session, snapshot, call_id)
        earlier = _earlier_holder(snapshot, call.token)
        if earlier is not None:  # a finished wait_for_event of this run: free the token
            return CloseHook(hook_id=earlier)
        return AwaitHook(hook_id=call_id, token=call.token, metadata=metadata)
    if hook.metadata != metadata:
        recorded = describe_recorded(snapshot, call_id) or "a wait_for_event"
        interpreter.mismatch(session, snapshot, recorded)
    if hook.token != call.token:
        interpreter.mismatch(
            session, snapshot, f"wait_for_event({call.hook_id!r}) with another token"
        )
    if hook.deliveries:
        # Deliveries are appended before anyone is shown them: nothing to confirm.
        session.resume(interpreter.codec.decode(hook.deliveries[0].payload))
        return None
    if call.timeout is None:
        return AwaitHook(hook_id=call_id, token=call.token, metadata=metadata)
    if hook.status != "active":  # closed at its time-out, before any delivery
        interpreter.consumed(session, durable, ("hook", call_id), ("disposed", None))
        session.resume(None)
        return None
    wait = snapshot.waits.get(call_id)
    if wait is None:
        return WaitUntil(wait_id=call_id, resume_at=interpreter.clock() + call.timeout)
    if wait.status == "waiting":  # suspends the run until it is due, then completes it
        return WaitUntil(wait_id=call_id, resume_at=wait.resume_at)
    return CloseHook(hook_id=call_id)  # time is up: no delivery may win after this


def _earlier_holder(snapshot: Snapshot, token: str) -> str | None:
    """The active hook of the run holding `token`, if any: a finished `wait_for_event`'s, since
    the run awaits one call at a time."""
    for hook_id in snapshot.active_hook_ids:
        if snapshot.hooks[hook_id].token == token:
            return hook_id
    return None
