"""Events a workflow publishes: `await set_event(key, value)` and `Flow.get_event(run_id, key)`.

DBOS's `set_event` / `get_event`: workflow code publishes a value under a key, anyone reads it
by run id, waiting until it is set. A `set_event` at call id n is a step of the run named
`EVENT_STEP_PREFIX + key` whose body returns the value (run on the loop, never retried): the
value goes through the flow codec and is recorded once, so a replay goes past it without
recording anything, and `runfold show` and `history` list it as a step. The latest value of a
key is that of its completed step with the highest call id. A run that continued as new passes
its events on: `get_event` reads the last run of the chain that set the key.

`get_event` waits without a tight loop: a set in this process wakes it at once (the `Flow`
tells the `EventBoard` of every step that completed), and it reads the run at growing
intervals, from 10 ms to at most 0.5 s, for a set in another process.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from runfold.flow.calls import Pending, StepCall
from runfold.flow.continuation import continued_as
from runfold.handler import CommandHandler
from runfold.kernel import Envelope, RetryPolicy, Snapshot, StepCompleted

__all__ = ["EVENT_STEP_PREFIX", "MAX_EVENT_KEY", "EventBoard", "latest_event", "set_event"]

EVENT_STEP_PREFIX = "runfold.event:"
"""What the name of a `set_event` step starts with (then the key)."""
MAX_EVENT_KEY = 200
"""The longest event key, in characters."""
_ONCE = RetryPolicy(max_attempts=1)


async def _published(value: Any) -> Any:
    """The body of a `set_event` step: the value itself (on the loop, no thread hop)."""
    return value


def set_event(key: str, value: Any) -> Any:
    """Publish `value` under `key` for `Flow.get_event` (DBOS's `set_event`), recorded once.

    A later `set_event` of the same key replaces the value readers see. The value goes through
    the `Flow`'s codec.

    Raises:
        ValueError: `key` is not text, is empty, longer than `MAX_EVENT_KEY` (200) characters,
            or holds a control character.
        PayloadError: (at the call) `value` cannot be encoded.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_EVENT_KEY:
        raise ValueError(f"an event key is text of 1 to {MAX_EVENT_KEY} characters")
    if not key.isprintable():
        raise ValueError(f"event key {key[:40]!r} holds a control character")
    return Pending(
        StepCall(fn=_published, args=(value,), name=EVENT_STEP_PREFIX + key, retry=_ONCE)
    )


def latest_event(snapshot: Snapshot, key: str) -> tuple[bool, bytes]:
    """`(True, encoded value)` of the run's latest `set_event` of `key`, else `(False, b"")`."""
    name = EVENT_STEP_PREFIX + key
    best: tuple[int, bytes] | None = None
    for step_id in snapshot.steps:
        step = snapshot.steps[step_id]
        if step.step_name != name or step.status != "completed" or not step_id.isdigit():
            continue
        position = int(step_id)
        if best is None or position > best[0]:
            best = (position, step.output if step.output is not None else b"")
    return (False, b"") if best is None else (True, best[1])


class EventBoard:
    """Where `get_event` callers of one `Flow` wait: woken by a step completed in their run."""

    def __init__(self) -> None:
        self.waiting: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

    def saw(self, envelope: Envelope) -> None:
        """Wake the callers waiting on the run of `envelope`, if a step completed."""
        if self.waiting and type(envelope.event) is StepCompleted:
            for woken in self.waiting.get(envelope.run_id, ()):
                woken.set()

    async def get(
        self, handler: CommandHandler, run_id: str, key: str, timeout: float | None
    ) -> tuple[bool, bytes]:
        """The latest `set_event` of `key` in the run's chain, once set: `(True, encoded)`.

        `(False, b"")` once `timeout` seconds passed (None: no bound) or the chain ended
        without it.

        Raises:
            RunNotFound: The run has no history.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else float("inf")
        pause = 0.01
        current = run_id
        while True:
            found, value, current, ended = await _read_chain(handler, current, key)
            if found or ended or loop.time() >= deadline:
                return found, value
            woken = asyncio.Event()
            self.waiting[current].add(woken)
            try:
                await asyncio.wait_for(woken.wait(), min(pause, max(deadline - loop.time(), 0)))
            except TimeoutError:
                pause = min(pause * 2, 0.5)
            finally:
                held = self.waiting[current]
                held.discard(woken)
                if not held:
                    del self.waiting[current]


async def _read_chain(
    handler: CommandHandler, run_id: str, key: str
) -> tuple[bool, bytes, str, bool]:
    """The latest value of `key` from `run_id`'s run through the last of its chain: found,
    value, the chain's last run id, and whether that run ended."""
    snapshot = await handler.snapshot(run_id)
    found, value = latest_event(snapshot, key)
    successor = continued_as(snapshot)
    while successor is not None:
        later = await handler.lookup(successor)
        if later is None:
            break
        snapshot = later
        more, newer = latest_event(snapshot, key)
        if more:
            found, value = True, newer
        successor = continued_as(snapshot)
    return found, value, snapshot.run_id, snapshot.is_terminal
