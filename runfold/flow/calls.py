"""What workflow code awaits: `step`, `sleep`, `wait_for_event` and the run's records.

The records are `set_attributes` and `report_progress`.

Each returns an awaitable that hands a call description to the interpreter driving the
workflow coroutine (`runfold.flow.interpreter`) and resumes with the call's recorded result.
They work only inside a workflow run by a `Flow`: awaited elsewhere (a plain asyncio task) they
raise `NotInWorkflow` instead of reaching the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import attrs

from runfold.flow.errors import NotInWorkflow
from runfold.kernel import RetryPolicy

if TYPE_CHECKING:
    from runfold.flow.definition import Workflow

__all__ = [
    "CALL_TYPES",
    "AttributesCall",
    "Call",
    "ChildHandle",
    "ChildResultCall",
    "ContinueCall",
    "EventCall",
    "PatchCall",
    "Pending",
    "ProgressCall",
    "RecvCall",
    "SleepCall",
    "StartChildCall",
    "StepCall",
    "child",
    "recv",
    "report_progress",
    "set_attributes",
    "sleep",
    "start_child",
    "step",
    "wait_for_event",
]

T = TypeVar("T")

# Set by the interpreter while it runs workflow code: the calls check it to fail clearly.
IN_WORKFLOW: ContextVar[bool] = ContextVar("runfold_flow_in_workflow", default=False)


class StepCall:
    """`await step(fn, *args)`: run `fn(*args)` once, durably, and resume with its result.

    One is made per `await step(...)`, on the event loop: a plain slotted class, as an attrs
    frozen class takes several times as long to build. Treat it as immutable.
    """

    __slots__ = ("args", "fn", "name", "retry", "timeout")

    def __init__(
        self,
        *,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        name: str,
        retry: RetryPolicy | None,
        timeout: timedelta | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.name = name
        self.retry = retry
        self.timeout = timeout

    def __repr__(self) -> str:
        return (
            f"StepCall(name={self.name!r}, args={self.args!r}, retry={self.retry!r}, "
            f"timeout={self.timeout!r})"
        )


@attrs.frozen(kw_only=True)
class SleepCall:
    """`await sleep(delay)`: resume after a durable timer of `delay`."""

    delay: timedelta


@attrs.frozen(kw_only=True)
class EventCall:
    """`await wait_for_event(hook_id, token=...)`: resume with the first payload delivered.

    With a `timeout`, resume with None once it passed without a delivery.
    """

    hook_id: str
    token: str = attrs.field(repr=False)
    timeout: timedelta | None = None


def _frozen_changes(value: Mapping[str, str | None]) -> Mapping[str, str | None]:
    return dict(value)


@attrs.frozen(kw_only=True)
class AttributesCall:
    """`await set_attributes(changes)`: record attribute changes on the run, once."""

    changes: Mapping[str, str | None] = attrs.field(converter=_frozen_changes)


@attrs.frozen(kw_only=True)
class ProgressCall:
    """`await report_progress(completed, ...)`: record a progress report, once."""

    completed: int
    total: int | None = None
    message: str | None = None


@attrs.frozen(kw_only=True)
class PatchCall:
    """`await patched(patch_id)` (or `deprecated_patch`): whether the run takes the new code.

    Unlike the other calls it takes no call id: a run recorded before the patch has nothing
    for it (see `runfold.flow.patches`).
    """

    patch_id: str
    deprecated: bool = False


@attrs.frozen(kw_only=True)
class RecvCall:
    """`await recv(topic, timeout=...)`: the next message sent to the run on `topic`."""

    topic: str | None = None
    timeout: timedelta | None = None


@attrs.frozen(kw_only=True)
class StartChildCall:
    """`await start_child(workflow, input, ...)`: create a child run, linked to this one."""

    workflow: Workflow
    input: Any
    run_id: str | None = None
    timeout: timedelta | None = None


CANCEL_CHILD_STEP = "runfold.cancel_child"
"""The name of the step `ChildHandle.cancel` records."""


async def cancel_child(flow: Any, run_id: str, reason: str) -> None:
    """The body of `ChildHandle.cancel`'s step, which the parent's `Flow` runs with itself."""
    await flow.cancel_child(run_id, reason)


@attrs.frozen(kw_only=True)
class ChildHandle:
    """A child run started by `start_child`: its `run_id`, and `await handle.result()`."""

    run_id: str
    workflow_name: str
    call_id: str
    """The id of the `start_child` call in the parent's history (its link's `reference_id`)."""

    def result(self) -> Any:
        """Suspend until the child run ends; its output, decoded.

        Raises:
            ChildWorkflowError: The child failed, was cancelled or timed out.
        """
        return Pending(ChildResultCall(handle=self))

    def cancel(self, reason: str | None = None) -> Any:
        """Ask the child run to cancel, as `Flow.cancel` does, once: a step of this run.

        The step (named `runfold.cancel_child`) records the request; a child that already
        ended, or is already cancelling, is left as it is. `await handle.result()` then
        raises `ChildWorkflowError` for a child that ended cancelled.
        """
        why = reason if reason is not None else "cancelled by its parent run"
        return step(cancel_child, self.run_id, why, name=CANCEL_CHILD_STEP)


@attrs.frozen(kw_only=True)
class ContinueCall:
    """`await continue_as_new(input)`: end the run and start its successor with `input`."""

    input: Any
    workflow: Workflow | None = None
    """The successor's workflow; None: this run's."""


@attrs.frozen(kw_only=True)
class ChildResultCall:
    """`await handle.result()`: resume with the child's output once it ended."""

    handle: ChildHandle


