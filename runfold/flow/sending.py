"""Workflow code that sends and reads: `await send(run_id, ...)`, `await get_event(run_id, ...)`.

DBOS lets workflow code call `DBOS.send` and `DBOS.get_event`; these are the same calls. Each
is a step of the calling run (named `SEND_STEP` or `GET_EVENT_STEP`) whose body acts through
the `Flow` driving the run, as `ChildHandle.cancel` does, so nothing needs a module-level
`Flow`. A `send` records its message under the step's idempotency key (`<run id>/<call id>`,
the same on every attempt): after a crash between the message's record and the step's outcome,
the step sends it again under that key, and the target keeps it once. A `get_event`'s value
is the step's output: a replay resumes with the value read the first time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runfold.engine import StepFailure
from runfold.flow.bodies import current_step
from runfold.flow.calls import step
from runfold.flow.messages import post_message
from runfold.kernel import RunNotFound, TerminalState

__all__ = ["FLOW_BODIES", "GET_EVENT_STEP", "SEND_STEP", "get_event", "send"]

SEND_STEP = "runfold.send"
"""The name of the step `send` records."""
GET_EVENT_STEP = "runfold.get_event"
"""The name of the step `get_event` records."""
_STEP_MARGIN = timedelta(seconds=30)
"""How much longer than its `timeout` a `get_event` step may take before it counts as hung."""


async def _send(flow: Any, run_id: str, message: Any, topic: str | None) -> None:
    """The body of `send`'s step: the message, recorded under the step's stable key."""
    try:
        # Not `flow.send`: the sending run's drive is running; no follow-ups of families here.
        encoded = flow.codec.encode(message)
        key = current_step().idempotency_key
        await post_message(flow.engine, run_id, encoded, topic, key)
    except (RunNotFound, TerminalState) as exc:  # no attempt will find it otherwise
        raise StepFailure(str(exc).encode(), code=type(exc).__name__, retryable=False) from exc


async def _get_event(flow: Any, run_id: str, key: str, timeout: float) -> Any:
    """The body of `get_event`'s step: the value, once set (None past `timeout`)."""
    try:
        return await flow.get_event(run_id, key, timeout=timeout)
    except RunNotFound as exc:
        raise StepFailure(str(exc).encode(), code=type(exc).__name__, retryable=False) from exc


FLOW_BODIES = (_send, _get_event)
"""The step bodies of this module: the `Flow` passes itself to them as the first argument."""


def send(run_id: str, message: Any, *, topic: str | None = None) -> Any:
    """Send `message` to run `run_id` on `topic` from workflow code (DBOS's `send`), once.

    As `Flow.send`, recorded as a step of this run: the target keeps the message once, however
    often a crash makes the step run again.

    Raises:
        StepError: (at the await) the target run has no history or has ended.
        PayloadError: (at the call) `message` cannot be encoded.
    """
    return step(_send, run_id, message, topic, name=SEND_STEP)


def get_event(run_id: str, key: str, *, timeout: timedelta | float = 60.0) -> Any:
    """The latest value run `run_id` set under `key` (DBOS's `get_event`), read once.

    As `Flow.get_event`, from workflow code: it waits until the key is set, for at most
    `timeout` (a timedelta, or seconds; default 60); None once it passed or the run ended
    without setting it. The value read is recorded as a step of this run, so a replay resumes
    with it. The wait holds a step, so it needs a bound; wait on a `recv` for longer ones.

    Raises:
        ValueError: `timeout` is negative.
        StepError: (at the await) the run has no history.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if seconds < 0:
        raise ValueError("a get_event timeout cannot be negative")
    bound = timedelta(seconds=seconds) + _STEP_MARGIN
    return step(_get_event, run_id, key, seconds, name=GET_EVENT_STEP, timeout=bound)
