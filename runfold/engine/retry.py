"""Step retry timing: exponential backoff with a jitter that replays identically.

The jitter spreads retries of many runs that failed together (a dependency went down) without
drawing randomness: it is a hash of the run id, the step id and the attempt, so the same failure
always schedules the same `retry_after`, in every process and on every replay.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from runfold.kernel import DEFAULT_RETRY, RetryPolicy

__all__ = [
    "DEFAULT_JITTER",
    "DEFAULT_RETRY",
    "LONGEST_RETRY_INTERVAL",
    "jitter_fraction",
    "retry_delay",
]

DEFAULT_JITTER = 0.2
"""By default a delay is shortened by up to 20 %, never lengthened past the policy's."""

LONGEST_RETRY_INTERVAL = timedelta(days=365)
"""The ceiling of a delay when the policy sets no `max_interval`."""


def jitter_fraction(run_id: str, step_id: str, attempt: int) -> float:
    """A number in [0, 1) fixed by `(run_id, step_id, attempt)`: the replay-stable jitter."""
    digest = hashlib.blake2b(f"{run_id}\x1f{step_id}\x1f{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def retry_delay(
    policy: RetryPolicy,
    *,
    run_id: str,
    step_id: str,
    attempt: int,
    jitter: float = DEFAULT_JITTER,
) -> timedelta:
    """How long after attempt `attempt` failed its step may run again.

    `initial_interval * backoff_coefficient ** (attempt - 1)`, capped at `max_interval` (or
    `LONGEST_RETRY_INTERVAL`), then shortened by `jitter * jitter_fraction(run_id, step_id,
    attempt)` of itself. Raises `ValueError` for an attempt below 1 or a jitter outside [0, 1].
    """
    if attempt < 1:
        raise ValueError("attempt must be at least 1")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be between 0 and 1")
    ceiling = (policy.max_interval or LONGEST_RETRY_INTERVAL).total_seconds()
    try:
        seconds = policy.initial_interval.total_seconds() * policy.backoff_coefficient ** (
            attempt - 1
        )
    except OverflowError:
        seconds = ceiling
    seconds = min(seconds, ceiling)
    return timedelta(seconds=seconds * (1.0 - jitter * jitter_fraction(run_id, step_id, attempt)))