Call: TypeAlias = (
    StepCall
    | SleepCall
    | EventCall
    | AttributesCall
    | ProgressCall
    | StartChildCall
    | ChildResultCall
    | RecvCall
    | ContinueCall
    | PatchCall
)
"""Everything workflow code can await."""
CALL_TYPES = (
    StepCall,
    SleepCall,
    EventCall,
    AttributesCall,
    ProgressCall,
    StartChildCall,
    ChildResultCall,
    RecvCall,
    ContinueCall,
    PatchCall,
)
"""The classes of `Call`, for `isinstance`."""


class Pending:
    """The awaitable a call returns: it yields the call to the interpreter, once.

    It also passes for an asyncio future (`_asyncio_future_blocking`, `add_done_callback`,
    `result`, ...), so that `asyncio.gather(step(a), step(b))` takes it as it is instead of
    wrapping it in a task on the event loop: the gathering future the workflow then awaits
    reaches the interpreter, which runs the steps together and `resolve`s each (see
    `runfold.flow.parallel`). Nothing else ever completes it.
    """

    __slots__ = ("_callbacks", "_outcome", "call")
    _asyncio_future_blocking = False  # what `asyncio.isfuture` looks for

    def __init__(self, call: Call) -> None:
        self.call = call
        # Both set here, not left absent: a missing slot read with `hasattr` or a default
        # raises and catches an AttributeError, on every `await step(...)`.
        self._callbacks: tuple[Callable[[Pending], object], ...] = ()
        self._outcome: tuple[Any, BaseException | None] | None = None  # (value, error) once known

    def __await__(self) -> Generator[Call, Any, Any]:
        if not IN_WORKFLOW.get():
            raise NotInWorkflow(
                f"{type(self.call).__name__} was awaited outside a workflow run by a Flow"
            )
        if self._outcome is not None:  # a task whose step a TaskGroup already ran
            return self.result()
        if not self._callbacks:
            return (yield self.call)
        try:  # a task (of a TaskGroup) awaited in the group's block: its end concerns the group
            value = yield self.call
        except Exception as exc:
            self.resolve(error=exc)
            raise
        self.resolve(value)
        return value

    # --- what asyncio.gather asks of a future -------------------------------------------------

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (the one the interpreter runs on)."""
        if not IN_WORKFLOW.get():
            raise NotInWorkflow(
                f"{type(self.call).__name__} was gathered outside a workflow run by a Flow"
            )
        return asyncio.get_running_loop()

    def add_done_callback(self, fn: Callable[[Pending], object], *, context: Any = None) -> None:
        """Call `fn(self)` once `resolve`d (at once, by the interpreter)."""
        self._callbacks = (*self._callbacks, fn)

    def remove_done_callback(self, fn: Callable[[Pending], object]) -> int:
        """Forget `fn`; how many were removed."""
        kept = tuple(cb for cb in self._callbacks if cb != fn)
        removed = len(self._callbacks) - len(kept)
        self._callbacks = kept
        return removed

    def done(self) -> bool:
        """Whether the call's outcome is known."""
        return self._outcome is not None

    def cancelled(self) -> bool:
        """Whether the call was `abandon`ed: a durable call is not cancelled from workflow code."""
        outcome = self._outcome
        return outcome is not None and isinstance(outcome[1], asyncio.CancelledError)

    def cancel(self, msg: Any = None) -> bool:
        """Refused (False): a durable call is not cancelled from workflow code."""
        return False

    def exception(self) -> BaseException | None:
        """The call's error, once resolved."""
        if self._outcome is None:
            raise asyncio.InvalidStateError("the call is not resolved yet")
        return self._outcome[1]

    def result(self) -> Any:
        """The call's result, once resolved; its error raised."""
        if self._outcome is None:
            raise asyncio.InvalidStateError("the call is not resolved yet")
        value, error = self._outcome
        if error is not None:
            raise error
        return value

    def abandon(self) -> None:
        """Mark the call cancelled: its coroutine is being dropped before it was run."""
        self.resolve(error=asyncio.CancelledError())

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        """Record the call's outcome and run the callbacks (gather's bookkeeping)."""
        self._outcome = (value, error)
        for callback in self._callbacks:
            callback(self)


