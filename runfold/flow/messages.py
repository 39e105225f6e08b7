"""Messages: `Flow.send(run_id, message, topic=...)` and `await recv(topic, timeout=...)`.

A run's messages on a topic go to one hook of the run, its mailbox (`mailbox_hook_id`), whose
token is derived from the run id and the topic (`mailbox_token`): the sender names the run,
as in DBOS. Whoever needs the mailbox first creates it: the workflow's first `recv` of the
topic, or `Flow.send`, which records a `hook_created` on the run itself when the workflow has
not asked yet, so a message sent early is kept. Every message is a delivery of that hook; the
k-th `recv` of a topic in a run takes its k-th delivery, which the session counts as the
workflow replays, so each message is received once.

A `recv` with a timeout at call id n has a durable timer n. Once it is due with no message
waiting, the interpreter records a second, already-due timer `n:timed-out` and only then
resumes the workflow with None: a message recorded before that marker but after the decision
to time out is left for the next `recv` on every replay alike, since the marker decides.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import TYPE_CHECKING

from runfold.engine import AwaitHook, Engine, RuntimeDecision, WaitUntil
from runfold.flow.calls import RecvCall
from runfold.flow.continuation import continued_as, last_run
from runfold.kernel import (
    CreateHook,
    EntityConflict,
    HookNotFound,
    RunExpired,
    Snapshot,
    TerminalState,
)

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = ["MAILBOX_METADATA", "mailbox_hook", "on_recv", "post_message"]

MAILBOX_METADATA = b"runfold.flow.mailbox:"
"""What the metadata of a mailbox hook starts with (then the topic)."""


def mailbox_hook(run_id: str, topic: str | None) -> tuple[str, str, bytes]:
    """The hook id, token and metadata of the run's mailbox for `topic`."""
    name = topic if topic is not None else ""
    digest = hashlib.sha256(f"{run_id}\x00{name}".encode()).hexdigest()
    return f"mailbox:{name}", f"runfold-mailbox:{digest}", MAILBOX_METADATA + name.encode()


async def post_message(
    engine: Engine, run_id: str, encoded: bytes, topic: str | None, idempotency_key: str | None
) -> Snapshot:
    """Record an encoded message in the mailbox of `run_id` (the last run of its chain).

    The mailbox hook is created when the workflow has not asked for it yet. The same
    `idempotency_key` again records the message once, and counts as sent once the run ended.
    A run that continues as new while the message is being recorded refuses it: it goes to
    the successor, which carries the chain on.

    Raises:
        RunNotFound: The run has no history.
        TerminalState: The run has ended (without this `idempotency_key`'s message).
        EntityConflict: `idempotency_key` was already used with another message.
    """
    handler = engine.handler
    run = await last_run(handler, await handler.snapshot(run_id))
    while True:
        try:
            return await _post(engine, run.run_id, encoded, topic, idempotency_key)
        except (TerminalState, RunExpired):  # ended: sent before, continued, or too late
            ended = await handler.snapshot(run.run_id)
            hook = ended.hooks.get(mailbox_hook(run.run_id, topic)[0])
            kept = () if hook is None else (d.delivery_id for d in hook.deliveries)
            if idempotency_key is not None and idempotency_key in kept:  # a send retried
                return ended
            if continued_as(ended) is None:
                raise
            run = await last_run(handler, ended)


async def _post(
    engine: Engine, run_id: str, encoded: bytes, topic: str | None, idempotency_key: str | None
) -> Snapshot:
    """Deliver the message to the mailbox of run `run_id`, made first if need be."""
    hook_id, token, metadata = mailbox_hook(run_id, topic)
    for _ in range(2):
        try:
            return await engine.deliver(token, encoded, idempotency_key)
        except HookNotFound:  # no mailbox yet: make it, then deliver
            create = CreateHook(hook_id=hook_id, token=token, metadata=metadata)
            with contextlib.suppress(EntityConflict):  # made meanwhile
                await engine.execute(run_id, (create,))
    raise AssertionError("a mailbox hook created just now took no delivery")


def on_recv(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: RecvCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Resume with the topic's next message, or wait for one (or for the timeout)."""
    hook_id, token, metadata = mailbox_hook(snapshot.run_id, call.topic)
    marker_id = f"{call_id}:timed-out"
    waits = snapshot.waits
    marker = waits.get(marker_id)
    if marker is not None:  # the timeout was decided: None, whatever arrived since
        if marker.status == "waiting":
            return WaitUntil(wait_id=marker_id, resume_at=marker.resume_at)
        interpreter.consumed(session, durable, ("wait", marker_id), ("completed", None))
        session.resume(None)
        return None
    mailbox = snapshot.hooks.get(hook_id)
    taken = session.received.get(hook_id, 0)
    if mailbox is not None and len(mailbox.deliveries) > taken:
        # Deliveries are appended before anyone is shown them: nothing to confirm.
        session.received[hook_id] = taken + 1
        session.resume(interpreter.codec.decode(mailbox.deliveries[taken].payload))
        return None
    if mailbox is None:
        interpreter.other_kind(session, snapshot, call_id)
        return AwaitHook(hook_id=hook_id, token=token, metadata=metadata)
    if call.timeout is None:
        return AwaitHook(hook_id=hook_id, token=token, metadata=metadata)
    timer = waits.get(call_id)
    if timer is None:
        interpreter.other_kind(session, snapshot, call_id)
        return WaitUntil(wait_id=call_id, resume_at=interpreter.clock() + call.timeout)
    if timer.status == "waiting":  # suspends the run until it is due, then completes it
        return WaitUntil(wait_id=call_id, resume_at=timer.resume_at)
    return WaitUntil(wait_id=marker_id, resume_at=timer.resume_at)  # due: made and completed
