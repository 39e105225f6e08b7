"""`FlowRuntime`: a `Flow` as its engine's runtime and observer.

The engine asks a `Flow` what a run does next (`run_workflow`: the `Interpreter`'s answer, a
replay reading the stored run first to trust it), runs its step bodies through it (`run_step`:
the function passed to `step`, on its decoded arguments), and tells it what it appended
(`on_event`: the live sessions confirm it, the family learns of ends and of the hooks parents
await their children on, `get_event` callers of published values). `Flow` is the rest: what
people call.
"""

from __future__ import annotations

from collections.abc import Collection

from runfold.engine import (
    AwaitHook,
    LinkChildOperation,
    RuntimeDecision,
    StepInvocation,
    WorkflowInvocation,
)
from runfold.flow.bodies import StepBodies
from runfold.flow.calls import cancel_child
from runfold.flow.definition import Workflow
from runfold.flow.encoding import PayloadCodec
from runfold.flow.errors import FlowError
from runfold.flow.events import EventBoard
from runfold.flow.family import Family
from runfold.flow.info import CURRENT_STEP, WorkflowInfo
from runfold.flow.interpreter import OBSERVED, Interpreter
from runfold.flow.sending import FLOW_BODIES
from runfold.handler import CommandHandler
from runfold.kernel import (
    Envelope,
    HookCreated,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunTimedOut,
    Snapshot,
)

__all__ = ["FlowRuntime"]

_RUN_ENDS = frozenset({RunCompleted, RunFailed, RunCancelled, RunTimedOut})
# The decisions the Family acts on (a child's creation, a wait on a child).
_FAMILY_DECISIONS = frozenset({LinkChildOperation, AwaitHook})


class FlowRuntime:
    """The engine's side of a `Flow` (its `WorkflowRuntime` and `EngineObserver`).

    What it works with is the `Flow`'s own: `Flow.__init__` sets it.
    """

    workflows: dict[str, Workflow]
    codec: PayloadCodec
    handler: CommandHandler
    interpreter: Interpreter
    bodies: StepBodies
    family: Family
    events: EventBoard

    @property
    def workflow_names(self) -> Collection[str]:
        """The names of the served workflows."""
        return tuple(self.workflows)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        """The interpreter's decision; a replay first reads the stored run to trust it."""
        snapshot = invocation.snapshot
        interpreter = self.interpreter
        session = interpreter.live(snapshot)
        if session is not None:  # the run's coroutine goes on from where it stopped
            decision = interpreter.go_on(session, snapshot)
        else:
            durable = None
            if _has_results(snapshot):
                durable = await self.handler.lookup(snapshot.run_id)
            decision = interpreter.decide(snapshot, durable, replay=True)
        if type(decision) in _FAMILY_DECISIONS:
            decision = await self.family.decided(snapshot, decision)
        return decision

    async def run_step(self, invocation: StepInvocation) -> bytes:
        """Run the step's function on its decoded arguments; its result, encoded."""
        interpreter = self.interpreter
        held = interpreter.at_step(invocation.run_id, invocation.step_id, invocation.input)
        if held is not None:  # the run's coroutine is at this step: its own call
            session, call, args = held
            fn, info = call.fn, session.info
        else:
            found = interpreter.bodies.get(invocation.step_name)
            if found is None:
                raise FlowError(f"no function is known for step {invocation.step_name!r}")
            fn, args = found, self.codec.decode(invocation.input)
            info = WorkflowInfo.of(await self.handler.snapshot(invocation.run_id))
        if fn is cancel_child or fn in FLOW_BODIES:  # it acts through this Flow
            args = (self, *args)
        # What `StepBodies.call` does, inline: one coroutine less per step.
        bodies = self.bodies
        token = CURRENT_STEP.set((invocation, info))
        try:
            if bodies.is_async(fn):
                result = await fn(*args)
            else:
                result = await bodies.plain(fn, args)
        finally:
            CURRENT_STEP.reset(token)
        output = self.codec.encode(result)
        if held is not None:
            interpreter.ran(held[0], invocation.step_id, output, result)
        return output

    observed_events = OBSERVED | {HookCreated}
    """The events `on_event` acts on: the engine calls it for these only (not for a step's
    creation or start, the most frequent)."""

    async def on_event(self, envelope: Envelope) -> None:
        """Confirm what the engine appended to the live sessions; note ends and awaited hooks.

        A run that ended may have a parent or children to follow up; a hook a parent awaits a
        child on, now durable, is checked against the child.
        """
        event = envelope.event
        kind = type(event)
        if isinstance(event, HookCreated):  # durable now: a child's end can be delivered to it
            self.family.awaits(event.token, event.metadata)
            return
        if kind not in OBSERVED:  # a step's creation or start, most often: nothing to do
            return
        if kind in _RUN_ENDS:
            self.family.ended(envelope.run_id)
        self.interpreter.observe(envelope)
        if self.events.waiting:  # someone waits in `get_event`
            self.events.saw(envelope)


def _has_results(snapshot: Snapshot) -> bool:
    """Whether a replay of `snapshot` could feed the coroutine anything recorded (a step's or a
    wait's outcome, a hook's payload); a run with none, just created, needs no stored copy to
    confirm them against."""
    return bool(len(snapshot.steps) or len(snapshot.waits) or len(snapshot.hooks))