def step(
    fn: Callable[..., T],
    *args: Any,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: timedelta | float | None = None,
) -> Any:
    """Run `fn(*args)` (sync or async) as a durable step and resume with its result.

    The result is recorded, so a replay resumes with it without running `fn` again; a crash
    while `fn` runs runs it again (at least once). `name` defaults to `fn`'s qualified name;
    `retry` defaults to the engine's policy. A step failing for good raises `StepError` here.
    A step recorded before a deploy keeps its recorded retry policy; a changed `retry` applies
    to steps created after it. An attempt of an `async` `fn` that has not returned after
    `timeout` (a timedelta, or seconds; default the engine's `step_timeout`, 10 minutes) fails
    as timed out (`StepTimedOut`) and is retried per `retry`; a sync `fn` (run in the Flow's
    thread pool) cannot be stopped.
    """
    chosen = name if name is not None else getattr(fn, "__qualname__", type(fn).__name__)
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    if timeout is not None and timeout <= timedelta(0):
        raise ValueError("a step timeout must be positive")
    return Pending(StepCall(fn=fn, args=args, name=chosen, retry=retry, timeout=timeout))


def sleep(delay: timedelta | float) -> Any:
    """Sleep on a durable timer: `delay` (a timedelta, or seconds) from when it is first reached.

    Nothing sleeps in memory: the run is suspended, and the `Flow` that finds the timer due
    (`run_until_idle`) resumes it, in this process or another.
    """
    if not isinstance(delay, timedelta):
        delay = timedelta(seconds=delay)
    if delay < timedelta(0):
        raise ValueError("a sleep cannot be negative")
    return Pending(SleepCall(delay=delay))


