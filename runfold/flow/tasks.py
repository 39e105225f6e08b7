"""Tasks in workflow code: `asyncio.TaskGroup` of steps, made deterministic.

While the interpreter runs workflow code (`Session.resume`), the running event loop is the
session's `WorkflowLoop` and the current task a stand-in (`WorkflowTask`), so `asyncio.TaskGroup`
works on them: `tg.create_task(step(fn, x))` returns the step's `Pending` itself as the task
(nothing runs on the event loop), kept in creation order. When the group's block ends and it
awaits its tasks, `grouped` finds the group's steps not yet awaited, in creation order: the
interpreter runs them as it runs `asyncio.gather` (`runfold.flow.parallel`): they take the next
call ids in the order they were created (not the order they finish), their starts go in one
append, each is retried and replayed on its own, and they are resolved in id order, so the
group raises the same `ExceptionGroup` on every replay.

What cannot be made deterministic is refused with `UnsupportedAwait`, naming it, and fails the
run (whatever the code does with the error): a task of
anything but a `step(...)` call (a coroutine would run on the event loop, interleaved with
others as their awaits happen to end), and the event loop's timers and I/O (`asyncio.sleep` is
`runfold.flow.sleep`). A step task that fails does not cancel its siblings: they were started
together and have all ended by the time the group raises. A group whose block raised abandons
its steps not yet run (as asyncio cancels them): they are never started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from runfold.flow.calls import Pending, StepCall
from runfold.flow.errors import UnsupportedAwait

__all__ = ["WorkflowLoop", "WorkflowTask", "abandoned", "grouped"]

_log = logging.getLogger("runfold.flow")


class WorkflowTask:
    """The current task workflow code sees: a `TaskGroup`'s parent, never cancelled by it.

    A group whose step failed asks its parent to cancel itself (to stop the block's own
    awaits); the group's steps have all ended by then, so there is nothing to stop.
    """

    __slots__ = ()

    def cancel(self, msg: Any = None) -> bool:
        """Refused: workflow code is ended by the run's cancellation, not by a group."""
        return False

    def uncancel(self) -> int:
        """No cancellation pending: 0."""
        return 0

    def cancelling(self) -> int:
        """No cancellation pending: 0."""
        return 0

    def done(self) -> bool:
        """Never, while its code runs."""
        return False


class WorkflowLoop:
    """The event loop workflow code sees: tasks of steps, futures; no timers, no I/O.

    Anything else asked of it raises `UnsupportedAwait` naming what was asked.
    """

    __slots__ = ("refused", "tasks")

    def __init__(self) -> None:
        self.tasks: list[Pending] = []  # step tasks created, in creation order, until done
        # What was refused: it fails the run, whatever the code does with the error raised.
        self.refused: UnsupportedAwait | None = None

    def create_task(self, coro: Any, *, name: Any = None, context: Any = None, **_: Any) -> Any:
        """The step's `Pending` as the task, for a `step(...)` call; refused for anything else.

        Raises:
            UnsupportedAwait: `coro` is not a `step(...)` call.
        """
        if isinstance(coro, Pending) and isinstance(coro.call, StepCall):
            self.tasks.append(coro)
            return coro
        shown = getattr(coro, "__qualname__", type(coro).__name__)
        close = getattr(coro, "close", None)
        if asyncio.iscoroutine(coro) and close is not None:
            close()  # never run: no "never awaited" warning
        self.refused = UnsupportedAwait(
            f"workflow code made a task of {shown}: a task in workflow code (asyncio.TaskGroup's "
            "create_task) may only be a step(...) call, which runs durably; await a coroutine "
            "directly, or make each of its parts a step"
        )
        raise self.refused

    def create_future(self) -> asyncio.Future[Any]:
        """A future of this loop (a `TaskGroup` awaits one for its tasks)."""
        return asyncio.Future(loop=self)  # type: ignore[arg-type]

    def get_debug(self) -> bool:
        """Not in debug mode."""
        return False

    def is_closed(self) -> bool:
        """Open while workflow code runs."""
        return False

    def is_running(self) -> bool:
        """Running while workflow code runs."""
        return True

    def call_soon(self, callback: Callable[..., object], *args: Any, context: Any = None) -> None:
        """Run `callback(*args)` at once (a future's done callbacks, in a fixed order)."""
        if context is None:
            callback(*args)
        else:
            context.run(callback, *args)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Log what asyncio reports (a future's error nobody retrieved, say)."""
        _log.warning("workflow code: %s", context.get("message", "an error in a task"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # asyncio's own probes: not there
            raise AttributeError(name)
        self.refused = UnsupportedAwait(
            f"workflow code asked the event loop for {name}: everything a workflow waits on "
            "must be durable (asyncio.sleep is runfold.flow.sleep; I/O belongs in a step)"
        )
        raise self.refused


def grouped(yielded: object, loop: WorkflowLoop) -> tuple[Pending, ...] | None:
    """The steps of the `TaskGroup` whose end the workflow awaits, or None if it is not one.

    A group awaits a future it made (`_on_completed_fut`) and finds each task's end through its
    done callback (`_on_task_done`): the group's tasks are those whose callback belongs to the
    group that made `yielded`. They come in creation order.
    """
    if not loop.tasks or not isinstance(yielded, asyncio.Future):
        return None
    loop.tasks = [task for task in loop.tasks if not task.done()]
    members = tuple(task for task in loop.tasks if _group_of(task, yielded) is not None)
    return members or None


def abandoned(members: tuple[Pending, ...], yielded: object) -> bool:
    """Whether the group of `members` is aborting (its block raised).

    Then its steps not yet run are abandoned, as asyncio cancels a group's tasks, and the group
    goes on at once.
    """
    group = _group_of(members[0], yielded)
    if not getattr(group, "_aborting", False):
        return False
    for task in members:
        task.abandon()
    return True


def _group_of(task: Pending, future: object) -> asyncio.TaskGroup | None:
    for callback in getattr(task, "_callbacks", ()):
        group = getattr(callback, "__self__", None)
        # The future a group awaits its tasks on is private to it (asyncio.TaskGroup).
        done = getattr(group, "_on_completed_fut", None)
        if isinstance(group, asyncio.TaskGroup) and done is future:
            return group
    return None
