"""The replay interpreter: a workflow coroutine as the engine's `run_workflow`.

Workflow code is an `async def` whose awaits are `runfold.flow` calls. The n-th call of a run
is the step, wait or hook whose id is `str(n)`, so ids follow call order and a replay finds
each recorded result where the code asks for it.

Within one process the coroutine stays alive between decisions (a `Session`): asked about a run
it already holds, the interpreter resumes the coroutine from the call it stopped at, so a
decision costs the same at step 10 and at step 10,000. After a restart, or whenever the
snapshot it is shown disagrees with what the coroutine was told, it starts the function again
and replays it against the snapshot (every recorded result is fed back without running
anything), which is what makes a run durable.

Staying in step with the engine: the engine shows workflow code a provisional snapshot, with
its own latest decisions (a step's outcome, a wait's completion) not yet appended, and may drop
them when the stored run moved under it. So every result a session consumed is kept as
"unconfirmed" until the engine's observer sees it appended; each decision first checks the
unconfirmed results against the snapshot shown (usually one), and replays from that snapshot
when one disagrees.
"""

from __future__ import annotations

import logging
import operator
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from runfold.engine import Cancel, Complete, Fail, RuntimeDecision
from runfold.engine.raised import as_failure, error_payload
from runfold.flow.calls import (
    AttributesCall,
    ChildResultCall,
    ContinueCall,
    EventCall,
    PatchCall,
    ProgressCall,
    RecvCall,
    SleepCall,
    StartChildCall,
    StepCall,
)
from runfold.flow.children import on_child_result, on_start_child
from runfold.flow.continuation import on_continue
from runfold.flow.definition import Workflow
from runfold.flow.encoding import (
    ROUND_TRIP_TYPES,
    JsonCodec,
    PayloadCodec,
    payload_error,
)
from runfold.flow.errors import FlowNonDeterminism, UnknownWorkflow
from runfold.flow.gathering import Gathered
from runfold.flow.history import (
    agrees,
    describe_call,
    describe_recorded,
    is_recorded,
    other_kinds,
)
from runfold.flow.info import WorkflowInfo
from runfold.flow.messages import on_recv
from runfold.flow.parallel import on_gathered
from runfold.flow.patches import on_patch
from runfold.flow.records import on_record
from runfold.flow.session import Consumed, Expected, Session
from runfold.flow.steps import on_step
from runfold.flow.waits import on_event, on_sleep
from runfold.kernel import (
    AttributesSet,
    ChildLinked,
    Envelope,
    HookDisposed,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunTimedOut,
    Snapshot,
    StepCompleted,
    StepFailed,
    WaitCompleted,
)

__all__ = ["Interpreter", "Session"]

_log = logging.getLogger("runfold.flow")
# The events `observe` acts on: outcomes a session may have consumed, and the run's ends.
OBSERVED = frozenset(
    {
        StepCompleted,
        StepFailed,
        WaitCompleted,
        HookDisposed,
        AttributesSet,
        ProgressRecorded,
        ChildLinked,
        RunCompleted,
        RunFailed,
        RunCancelled,
        RunTimedOut,
    }
)
"""The events `Interpreter.observe` looks at (a run's end included); the others pass by."""