def wait_for_event(hook_id: str, *, token: str, timeout: timedelta | float | None = None) -> Any:
    """Suspend until a payload is delivered to `token` (`Flow.deliver`), and resume with it.

    `hook_id` names the event in the run (it is recorded as the hook's metadata); `token` is the
    secret the sender uses, unique among live hooks. The first delivery resumes the workflow,
    and the hook stays open (holding its token) until another `wait_for_event` of the run asks
    for the same token, which closes it first. With a `timeout` (a timedelta, or seconds, from
    when the call is first reached), a durable timer runs beside the hook: once it is due
    without a delivery, the hook is closed (a late delivery gets `HookNotFound`) and the
    workflow resumes with None.

    Raises:
        ValueError: `hook_id` is empty or `timeout` is negative.
    """
    if not hook_id:
        raise ValueError("wait_for_event needs a hook_id")
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    if timeout is not None and timeout < timedelta(0):
        raise ValueError("a wait_for_event timeout cannot be negative")
    return Pending(EventCall(hook_id=hook_id, token=token, timeout=timeout))


def set_attributes(changes: Mapping[str, str | None]) -> Any:
    """Set the run's attributes (a None value removes the key), recorded once, in order.

    They are what `runfold show`, `runfold runs --json` and the inspector show: a stage, a
    customer id. A key starting with `$` is reserved to runfold.

    Raises:
        InvalidAttributes: (from the Flow call driving the run) a key or value the kernel refuses.
    """
    return Pending(AttributesCall(changes=changes))


def report_progress(completed: int, *, total: int | None = None, message: str | None = None) -> Any:
    """Record a progress report (`completed` of `total`, with a message), once, in order.

    The latest report is what `runfold show` and the inspector show as the run's progress.

    Raises:
        ValueError: `completed` is negative or `total` is below it.
    """
    if completed < 0 or (total is not None and total < completed):
        raise ValueError("progress needs 0 <= completed <= total")
    return Pending(ProgressCall(completed=completed, total=total, message=message))


def start_child(
    workflow: Workflow,
    input: Any,
    *,
    run_id: str | None = None,
    timeout: timedelta | None = None,
) -> Any:
    """Start a child run of `workflow` with `input`; resume with its `ChildHandle` at once.

    The child is linked to this run (`child_linked`, and the child's `parent_run_id`); its id
    is `run_id`, else `<this run's id>/<call id>`, so a replay finds the same child. It runs
    on its own (the `Flow` drives it as soon as the parent's decision is recorded); `await
    handle.result()` suspends the parent until it ends, without polling. When the parent ends
    (completed, failed, cancelled or timed out) while a child is still live, the child is
    cancelled. `timeout` gives the child a deadline from its creation (see `Flow.start`).
    """
    if timeout is not None and timeout <= timedelta(0):
        raise ValueError("a child's timeout must be positive")
    return Pending(StartChildCall(workflow=workflow, input=input, run_id=run_id, timeout=timeout))


async def child(
    workflow: Workflow,
    input: Any,
    *,
    run_id: str | None = None,
    timeout: timedelta | None = None,
) -> Any:
    """`await start_child(...)`, then `await handle.result()`: the child's output.

    Raises:
        ChildWorkflowError: The child failed, was cancelled or timed out.
    """
    handle: ChildHandle = await start_child(workflow, input, run_id=run_id, timeout=timeout)
    return await handle.result()


def recv(topic: str | None = None, *, timeout: timedelta | float | None = None) -> Any:
    """The next message `Flow.send` sent to this run on `topic` (DBOS's `recv`), or None.

    Messages are kept in the run (a hook per topic) from the moment they are sent, before the
    workflow asks or while it does; each `recv` of a topic takes the next one, in the order
    they were recorded, so each message is received once. Without one waiting, the run
    suspends until one is sent, or, with a `timeout` (a timedelta, or seconds, from when the
    call is first reached), until the timeout passed: then it resumes with None, and a
    message sent later is left for the next `recv`.

    Raises:
        ValueError: `timeout` is negative.
    """
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    if timeout is not None and timeout < timedelta(0):
        raise ValueError("a recv timeout cannot be negative")
    return Pending(RecvCall(topic=topic, timeout=timeout))
