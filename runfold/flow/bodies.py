"""Running a step's function: `async def` bodies on the loop, plain `def` bodies in a pool.

A plain `def` may block (a payment API's client, a file), so it runs in a thread of the Flow's
pool with the caller's context (`current_step()`, `workflow_info()` work there too); an
`async def` is awaited on the loop. `step_threads=0` runs `def` bodies on the loop, for bodies
that never block. Whether a function is an `async def` is remembered, not asked again per step.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from runfold.engine import StepInvocation
from runfold.flow.errors import FlowError
from runfold.flow.info import CURRENT_STEP
from runfold.flow.threads import StepThreads

__all__ = ["StepBodies", "current_step"]

# What a step body commonly returns, and can never be awaited: `inspect.isawaitable` is skipped.
_NEVER_AWAITABLE = frozenset({str, bytes, int, float, bool, type(None), list, dict, tuple})

_REMEMBERED_BODIES = 1024
"""How many step functions a Flow remembers the kind of (`async def` or not)."""


def current_step() -> StepInvocation:
    """The attempt of the step body running now (its `idempotency_key`, its `attempt`).

    Raises:
        FlowError: No step body is running.
    """
    found = CURRENT_STEP.get()
    if found is None:
        raise FlowError("current_step() is for step bodies run by a Flow")
    invocation: StepInvocation = found[0]
    return invocation


class StepBodies:
    """The step functions of one `Flow`, and the pool its plain `def` bodies run in.

    `Flow.run_step` sets the step's context (`CURRENT_STEP`) and awaits an `async def` body
    itself, or `plain` for a `def` one: no coroutine of this class's between it and the body.
    """

    def __init__(self, step_threads: int) -> None:
        if step_threads < 0:
            raise ValueError("step_threads must be 0 (on the loop) or more")
        self.step_threads = step_threads
        self._threads: StepThreads | None = None  # made on the first `def` step
        self._async_bodies: dict[Callable[..., Any], bool] = {}  # step bodies: `async def`?

    def is_async(self, fn: Callable[..., Any]) -> bool:
        """Whether `fn` is an `async def` (remembered: asked per step)."""
        try:
            return self._async_bodies[fn]
        except (KeyError, TypeError):  # not seen yet, or a callable that is not hashable
            return self._remember_kind(fn)

    async def plain(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        """`fn(*args)`'s result for a plain `def` `fn`, run in the pool.

        It runs with the caller's context (on the loop with `step_threads=0`); an awaitable it
        returns is awaited.
        """
        if not self.step_threads:  # bodies that never block: no thread hop
            result = fn(*args)
        else:  # a plain `def` may block: it runs in the pool, with this context
            context = contextvars.copy_context()
            call = functools.partial(context.run, _outcome, fn, tuple(args))
            raised, result = await self.threads.run(call)
            if raised:  # raised here, on the loop, as an on-loop body's would be
                raise result
        if type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result):
            result = await result
        return result

    def _remember_kind(self, fn: Callable[..., Any]) -> bool:
        """Whether `fn` is an `async def`, remembered (for a bounded number of functions)."""
        found = inspect.iscoroutinefunction(fn)
        if len(self._async_bodies) >= _REMEMBERED_BODIES:
            self._async_bodies.clear()
        with contextlib.suppress(TypeError):
            self._async_bodies[fn] = found
        return found

    @property
    def threads(self) -> StepThreads:
        """The pool that runs plain `def` step bodies (`step_threads` threads at most)."""
        if self._threads is None:
            self._threads = StepThreads(self.step_threads, name="runfold-step")
        return self._threads


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """`(False, fn(*args))`, or `(True, exception)` for any exception it raised.

    A `BaseException` (`GeneratorExit`, `SystemExit`) that crossed from the pool's thread into
    the loop's future would unwind the awaiting coroutines without their handlers; returned as a
    value, it is raised on the loop, where the engine's rule for step bodies applies.
    """
    try:
        return False, fn(*args)
    except BaseException as exc:
        return True, exc