class Interpreter:
    """Decides runs of `workflows` by running their coroutines; keeps up to `max_sessions`.

    `clock` stamps a new sleep's due time; `bodies` collects each step name's function as the
    workflow code calls it, for `run_step` to find.
    """

    def __init__(
        self,
        workflows: Mapping[str, Workflow],
        codec: PayloadCodec,
        clock: Callable[[], datetime],
        *,
        max_sessions: int = 1024,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.workflows = workflows
        self.codec = codec
        # With the default codec, plain values (`round_trips`) skip a decode: the value itself
        # stands for what decoding its encoding would give.
        self.exact = type(codec) is JsonCodec
        self.clock = clock
        self.max_sessions = max_sessions
        self.bodies: dict[str, Callable[..., Any]] = {}
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.replays = 0  # how many sessions were started from a snapshot (for tests, metrics)

    # --- the engine's questions ---------------------------------------------------------------

    def decide(
        self, snapshot: Snapshot, durable: Snapshot | None = None, *, replay: bool | None = None
    ) -> RuntimeDecision:
        """The run's next decision, from its live session or a replay of `snapshot`.

        `durable` is the stored run, when known: results a replay reads that it already holds
        need no confirmation. `replay` is `needs_replay(snapshot)` when the caller just asked it.
        """
        run_id = snapshot.run_id
        if snapshot.cancellation is not None:
            self.forget(run_id)
            return Cancel()
        session = self.sessions.get(run_id)
        if replay is None:
            replay = session is None or self.needs_replay(snapshot)
        if session is not None and replay:
            _log.debug("run %r moved under its session: replaying", run_id)
            self.forget(run_id)
            session = None
        if session is None:
            session = self.start(snapshot)
        else:
            self.sessions.move_to_end(run_id)
            durable = None
        return self.next_decision(session, snapshot, durable)

    def needs_replay(self, snapshot: Snapshot) -> bool:
        """Whether the run has no session, or one that consumed what `snapshot` contradicts."""
        return self.live(snapshot) is None

    def live(self, snapshot: Snapshot) -> Session | None:
        """The run's session, unless it has none or consumed what `snapshot` contradicts."""
        session = self.sessions.get(snapshot.run_id)
        if session is None:
            return None
        if snapshot.last_sequence < session.confirmed:  # a view from before what it was told
            return None
        for key, expected in session.unconfirmed.items():  # usually one, or none
            if not agrees(snapshot, key, expected):
                return None
        return session

    def go_on(self, session: Session, snapshot: Snapshot) -> RuntimeDecision:
        """The next decision of a `live` session (what `decide` does when no replay is needed)."""
        if snapshot.cancellation is not None:
            self.forget(snapshot.run_id)
            return Cancel()
        self.sessions.move_to_end(snapshot.run_id)
        return self.next_decision(session, snapshot, None)

    def start(self, snapshot: Snapshot) -> Session:
        """A new session for the run, at its first call."""
        found = self.workflows.get(snapshot.workflow_name)
        if found is None:
            raise UnknownWorkflow(
                f"run {snapshot.run_id!r} is of workflow {snapshot.workflow_name!r}, which "
                "this Flow does not serve"
            )
        session = Session(found.fn(self.codec.decode(snapshot.input)), WorkflowInfo.of(snapshot))
        self.replays += 1
        session.resume()
        self.sessions[snapshot.run_id] = session
        while len(self.sessions) > self.max_sessions:
            _, evicted = self.sessions.popitem(last=False)
            evicted.close()
        return session

    def at_step(
        self, run_id: str, step_id: str, step_input: bytes
    ) -> tuple[Session, StepCall, Sequence[Any]] | None:
        """The run's session, call and body arguments, if its coroutine is at step `step_id`.

        The step was recorded with `step_input`; the arguments are the call's own when decoding
        `step_input` would give them back, else decoded.
        """
        session = self.sessions.get(run_id)
        if session is None:
            return None
        call = session.call
        found: StepCall | None = None
        if isinstance(call, StepCall) and str(session.position) == step_id:
            found = call
        elif isinstance(call, Gathered):
            found = call.at(step_id)
        if found is None:
            return None
        if self.exact and step_input == session.call_input:
            for arg in found.args:  # a loop, not `all(...)` of a generator: asked per step
                if type(arg) not in ROUND_TRIP_TYPES:
                    break
            else:
                return session, found, found.args
        decoded: Sequence[Any] = self.codec.decode(step_input)
        return session, found, decoded

    def ran(self, session: Session, step_id: str, output: bytes, value: Any) -> None:
        """Note that the body of the session's call returned `value`, recorded as `output`."""
        if self.exact and type(value) in ROUND_TRIP_TYPES:  # what `round_trips` asks
            session.produced = (step_id, output, value)

    def forget(self, run_id: str) -> None:
        """Drop the run's session, if any."""
        session = self.sessions.pop(run_id, None)
        if session is not None:
            session.close()

    def observe(self, envelope: Envelope) -> None:
        """Confirm what the engine appended; a mismatch or the run's end drops the session."""
        event = envelope.event
        if type(event) not in OBSERVED:  # most events: a step's creation or start
            return
        session = self.sessions.get(envelope.run_id)
        if session is None:
            return
        key: Consumed
        expected: Expected
        if isinstance(event, StepCompleted):
            key, expected = ("step", event.step_id), ("completed", event.output)
        elif isinstance(event, StepFailed):
            key, expected = ("step", event.step_id), ("failed", event.error)
        elif isinstance(event, WaitCompleted):
            key, expected = ("wait", event.wait_id), ("completed", None)
        elif isinstance(event, HookDisposed):
            key, expected = ("hook", event.hook_id), ("disposed", None)
        elif isinstance(event, AttributesSet):
            if event.write_id is None:
                return
            key, expected = ("attributes", event.write_id), ("recorded", None)
        elif isinstance(event, ProgressRecorded):
            key, expected = ("progress", event.progress_id), ("recorded", None)
        elif isinstance(event, ChildLinked):
            key, expected = ("child", event.reference_id), ("linked", None)
        else:  # the run ended
            self.forget(envelope.run_id)
            return
        held = session.unconfirmed.pop(key, None)
        if held is not None and held != expected:
            self.forget(envelope.run_id)
        elif held is not None:
            session.confirmed = max(session.confirmed, envelope.sequence)

    # --- the interpreter proper ---------------------------------------------------------------

    def consumed(
        self, session: Session, durable: Snapshot | None, key: Consumed, expected: Expected
    ) -> None:
        """Note a result fed to the coroutine: unconfirmed unless `durable` already holds it."""
        if durable is None or not agrees(durable, key, expected):
            session.unconfirmed[key] = expected

    def next_decision(
        self, session: Session, snapshot: Snapshot, durable: Snapshot | None
    ) -> RuntimeDecision:
        """Feed recorded results to the coroutine until it asks for something not yet done."""
        run_id = snapshot.run_id
        while True:
            call_id = str(session.position)
            call = session.call
            if call is None:  # the coroutine ended: nothing may be recorded past its last call
                beyond_id = str(session.position + 1)
                beyond = (
                    describe_recorded(snapshot, beyond_id)
                    if is_recorded(snapshot, beyond_id)
                    else None
                )
                if beyond is not None:
                    raise FlowNonDeterminism(
                        run_id=run_id,
                        call=session.position + 1,
                        recorded=beyond,
                        asked=describe_call(None),
                    )
                if session.failure is None:
                    try:
                        return Complete(output=self.codec.encode(session.result))
                    except Exception as exc:  # a value the codec cannot take fails the run
                        session.failure = payload_error("the workflow's return value", exc)
                failure = as_failure(session.failure, run_id=run_id, where="the workflow code")
                return Fail(error=error_payload(failure), error_code=type(failure).__name__)
            match call:
                case StepCall():
                    decision = on_step(self, session, snapshot, durable, call, call_id)
                case SleepCall():
                    decision = on_sleep(self, session, snapshot, durable, call, call_id)
                case EventCall():
                    decision = on_event(self, session, snapshot, durable, call, call_id)
                case AttributesCall() | ProgressCall():
                    decision = on_record(self, session, snapshot, durable, call, call_id)
                case Gathered():
                    decision = on_gathered(self, session, snapshot, durable, call)
                case StartChildCall():
                    session.family = True
                    decision = on_start_child(self, session, snapshot, durable, call, call_id)
                case ChildResultCall():
                    decision = on_child_result(self, session, snapshot, call, call_id)
                case RecvCall():
                    decision = on_recv(self, session, snapshot, durable, call, call_id)
                case ContinueCall():
                    decision = on_continue(self, session, snapshot, durable, call, call_id)
                case PatchCall():
                    decision = on_patch(self, session, snapshot, durable, call)
            if decision is not None:
                return decision

    def mismatch(self, session: Session, snapshot: Snapshot, recorded: str) -> None:
        """Raise `FlowNonDeterminism` for the session's current call against `recorded`."""
        raise FlowNonDeterminism(
            run_id=snapshot.run_id,
            call=session.position,
            recorded=recorded,
            asked=describe_call(session.call),
        )

    def recorded_at(self, snapshot: Snapshot, call_id: str) -> str | None:
        """What the history holds at `call_id`, described, or None when nothing."""
        return describe_recorded(snapshot, call_id) if is_recorded(snapshot, call_id) else None

    def other_kind(
        self, session: Session, snapshot: Snapshot, call_id: str, *, steps: bool = True
    ) -> None:
        """Raise if the history holds another kind of call at `call_id`.

        `steps=False`: the caller found no step there (it looked), so the steps are not asked.
        """
        if not steps:  # a new call, asked per step: what was found empty is known empty
            kinds = other_kinds(snapshot)
            empty = session.empty_kinds
            if empty is not None and all(map(operator.is_, kinds, empty)):
                return
            if not any(map(len, kinds)):
                session.empty_kinds = kinds
                return
        if not is_recorded(snapshot, call_id, steps=steps):
            return
        recorded = describe_recorded(snapshot, call_id)
        if recorded is not None:
            self.mismatch(session, snapshot, recorded)
