"""The steps of one `asyncio.gather` that workflow code awaits, recognised as one call.

`step(...)` returns a `Pending` that passes for an asyncio future, so `asyncio.gather` keeps
it as it is and returns a gathering future, which the coroutine yields to the interpreter.
`gathered` tells such a future from any other; `Gathered` is the call it becomes (how the
interpreter schedules and resolves it is `runfold.flow.parallel`). Apart from `parallel`, so
that the session, which recognises the call, need not import the code that decides on it.
"""

from __future__ import annotations

import asyncio

from runfold.flow.calls import Pending, StepCall

__all__ = ["Gathered", "gathered"]


class Gathered:
    """The steps of one `asyncio.gather`, at call ids `first`, `first + 1`, ..."""

    __slots__ = ("children", "first", "inputs", "label")

    def __init__(
        self, children: tuple[Pending, ...], first: int, label: str = "asyncio.gather"
    ) -> None:
        self.children = children
        self.first = first
        self.label = label  # what grouped them, as `FlowNonDeterminism` names it
        self.inputs: list[bytes] | None = None  # each step's arguments, encoded once

    def __repr__(self) -> str:
        return f"Gathered(first={self.first}, steps={len(self.children)})"

    def at(self, step_id: str) -> StepCall | None:
        """The step call at id `step_id`, if it is one of these."""
        if not step_id.isdigit():
            return None
        offset = int(step_id) - self.first
        if 0 <= offset < len(self.children):
            call = self.children[offset].call
            assert isinstance(call, StepCall)
            return call
        return None


def gathered(yielded: object) -> tuple[Pending, ...] | None:
    """The step calls of the `asyncio.gather` the workflow awaits, or None if it is not one.

    A gather of anything else (a coroutine, which gather has made a task on the event loop; a
    sleep) is not durable: its tasks are cancelled and None is returned.
    """
    if not isinstance(yielded, asyncio.Future):
        return None
    children = getattr(yielded, "_children", None)
    if not isinstance(children, list) or not children:
        return None
    unique = tuple(dict.fromkeys(children))  # the same awaitable twice is one call
    if all(isinstance(c, Pending) and isinstance(c.call, StepCall) for c in unique):
        return unique
    for child in unique:
        if isinstance(child, asyncio.Task):
            child.cancel()
    yielded.add_done_callback(_retrieve)  # its error (the cancellation) is not news
    return None


def _retrieve(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()
