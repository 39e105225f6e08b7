"""`continue_as_new(input)`: a run ends and a successor carries its work on (Temporal's name).

A run's history is bounded (`Limits.max_events_per_run`, 25,000 events by default, about 8,000
steps), so a workflow of any length runs as a chain of runs, each continuing as the next.
`await continue_as_new(input)` at call id n:

1. the `Flow` creates the successor, queued, before anything is recorded in this run: its id is
   derived from the chain's first run id and its generation (`successor_run_id`), so a replay or
   a retry of the decision finds the same run and never makes a second one; it is created with
   the chain's links as reserved attributes (`$continued_from`, `$first_run`, `$generation`),
   this run's parent and deadline;
2. this run records `child_linked` at reference id n (kind `CONTINUE_KIND`, the successor's run
   id, the encoded input as metadata), then ends `completed` with the marker output
   `CONTINUED_OUTPUT + n`: the link says as what it continued.

A SIGKILL between any two of these leaves a live run that `recover` (or any worker of the fleet)
drives: the successor, queued; this run, which replays to the same call and finds its
successor made. The successor is a queued run like any other: a `Worker` claims it.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

from runfold.engine import (
    Complete,
    Engine,
    LinkChildOperation,
    RuntimeDecision,
)
from runfold.engine.raised import error_text
from runfold.flow.calls import ContinueCall, Pending
from runfold.flow.errors import ContinueAsNewError, PayloadError
from runfold.flow.info import FIRST_RUN, GENERATION
from runfold.handler import CommandHandler
from runfold.kernel import Snapshot, TerminalState
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.stores.signals import RunSignals

if TYPE_CHECKING:
    from runfold.flow.definition import Workflow
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = [
    "CONTINUED_OUTPUT",
    "CONTINUE_KIND",
    "RESULT_RECHECK",
    "cancel_chain",
    "continue_as_new",
    "continued_as",
    "first_run_id",
    "follow",
    "last_run",
    "on_continue",
    "successor_run_id",
]

CONTINUE_KIND = "runfold.flow.continued"
"""The `kind` of the link from a run to the successor it continued as."""
CONTINUED_OUTPUT = b"runfold.flow.continued-as:"
"""What the output of a run that continued as new starts with (then its link's reference id)."""

_MAX_ID = DEFAULT_LIMITS.max_id_length
_MAX_VALUE = DEFAULT_LIMITS.max_attribute_value_bytes

RESULT_RECHECK = 2.0
"""Seconds: a process waiting for a run's result reads it at least this often, signal or not."""


def continue_as_new(input: Any, *, workflow: Workflow | None = None) -> Any:
    """End this run and start its successor with `input`; never resumes.

    The successor is a run of `workflow` (by default this run's workflow). The run ends
    `completed` (`FlowRun.continued_as` names the successor), and its successor is queued
    under a run id derived from the chain's first run id and its generation (`<first run
    id>~<generation>`), linked both ways: the successor's `workflow_info()` has
    `continued_from`, `first_run_id` and `generation`. `Flow.result`, `Flow.start`,
    `Flow.send`, `Flow.cancel` and `Flow.get_event` follow the chain to its last run. The
    successor keeps the run's parent and its deadline (a `Flow.start(timeout=...)` bounds the
    whole chain); the run's live children are cancelled as at any end, and messages it did not
    `recv` stay in its history: `recv` them first. A run of the successor's id that is not
    the successor fails the run with `RunDefinitionConflict`.

    Raises:
        PayloadError: (at the call) `input` cannot be encoded.
        ContinueAsNewError: (at the call) the chain's first run id is too long to link.
    """
    return Pending(ContinueCall(input=input, workflow=workflow))


def first_run_id(snapshot: Snapshot) -> str:
    """The id of the first run of the chain `snapshot`'s run belongs to (its own, if first)."""
    return snapshot.attributes.get(FIRST_RUN, snapshot.run_id)


def generation(snapshot: Snapshot) -> int:
    """How many runs came before this one in its chain."""
    return int(snapshot.attributes.get(GENERATION, "0"))


def successor_run_id(first: str, generation: int) -> str:
    """The run id of generation `generation` of the chain that began with run `first`.

    It is `<first>~<generation>`, or a digest of it where that is too long for a run id or an
    attribute value.
    """
    chosen = f"{first}~{generation}"
    if len(chosen) <= _MAX_ID and len(chosen.encode()) <= _MAX_VALUE:
        return chosen
    return "continued_" + hashlib.sha256(chosen.encode()).hexdigest()


def continued_as(snapshot: Snapshot) -> str | None:
    """The successor's run id if the run ended by continuing as new, else None."""
    output = snapshot.output
    if snapshot.status != "completed" or output is None or not output.startswith(CONTINUED_OUTPUT):
        return None
    link = snapshot.children.get(output[len(CONTINUED_OUTPUT) :].decode(errors="replace"))
    if link is None or link.kind != CONTINUE_KIND:
        return None  # a user's output that merely looks like the marker
    successor: str | None = link.child_run_id
    return successor


def on_continue(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: ContinueCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Link the successor (the `Flow` creates it first), then end the run."""
    name = call.workflow.name if call.workflow is not None else snapshot.workflow_name
    try:
        encoded = interpreter.codec.encode(call.input)
    except Exception as exc:  # raised at the call, as a bad argument would be
        what = f"the input of continue_as_new (call {call_id})"
        session.resume(error=PayloadError(f"{what} cannot be encoded: {error_text(exc)}"))
        return None
    first = first_run_id(snapshot)
    if len(first.encode()) > _MAX_VALUE:
        session.resume(
            error=ContinueAsNewError(
                f"run {first!r} cannot continue as new: the first run id of a chain is kept in "
                f"an attribute, at most {_MAX_VALUE} bytes in UTF-8"
            )
        )
        return None
    wanted = successor_run_id(first, generation(snapshot) + 1)
    link = snapshot.children.get(call_id)
    if link is None:
        interpreter.other_kind(session, snapshot, call_id)
        return LinkChildOperation(
            reference_id=call_id,
            kind=CONTINUE_KIND,
            operation_id=name,
            child_run_id=wanted,
            metadata=encoded,
        )
    if (link.kind, link.operation_id, link.child_run_id, link.metadata) != (
        CONTINUE_KIND,
        name,
        wanted,
        encoded,
    ):
        interpreter.mismatch(session, snapshot, f"continue_as_new as {link.operation_id!r}")
    return Complete(output=CONTINUED_OUTPUT + call_id.encode())


async def last_run(handler: CommandHandler, snapshot: Snapshot) -> Snapshot:
    """The last run of the chain from `snapshot`'s run on, as it stands.

    That is `snapshot` itself unless its run continued as new.
    """
    successor = continued_as(snapshot)
    while successor is not None:
        found = await handler.lookup(successor)
        if found is None:  # not created yet: cannot be, since it is created first
            return snapshot
        snapshot = found
        successor = continued_as(snapshot)
    return snapshot


async def cancel_chain(engine: Engine, run_id: str, reason: str | None) -> Snapshot:
    """Ask the last run of `run_id`'s chain to cancel (`Engine.request_cancel`).

    The last run is read, then asked: one that continued as new in between refuses
    (`TerminalState`), and its successor, which carries the chain on, is asked in its place.

    Raises:
        RunNotFound: The run has no history.
        TerminalState: The chain's last run ended otherwise.
        EntityConflict: It is already cancelling for another reason.
    """
    run = await last_run(engine.handler, await engine.handler.snapshot(run_id))
    while True:
        try:
            return await engine.request_cancel(run.run_id, reason)
        except TerminalState:
            ended = await engine.handler.snapshot(run.run_id)
            if continued_as(ended) is None:
                raise
            run = await last_run(engine.handler, ended)


async def follow(handler: CommandHandler, run_id: str, wait: float | None) -> Snapshot:
    """The run, or the last run of its chain; with `wait`, once that ended or `wait` passed.

    It is woken when the run it waits for ends (`RunSignals`: within the process on every
    store, from any process on PostgreSQL), moving on to the successor of a run that continued
    as new, and reads the run again at least every `RESULT_RECHECK` seconds, since a signal may
    be lost with a connection, or come from another process on SQLite. On a store without
    signals it reads at growing intervals, from 10 ms to `RESULT_RECHECK`.

    Raises:
        RunNotFound: The run has no history.
    """
    snapshot = await last_run(handler, await handler.snapshot(run_id))
    if wait is None or snapshot.is_terminal:
        return snapshot
    store = handler.store
    signals = store if isinstance(store, RunSignals) else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = 0.01
    while (left := deadline - loop.time()) > 0:
        current = snapshot.run_id
        if signals is None:
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, RESULT_RECHECK)
            snapshot = await last_run(handler, await handler.snapshot(current))
        else:  # wait from before the read, so an end in between is not missed
            ended = asyncio.ensure_future(signals.wait_for_end(current, min(left, RESULT_RECHECK)))
            await asyncio.sleep(0)
            try:
                snapshot = await last_run(handler, await handler.snapshot(current))
                if not snapshot.is_terminal and snapshot.run_id == current:
                    await ended
            finally:
                ended.cancel()
        if snapshot.is_terminal:
            return snapshot
    # The wait is over: the run as it stands now (it may have ended during the last wait).
    return await last_run(handler, await handler.snapshot(snapshot.run_id))
