"""`StoreRetry`: how `CommandHandler` rides through store faults (bounded, jittered backoff).

A store that cannot be reached for now raises `StoreUnavailable` (its subclasses `StoreTimeout`
and `CommitUnknown` included). The handler waits and tries again, for a while: the pauses grow
exponentially from `first_pause` to `max_pause`, each drawn at random from its upper half (so
that many callers cut off together do not all come back together), until `budget` seconds have
passed since the first failure; then the error is raised. Each retry is logged (logger
`runfold.handler`, INFO; the error raised in the end, WARNING) and handed to `on_retry`, where an
application counts them or marks its current trace span (`runfold.otel.record_store_retry`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from runfold.kernel import CommitUnknown, StoreUnavailable

__all__ = ["DEFAULT_STORE_RETRY", "StoreFault", "StoreRetry"]

_log = logging.getLogger("runfold.handler")
T = TypeVar("T")


@attrs.frozen(kw_only=True)
class StoreFault:
    """One store fault the handler is about to retry: what `StoreRetry.on_retry` is given.

    `failures` counts the faults of this handler call so far (1 for the first), `elapsed` the
    seconds since the first, `pause` the seconds it waits now before trying again.
    """

    run_id: str | None
    error: StoreUnavailable
    failures: int
    elapsed: float
    pause: float


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number of seconds")


@attrs.frozen(kw_only=True)
class StoreRetry:
    """A bounded, jittered exponential backoff for store calls that raise `StoreUnavailable`.

    Raises:
        ValueError: A duration is not positive, `max_pause` is below `first_pause`, or
            `multiplier` is below 1.
    """

    budget: float = attrs.field(default=30.0, validator=_positive)
    """Seconds from a call's first fault after which the error is raised (no retry starts that
    would end past it)."""
    first_pause: float = attrs.field(default=0.05, validator=_positive)
    """The upper bound of the first pause, in seconds."""
    max_pause: float = attrs.field(default=2.0, validator=_positive)
    """The upper bound of every pause, in seconds."""
    multiplier: float = 2.0
    """How much the bound grows from one pause to the next."""
    on_retry: Callable[[StoreFault], None] | None = attrs.field(default=None, eq=False)
    """Called with a `StoreFault` before each pause (for metrics or tracing); it must not
    raise."""

    def __attrs_post_init__(self) -> None:
        if self.max_pause < self.first_pause or not self.multiplier >= 1:
            raise ValueError("max_pause must be >= first_pause, and multiplier >= 1")

    def pause(self, failures: int, elapsed: float) -> float | None:
        """Seconds to wait after fault number `failures`; None once the budget would be passed.

        `elapsed` is the seconds since the first fault.
        """
        bound = min(self.max_pause, self.first_pause * self.multiplier ** (failures - 1))
        pause = bound / 2 + random.random() * bound / 2
        return None if elapsed + pause > self.budget else pause


DEFAULT_STORE_RETRY = StoreRetry()
"""The handler's default: 30 s of retries, pauses from 25–50 ms growing to 1–2 s."""


class Patience:
    """The store faults of one handler call: retried by `policy` (None: none are)."""

    __slots__ = ("doubt", "failures", "policy", "run_id", "started")

    def __init__(self, policy: StoreRetry | None, run_id: str | None) -> None:
        self.policy = policy
        self.run_id = run_id
        self.failures = 0
        self.started = 0.0
        self.doubt: CommitUnknown | None = None
        """Set while an append that failed has not been read back since (or the store could
        not settle it): if the call gives up now, whether it was written is unknown."""

    async def call(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`, tried again after each `StoreUnavailable` while the policy allows."""
        while True:
            try:
                return await work()
            except StoreUnavailable as exc:
                await self.wait(exc)

    async def wait(self, error: StoreUnavailable) -> None:
        """Pause before retrying after `error`, or raise it (as `CommitUnknown` while an
        append is in doubt) once the policy says stop."""
        now = time.monotonic()
        if self.failures == 0:
            self.started = now
        self.failures += 1
        elapsed = now - self.started
        pause = None if self.policy is None else self.policy.pause(self.failures, elapsed)
        if pause is None:
            raised = self._final(error)
            if self.policy is not None:
                _log.warning(
                    "giving up on the store after %d faults in %.1f s (run %r): %s",
                    self.failures,
                    elapsed,
                    self.run_id,
                    raised,
                )
            raise raised
        _log.info(
            "store fault %d (run %r), retrying in %.3f s: %s",
            self.failures,
            self.run_id,
            pause,
            error,
        )
        assert self.policy is not None
        if self.policy.on_retry is not None:
            self.policy.on_retry(
                StoreFault(
                    run_id=self.run_id,
                    error=error,
                    failures=self.failures,
                    elapsed=elapsed,
                    pause=pause,
                )
            )
        await asyncio.sleep(pause)

    def _final(self, error: StoreUnavailable) -> StoreUnavailable:
        doubt = self.doubt
        if doubt is None or isinstance(error, CommitUnknown):
            return error
        unknown = CommitUnknown(doubt.run_id, doubt.expected, f"{doubt.reason}; then {error}")
        unknown.__cause__ = error
        return unknown
