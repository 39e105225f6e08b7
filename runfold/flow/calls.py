"""What workflow code awaits: `step`, `sleep` and `wait_for_event`.

Each returns an awaitable that hands a call description to the interpreter driving the
workflow coroutine (`runfold.flow.interpreter`) and resumes with the call's recorded result.
They work only inside a workflow run by a `Flow`: awaited elsewhere (a plain asyncio task) they
raise `NotInWorkflow` instead of reaching the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, TypeAlias, TypeVar

import attrs

from runfold.flow.errors import NotInWorkflow
from runfold.kernel import RetryPolicy

__all__ = ["Call", "EventCall", "SleepCall", "StepCall", "sleep", "step", "wait_for_event"]

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
    """`await wait_for_event(hook_id, token=...)`: resume with the first payload delivered."""

    hook_id: str
    token: str = attrs.field(repr=False)


Call: TypeAlias = StepCall | SleepCall | EventCall
"""Everything workflow code can await."""


class _Pending:
    """The awaitable a call returns: it yields the call to the interpreter, once."""

    __slots__ = ("call",)

    def __init__(self, call: Call) -> None:
        self.call = call

    def __await__(self) -> Generator[Call, Any, Any]:
        if not IN_WORKFLOW.get():
            raise NotInWorkflow(
                f"{type(self.call).__name__} was awaited outside a workflow run by a Flow"
            )
        return (yield self.call)


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
    as timed out (`StepTimedOut`) and is retried per `retry`; a sync `fn` runs on the event
    loop and cannot be stopped.
    """
    chosen = name if name is not None else getattr(fn, "__qualname__", type(fn).__name__)
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    if timeout is not None and timeout <= timedelta(0):
        raise ValueError("a step timeout must be positive")
    return _Pending(StepCall(fn=fn, args=args, name=chosen, retry=retry, timeout=timeout))


def sleep(delay: timedelta | float) -> Any:
    """Sleep on a durable timer: `delay` (a timedelta, or seconds) from when it is first reached.

    Nothing sleeps in memory: the run is suspended, and the `Flow` that finds the timer due
    (`run_until_idle`) resumes it, in this process or another.
    """
    if not isinstance(delay, timedelta):
        delay = timedelta(seconds=delay)
    if delay < timedelta(0):
        raise ValueError("a sleep cannot be negative")
    return _Pending(SleepCall(delay=delay))


def wait_for_event(hook_id: str, *, token: str) -> Any:
    """Suspend until a payload is delivered to `token` (`Flow.deliver`), and resume with it.

    `hook_id` names the event in the run (it is recorded as the hook's metadata); `token` is the
    secret the sender uses, unique among live hooks. The first delivery resumes the workflow.
    """
    if not hook_id:
        raise ValueError("wait_for_event needs a hook_id")
    return _Pending(EventCall(hook_id=hook_id, token=token))
