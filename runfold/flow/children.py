"""Child workflows in the interpreter: `start_child` and `await handle.result()`.

`start_child` at call id n records a `child_linked` entry under reference id n (kind
`CHILD_KIND`, the child's workflow name and run id, and a random secret as metadata); the
`Flow` creates the child run (its `parent_run_id` this run) before that decision is appended,
so a crash leaves either no link, or a link whose child exists. `await handle.result()` at call
id m awaits a hook whose token is made from that secret (`result_token`): the `Flow` delivers
the child's end to it (`result_payload`) when the child ends, or when the parent reaches the
hook after the child already ended, so the parent wakes without polling. The hook's metadata
names the child (`RESULT_METADATA` + its run id).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING

from runfold.engine import AwaitHook, LinkChildOperation, RuntimeDecision
from runfold.flow.calls import ChildHandle, ChildResultCall, StartChildCall
from runfold.flow.errors import ChildWorkflowError
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = [
    "CHILD_KIND",
    "RESULT_METADATA",
    "child_run_id",
    "on_child_result",
    "on_start_child",
    "result_payload",
    "result_token",
]

CHILD_KIND = "runfold.flow.workflow"
"""The `kind` of a child run's link in its parent's history."""
RESULT_METADATA = b"runfold.flow.child-result:"
"""What the metadata of the hook a parent awaits its child's end on starts with."""
_MAX_ID = 256


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """A child's default run id: `<parent>/<call id>`, or a digest of it past the id limit."""
    chosen = f"{parent_run_id}/{call_id}"
    if len(chosen) <= _MAX_ID:
        return chosen
    return "child_" + hashlib.sha256(chosen.encode()).hexdigest()


def result_token(secret: bytes) -> str:
    """The token of the hook a parent awaits its child's end on."""
    return "runfold-child:" + secret.decode()


def result_payload(status: str, body: bytes | None) -> bytes:
    """What is delivered to that hook: the child's status, a newline, its output or error."""
    return status.encode() + b"\n" + (body or b"")


def on_start_child(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: StartChildCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Link the child (the `Flow` creates it first), or resume with its handle once linked."""
    wanted = call.run_id if call.run_id is not None else child_run_id(snapshot.run_id, call_id)
    name = call.workflow.name
    link = snapshot.children.get(call_id)
    if link is None:
        interpreter.other_kind(session, snapshot, call_id)
        return LinkChildOperation(
            reference_id=call_id,
            kind=CHILD_KIND,
            operation_id=name,
            child_run_id=wanted,
            metadata=secrets.token_hex(16).encode(),
        )
    if (link.kind, link.operation_id, link.child_run_id) != (CHILD_KIND, name, wanted):
        interpreter.mismatch(session, snapshot, f"start_child of {link.operation_id!r}")
    interpreter.consumed(session, durable, ("child", call_id), ("linked", None))
    session.resume(ChildHandle(run_id=wanted, workflow_name=name, call_id=call_id))
    return None


def on_child_result(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    call: ChildResultCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Await the hook the child's end is delivered to; resume with its output (or raise)."""
    handle = call.handle
    link = snapshot.children.get(handle.call_id)
    if link is None or link.metadata is None:
        session.resume(error=ValueError(f"the handle of child {handle.run_id!r} is not this run's"))
        return None
    metadata = RESULT_METADATA + handle.run_id.encode()
    token = result_token(link.metadata)
    hook = snapshot.hooks.get(call_id)
    if hook is None:
        interpreter.other_kind(session, snapshot, call_id)
        return AwaitHook(hook_id=call_id, token=token, metadata=metadata)
    if hook.metadata != metadata:
        interpreter.mismatch(session, snapshot, "a wait on another child")
    if not hook.deliveries:
        return AwaitHook(hook_id=call_id, token=token, metadata=metadata)
    # Deliveries are appended before anyone is shown them: nothing to confirm.
    status, _, body = hook.deliveries[0].payload.partition(b"\n")
    if status == b"completed":
        session.resume(interpreter.codec.decode(body))
    else:
        error = ChildWorkflowError(
            handle.run_id, status.decode(errors="replace"), body.decode(errors="replace")
        )
        session.resume(error=error)
    return None
