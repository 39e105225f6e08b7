"""A `Session`: one live workflow coroutine, run from one `runfold.flow` call to the next.

The interpreter (`runfold.flow.interpreter`) keeps a session per run it decides, and feeds the
coroutine each call's recorded result (`resume`) until it asks for something not yet done. A
coroutine that awaits anything but a `runfold.flow` call (or `asyncio.gather` of steps) ends
the session with `UnsupportedAwait`: everything a workflow waits on must be durable.

The code runs in the session's own `contextvars` context (a copy of the one the session started
in, marked as workflow code of its run), entered for each resume: a context variable the code
sets lasts across its awaits, as in an asyncio task, and none is set and reset per resume.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from asyncio.events import _get_running_loop, _set_running_loop
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Coroutine
from typing import Any, TypeAlias

from runfold.engine.raised import CODE_BASE_EXCEPTIONS, error_text
from runfold.flow.calls import CALL_TYPES, IN_WORKFLOW, Call, PatchCall
from runfold.flow.errors import UnsupportedAwait
from runfold.flow.gathering import Gathered, gathered
from runfold.flow.info import CURRENT_INFO, CURRENT_STEP, WorkflowInfo
from runfold.flow.tasks import WorkflowLoop, WorkflowTask, abandoned, grouped

__all__ = ["Consumed", "Expected", "Session"]

_log = logging.getLogger("runfold.flow")
# What workflow code fails with: any exception, and SystemExit and the like raised of itself.
_FAILURES: tuple[type[BaseException], ...] = (Exception, *CODE_BASE_EXCEPTIONS)

# The current task workflow code sees (a TaskGroup's parent); it holds nothing.
_TASK = WorkflowTask()
# What a TaskGroup holds when its coroutine is dropped: not the code's doing.
_LEFT = (GeneratorExit, asyncio.CancelledError)

Consumed: TypeAlias = tuple[str, str]
"""A result a session consumed, by kind and id.

("step", id), ("wait", id), ("hook", id) (a wait_for_event that timed out), ("attributes", id),
("progress", id), ("child", id).
"""
Expected: TypeAlias = tuple[str, bytes | None]
"""What the history must hold for a `Consumed` result.

(status, payload) for a step, ("completed", None) for a wait, ("disposed", None) for a hook,
("recorded", None) for a record, ("linked", None) for a child.
"""


class Session:
    """One live workflow coroutine, stopped at its `position`-th call (or finished)."""

    __slots__ = (
        "call",
        "call_input",
        "confirmed",
        "context",
        "coro",
        "empty_kinds",
        "failure",
        "family",
        "finished",
        "info",
        "loop",
        "position",
        "produced",
        "received",
        "result",
        "unconfirmed",
    )

    def __init__(self, coro: Coroutine[Any, Any, Any], info: WorkflowInfo) -> None:
        self.coro = coro
        self.info = info  # what `workflow_info()` answers in the run's code
        # The context the code runs in, entered per resume (no variable set and reset each
        # time): that of the session's start, marked as workflow code of the run.
        self.context = contextvars.copy_context()
        self.context.run(_mark, info)
        self.loop = WorkflowLoop()  # the event loop the code sees (`runfold.flow.tasks`)
        self.family = False  # whether the code started a child (its end concerns them)
        self.received: dict[str, int] = {}  # messages taken so far, by mailbox hook id
        self.position = 0  # calls issued so far; the current one has id str(position)
        self.call: Call | Gathered | None = None
        self.call_input: bytes | None = None  # the current step call's arguments, encoded
        self.finished = False
        self.result: Any = None
        self.failure: BaseException | None = None
        self.unconfirmed: dict[Consumed, Expected] = {}
        self.confirmed = 0  # the sequence of the last result the engine's appends confirmed
        # (step id, encoded, value): a result this process's body produced for the current
        # call, that decoding its recorded output gives back as itself (see `Interpreter.ran`).
        self.produced: tuple[str, bytes, Any] | None = None
        # The history's other kinds than steps (`history.other_kinds`) last found all empty:
        # a snapshot holding these very mappings (unchanged since) holds none either.
        self.empty_kinds: tuple[object, ...] | None = None

    def resume(self, value: Any = None, error: BaseException | None = None) -> None:
        """Run the coroutine to its next call (or its end), sending `value` or throwing `error`."""
        running = _get_running_loop()
        loop = self.loop
        # The loop and task asyncio.TaskGroup finds (stand-ins: typeshed wants the real ones).
        _set_running_loop(loop)  # type: ignore[arg-type]
        _enter_task(loop, _TASK)  # type: ignore[arg-type]
        try:
            if error is not None:
                yielded = self.context.run(self.coro.throw, error)
            else:
                yielded = self.context.run(self.coro.send, value)
        except StopIteration as stop:
            self.finished, self.result, self.call = True, stop.value, None
            self.failure = loop.refused
            return
        except _FAILURES as exc:  # the workflow's own failure (SystemExit too): it fails the run
            self.finished, self.failure, self.call = True, loop.refused or exc, None
            return
        finally:
            _leave_task(loop, _TASK)  # type: ignore[arg-type]
            _set_running_loop(running)
        if loop.refused is not None:  # a TaskGroup use that cannot be deterministic
            self.close()
            self.finished, self.result, self.call = True, None, None
            self.failure = loop.refused
            return
        if not isinstance(yielded, CALL_TYPES):
            children = gathered(yielded)
            label = "asyncio.gather"
            if children is None:
                children, label = grouped(yielded, loop), "an asyncio.TaskGroup"
                if children is not None and abandoned(children, yielded):
                    self.resume()  # the group's block raised: on to its end, nothing run
                    return
            if children is not None:  # asyncio.gather(step(a), ...) or a TaskGroup's end
                self.call = Gathered(children, self.position + 1, label)
                self.position += len(children)
                self.call_input = self.produced = None
                return
            self.close()
            # The run fails: asked again, the code would await the same thing again.
            self.finished, self.result, self.call = True, None, None
            self.failure = UnsupportedAwait(
                f"workflow code awaited {_shown(yielded)} after call {self.position}; it may "
                "await only runfold.flow's calls (step, sleep, wait_for_event, ...) and "
                "asyncio.gather or asyncio.TaskGroup of steps: everything a workflow waits on "
                "must be durable (asyncio.sleep is runfold.flow.sleep)"
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
        for task in self.loop.tasks:  # a TaskGroup's steps not yet run: they never will be
            if not task.done():
                task.abandon()
        try:
            self.coro.close()
        except BaseExceptionGroup as group:  # a TaskGroup left with the GeneratorExit
            if group.subgroup(lambda e: not isinstance(e, _LEFT)) is not None:
                _log.warning("workflow code raised as its coroutine was dropped: %s", group)
        except _FAILURES as exc:
            _log.warning("workflow code raised as its coroutine was dropped: %s", error_text(exc))


def _mark(info: WorkflowInfo) -> None:
    """Mark the current context as that of workflow code of the run `info` describes."""
    IN_WORKFLOW.set(True)
    CURRENT_INFO.set(info)
    CURRENT_STEP.set(None)  # a session started by a step body's code is not that step


def _shown(value: object) -> str:
    """`repr(value)`, bounded, whatever its `__repr__` does."""
    try:
        text = repr(value)
    except Exception:
        text = f"a {type(value).__name__}"
    return text if len(text) <= 200 else text[:200] + "…"
