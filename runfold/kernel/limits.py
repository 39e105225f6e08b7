"""`SPEC_VERSION` and the `Limits` every decision is checked against."""

from __future__ import annotations

from datetime import timedelta

import attrs

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_BACKOFF_COEFFICIENT",
    "MAX_PRIORITY",
    "MAX_RETRY_ATTEMPTS",
    "MAX_RETRY_INTERVAL",
    "SPEC_VERSION",
    "Limits",
]

SPEC_VERSION = 1
"""The kernel spec this runfold implements; a run stamped with a higher one is refused."""

MAX_RETRY_ATTEMPTS = 1_000_000
"""The most attempts a `RetryPolicy` may allow."""
MAX_RETRY_INTERVAL = timedelta(days=3650)
"""The longest `initial_interval` or `max_interval` of a `RetryPolicy`.

A delay added to any time a run may hold then stays a valid time.
"""
MAX_BACKOFF_COEFFICIENT = 1000
"""The largest `backoff_coefficient` of a `RetryPolicy`."""
MAX_PRIORITY = 2**31 - 1
"""The largest `priority` of a run on a queue (every store keeps it as a 32-bit integer)."""


@attrs.frozen(kw_only=True)
class Limits:
    """The bounds `decide` enforces (`project_run` re-checks the attribute ones).

    Defaults follow the command rules. A command over a bound is an `InvalidCommand`
    (`InvalidAttributes` for attributes); a decision past `max_events_per_run` is a
    `HistoryLimitExceeded`.
    """

    max_id_length: int = 256
    """Longest identifier (run, step, wait, hook, write, progress, child ids), in characters."""
    max_token_length: int = 1024
    """Longest hook token, in characters."""
    max_payload_bytes: int = 2 * 1024 * 1024
    """Largest single payload (`bytes` field or text field in UTF-8)."""
    max_events_per_run: int = 25_000
    """Most events a run may hold; a terminal command may always add one more."""
    max_attributes: int = 64
    """Most attribute keys a run may hold after a merge."""
    max_attribute_key_length: int = 256
    """Longest attribute key, in characters."""
    max_attribute_value_bytes: int = 256
    """Longest attribute value, in UTF-8 bytes."""
    max_token_retention: timedelta = timedelta(days=30)
    """Furthest a hook may retain its token past `now`."""


DEFAULT_LIMITS = Limits()
"""The `Limits` every function that takes `limits` uses when given none."""
