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
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeAlias

from runfold.engine import (
    AwaitHook,
    Cancel,
    CloseHook,
    Complete,
    Fail,
    RuntimeDecision,
    ScheduleStep,
    WaitUntil,
)
from runfold.engine.raised import CODE_BASE_EXCEPTIONS, as_failure, error_payload, error_text
from runfold.flow.calls import (
    CALL_TYPES,
    IN_WORKFLOW,
    AttributesCall,
    Call,
    ChildResultCall,
    EventCall,
    PatchCall,
    ProgressCall,
    RecvCall,
    SleepCall,
    StartChildCall,
    StepCall,
)
from runfold.flow.children import on_child_result, on_start_child
from runfold.flow.definition import Workflow
from runfold.flow.encoding import ROUND_TRIP_TYPES, JsonCodec, PayloadCodec, round_trips
from runfold.flow.errors import (
    FlowNonDeterminism,
    PayloadError,
    StepError,
    TokenInUse,
    UnknownWorkflow,
    UnsupportedAwait,
)
from runfold.flow.info import CURRENT_INFO, WorkflowInfo
from runfold.flow.messages import on_recv
from runfold.flow.parallel import Gathered, gathered, on_gathered
from runfold.flow.patches import on_patch
from runfold.flow.records import on_record
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
# What workflow code fails with: any exception, and SystemExit and the like raised of itself.
_FAILURES: tuple[type[BaseException], ...] = (Exception, *CODE_BASE_EXCEPTIONS)
# The events `observe` acts on: outcomes a session may have consumed, and the run's ends.
_OBSERVED = frozenset(
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

# A result a session consumed: ("step", id) -> (status, payload); ("wait", id) -> ("completed",);
# ("hook", id) -> ("disposed",): a wait_for_event that timed out; ("attributes", id) and
# ("progress", id) -> ("recorded",): a set_attributes or report_progress the code went past.
Consumed: TypeAlias = tuple[str, str]
Expected: TypeAlias = tuple[str, bytes | None]


class Session:
    """One live workflow coroutine, stopped at its `position`-th call (or finished)."""

    __slots__ = (
        "call",
        "call_input",
        "coro",
        "failure",
        "family",
        "finished",
        "info",
        "position",
        "produced",
        "received",
        "result",
        "unconfirmed",
    )

    def __init__(self, coro: Coroutine[Any, Any, Any], info: WorkflowInfo) -> None:
        self.coro = coro
        self.info = info  # what `workflow_info()` answers in the run's code
        self.family = False  # whether the code started a child (its end concerns them)
        self.received: dict[str, int] = {}  # messages taken so far, by mailbox hook id
        self.position = 0  # calls issued so far; the current one has id str(position)
        self.call: Call | Gathered | None = None
        self.call_input: bytes | None = None  # the current step call's arguments, encoded
        self.finished = False
        self.result: Any = None
        self.failure: BaseException | None = None
        self.unconfirmed: dict[Consumed, Expected] = {}
        # (step id, encoded, value): a result this process's body produced for the current
        # call, that decoding its recorded output gives back as itself (see `Interpreter.ran`).
        self.produced: tuple[str, bytes, Any] | None = None

    def resume(self, value: Any = None, error: BaseException | None = None) -> None:
        """Run the coroutine to its next call (or its end), sending `value` or throwing `error`."""
        token = IN_WORKFLOW.set(True)
        info_token = CURRENT_INFO.set(self.info)
        try:
            yielded = self.coro.throw(error) if error is not None else self.coro.send(value)
        except StopIteration as stop:
            self.finished, self.result, self.call = True, stop.value, None
            return
        except _FAILURES as exc:  # the workflow's own failure (SystemExit too): it fails the run
            self.finished, self.failure, self.call = True, exc, None
            return
        finally:
            CURRENT_INFO.reset(info_token)
            IN_WORKFLOW.reset(token)
        if not isinstance(yielded, CALL_TYPES):
            children = gathered(yielded)
            if children is not None:  # asyncio.gather(step(a), step(b), ...)
                self.call = Gathered(children, self.position + 1)
                self.position += len(children)
                self.call_input = self.produced = None
                return
            self.close()
            # The run fails: asked again, the code would await the same thing again.
            self.finished, self.result, self.call = True, None, None
            self.failure = UnsupportedAwait(
                f"workflow code awaited {_shown(yielded)} after call {self.position}; it may "
                "await only runfold.flow's calls (step, sleep, wait_for_event, ...) and "
                "asyncio.gather of steps: everything a workflow waits on must be durable "
                "(asyncio.sleep is runfold.flow.sleep)"
            )
            return
        if type(yielded) is not PatchCall:  # a patch check takes no call id
            self.position += 1
        self.call = yielded
        self.call_input = self.produced = None

    def close(self) -> None:
        """Drop the coroutine (it is replayed when needed again).

        What its code does on the way out (a `finally` that raises, a `GeneratorExit` caught and
        ignored) is logged: it decides nothing.
        """
        try:
            self.coro.close()
        except _FAILURES as exc:
            _log.warning("workflow code raised as its coroutine was dropped: %s", error_text(exc))


def _shown(value: object) -> str:
    """`repr(value)`, bounded, whatever its `__repr__` does."""
    try:
        text = repr(value)
    except Exception:
        text = f"a {type(value).__name__}"
    return text if len(text) <= 200 else text[:200] + "…"


def _payload_error(what: str, exc: Exception) -> PayloadError:
    """The `PayloadError` for `what`, which the codec could not encode (it raised `exc`)."""
    if isinstance(exc, PayloadError):
        return PayloadError(f"{what} cannot be encoded: {exc}")
    return PayloadError(f"{what} cannot be encoded: {error_text(exc)}")


def _agrees(snapshot: Snapshot, key: Consumed, expected: Expected) -> bool:
    kind, entity_id = key
    if kind == "step":
        step = snapshot.steps.get(entity_id)
        if step is None:
            return False
        payload = step.output if step.status == "completed" else step.error
        return (step.status, payload) == expected
    if kind == "hook":
        hook = snapshot.hooks.get(entity_id)
        return hook is not None and hook.status != "active" and not hook.deliveries
    if kind == "attributes":
        return entity_id in snapshot.attribute_write_ids
    if kind == "progress":
        return entity_id in snapshot.progress
    if kind == "child":
        return entity_id in snapshot.children
    wait = snapshot.waits.get(entity_id)
    return wait is not None and wait.status == "completed"


def _recorded(snapshot: Snapshot, entity_id: str) -> bool:
    """Whether the history holds anything at call id `entity_id` (`_describe_recorded` is
    not None), without building the entries' states."""
    return (
        entity_id in snapshot.steps
        or entity_id in snapshot.waits
        or entity_id in snapshot.hooks
        or entity_id in snapshot.hook_conflicts
        or entity_id in snapshot.attribute_write_ids
        or entity_id in snapshot.progress
        or entity_id in snapshot.children
    )


def _describe_recorded(snapshot: Snapshot, entity_id: str) -> str | None:
    """What the history holds at call id `entity_id`, or None when nothing."""
    step = snapshot.steps.get(entity_id)
    if step is not None:
        return f"step {step.step_name!r}"
    hook = snapshot.hooks.get(entity_id)  # before the waits: a timeout's wait shares its id
    if hook is not None:
        return f"wait_for_event({(hook.metadata or b'').decode(errors='replace')!r})"
    if entity_id in snapshot.hook_conflicts:
        return "a wait_for_event"
    if entity_id in snapshot.waits:
        return "a sleep"
    if entity_id in snapshot.attribute_write_ids:
        return "set_attributes"
    if entity_id in snapshot.progress:
        return "report_progress"
    link = snapshot.children.get(entity_id)
    if link is not None:
        return f"start_child of {link.operation_id!r}"
    return None


def _describe_call(call: Call | Gathered | None) -> str:
    match call:
        case Gathered():
            return f"asyncio.gather of {len(call.children)} steps"
        case StepCall():
            return f"step {call.name!r}"
        case SleepCall():
            return "a sleep"
        case EventCall():
            return f"wait_for_event({call.hook_id!r})"
        case AttributesCall():
            return "set_attributes"
        case ProgressCall():
            return "report_progress"
        case StartChildCall():
            return f"start_child of {call.workflow.name!r}"
        case ChildResultCall():
            return f"the result of child {call.handle.run_id!r}"
        case RecvCall():
            return f"recv({call.topic!r})"
        case PatchCall():
            return f"patched({call.patch_id!r})"
    return "the end of the workflow"


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
        session = self.sessions.get(snapshot.run_id)
        if session is None:
            return True
        unconfirmed = session.unconfirmed
        return bool(unconfirmed) and not all(
            _agrees(snapshot, k, v) for k, v in unconfirmed.items()
        )

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

    def at_step(self, run_id: str, step_id: str) -> tuple[Session, StepCall] | None:
        """The run's session and its call, if its coroutine is at step `step_id`."""
        session = self.sessions.get(run_id)
        if session is None:
            return None
        call = session.call
        if isinstance(call, StepCall) and str(session.position) == step_id:
            return session, call
        if isinstance(call, Gathered):
            found = call.at(step_id)
            return None if found is None else (session, found)
        return None

    def arguments(self, held: tuple[Session, StepCall], step_input: bytes) -> Sequence[Any]:
        """The arguments to run the held call's body with, for a step recorded with `step_input`.

        They are the call's own when decoding `step_input` would give them back, else decoded.
        """
        session, call = held
        if (
            self.exact
            and step_input == session.call_input
            and all(type(arg) in ROUND_TRIP_TYPES for arg in call.args)
        ):
            return call.args
        decoded: Sequence[Any] = self.codec.decode(step_input)
        return decoded

    def ran(self, held: tuple[Session, StepCall], step_id: str, output: bytes, value: Any) -> None:
        """Note that the held call's body returned `value`, recorded as `output`."""
        if self.exact and round_trips(value):
            held[0].produced = (step_id, output, value)

    def forget(self, run_id: str) -> None:
        """Drop the run's session, if any."""
        session = self.sessions.pop(run_id, None)
        if session is not None:
            session.close()

    def observe(self, envelope: Envelope) -> None:
        """Confirm what the engine appended; a mismatch or the run's end drops the session."""
        event = envelope.event
        if type(event) not in _OBSERVED:  # most events: a step's creation or start
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

    # --- the interpreter proper ---------------------------------------------------------------

    def consumed(
        self, session: Session, durable: Snapshot | None, key: Consumed, expected: Expected
    ) -> None:
        """Note a result fed to the coroutine: unconfirmed unless `durable` already holds it."""
        if durable is None or not _agrees(durable, key, expected):
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
                    _describe_recorded(snapshot, beyond_id)
                    if _recorded(snapshot, beyond_id)
                    else None
                )
                if beyond is not None:
                    raise FlowNonDeterminism(
                        run_id=run_id,
                        call=session.position + 1,
                        recorded=beyond,
                        asked=_describe_call(None),
                    )
                if session.failure is None:
                    try:
                        return Complete(output=self.codec.encode(session.result))
                    except Exception as exc:  # a value the codec cannot take fails the run
                        session.failure = _payload_error("the workflow's return value", exc)
                failure = as_failure(session.failure, run_id=run_id, where="the workflow code")
                return Fail(error=error_payload(failure), error_code=type(failure).__name__)
            match call:
                case StepCall():
                    decision = self.on_step(session, snapshot, durable, call, call_id)
                case SleepCall():
                    decision = self.on_sleep(session, snapshot, durable, call, call_id)
                case EventCall():
                    decision = self.on_event(session, snapshot, durable, call, call_id)
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
            asked=_describe_call(session.call),
        )

    def recorded_at(self, snapshot: Snapshot, call_id: str) -> str | None:
        """What the history holds at `call_id`, described, or None when nothing."""
        return _describe_recorded(snapshot, call_id) if _recorded(snapshot, call_id) else None

    def other_kind(self, session: Session, snapshot: Snapshot, call_id: str) -> None:
        """Raise if the history holds another kind of call at `call_id`."""
        if not _recorded(snapshot, call_id):
            return
        recorded = _describe_recorded(snapshot, call_id)
        if recorded is not None:
            self.mismatch(session, snapshot, recorded)

    def on_step(
        self,
        session: Session,
        snapshot: Snapshot,
        durable: Snapshot | None,
        call: StepCall,
        call_id: str,
    ) -> RuntimeDecision | None:
        """Schedule the step, or feed its recorded outcome to the coroutine (None then)."""
        self.bodies[call.name] = call.fn
        step_input = session.call_input
        if step_input is None:  # encoded once per call, however often the call is decided on
            try:
                step_input = session.call_input = self.codec.encode(list(call.args))
            except Exception as exc:  # raised at the call, as a bad argument would be
                what = f"the arguments of step {call.name!r} (call {call_id})"
                session.resume(error=_payload_error(what, exc))
                return None
        steps = snapshot.steps
        # `in` first: a miss through `get` raises and catches a KeyError inside the mapping.
        if call_id not in steps:
            self.other_kind(session, snapshot, call_id)
            return ScheduleStep(
                step_id=call_id,
                step_name=call.name,
                input=step_input,
                retry=call.retry,
                timeout=call.timeout,
            )
        step = steps[call_id]
        if step.step_name != call.name:
            self.mismatch(session, snapshot, f"step {step.step_name!r}")
        if step.input != step_input:
            self.mismatch(session, snapshot, f"step {step.step_name!r} with another input")
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
            self.consumed(session, durable, ("step", call_id), ("completed", output))
            produced = session.produced
            if produced is not None and produced[0] == call_id and produced[1] == output:
                session.resume(produced[2])  # what decoding `output` gives
            else:
                session.resume(self.codec.decode(output))
            return None
        message = (step.error or b"").decode(errors="replace")
        self.consumed(session, durable, ("step", call_id), (step.status, step.error))
        session.resume(error=StepError(call.name, message))
        return None

    def on_sleep(
        self,
        session: Session,
        snapshot: Snapshot,
        durable: Snapshot | None,
        call: SleepCall,
        call_id: str,
    ) -> RuntimeDecision | None:
        """Create or keep waiting on the wait, or resume the coroutine once it completed."""
        wait = snapshot.waits.get(call_id)
        if wait is None or call_id in snapshot.hooks:  # a hook: a wait_for_event's time-out
            self.other_kind(session, snapshot, call_id)
            now = self.clock()
            try:
                resume_at = now + call.delay
            except OverflowError:  # past year 9999: as good as for ever, which a wait can be
                resume_at = datetime.max.replace(tzinfo=now.tzinfo)
            return WaitUntil(wait_id=call_id, resume_at=resume_at)
        if wait.status == "waiting":
            return WaitUntil(wait_id=call_id, resume_at=wait.resume_at)
        self.consumed(session, durable, ("wait", call_id), ("completed", None))
        session.resume(None)
        return None

    def on_event(
        self,
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
            self.other_kind(session, snapshot, call_id)
            earlier = _earlier_holder(snapshot, call.token)
            if earlier is not None:  # a finished wait_for_event of this run: free the token
                return CloseHook(hook_id=earlier)
            return AwaitHook(hook_id=call_id, token=call.token, metadata=metadata)
        if hook.metadata != metadata:
            recorded = _describe_recorded(snapshot, call_id) or "a wait_for_event"
            self.mismatch(session, snapshot, recorded)
        if hook.token != call.token:
            self.mismatch(session, snapshot, f"wait_for_event({call.hook_id!r}) with another token")
        if hook.deliveries:
            # Deliveries are appended before anyone is shown them: nothing to confirm.
            session.resume(self.codec.decode(hook.deliveries[0].payload))
            return None
        if call.timeout is None:
            return AwaitHook(hook_id=call_id, token=call.token, metadata=metadata)
        if hook.status != "active":  # closed at its time-out, before any delivery
            self.consumed(session, durable, ("hook", call_id), ("disposed", None))
            session.resume(None)
            return None
        wait = snapshot.waits.get(call_id)
        if wait is None:
            return WaitUntil(wait_id=call_id, resume_at=self.clock() + call.timeout)
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
