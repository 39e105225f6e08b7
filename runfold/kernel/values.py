"""The small value types events carry: a step's retry policy, an attribute change, its writer.

They are attrs classes like the events (frozen, slotted, keyword-only), kept apart from the
event catalogue (`runfold.kernel.events`, which names them too) because commands and the
engine use them on their own: a policy is a command's argument before it is an event's field.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeAlias

import attrs

__all__ = [
    "DEFAULT_RETRY",
    "AttributeChange",
    "RetryPolicy",
    "StepWriter",
    "WorkflowWriter",
    "Writer",
]


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often and how fast a step is retried; `max_attempts` counts every attempt.

    The kernel enforces `max_attempts` (a `RetryStep` past it is an `InvalidCommand`); the
    runtime applies the backoff (`runfold.engine.retry_delay`) and `non_retryable_error_codes`.
    """

    max_attempts: int = 3
    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    max_interval: timedelta | None = None
    non_retryable_error_codes: tuple[str, ...] = ()


DEFAULT_RETRY = RetryPolicy()
"""The policy of a step recorded without one: 3 attempts, 1 s, doubling.

The kernel bounds such a step's attempts by it, as it bounds a recorded policy's, so no race
between writers gets a step past its budget, whatever policy the writers had in mind.
"""


@attrs.frozen(kw_only=True)
class AttributeChange:
    """One attribute write: `value=None` removes the key."""

    key: str
    value: str | None


@attrs.frozen(kw_only=True)
class WorkflowWriter:
    """Attributes written by the workflow body itself."""


@attrs.frozen(kw_only=True)
class StepWriter:
    """Attributes written by one attempt of a step."""

    step_id: str
    attempt: int


Writer: TypeAlias = WorkflowWriter | StepWriter
"""Who wrote an attribute change: the workflow or one step attempt."""
