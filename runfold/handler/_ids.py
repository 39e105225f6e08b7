"""Run ids (`new_run_id`) and the handler's default clock (`utc_now`)."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

__all__ = ["new_run_id", "utc_now"]


def utc_now() -> datetime:
    """The default clock: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_id_lock = threading.Lock()
_last_id = [0, 0]  # [milliseconds, random part] of the last id made in this process


def new_run_id(prefix: str = "run_") -> str:
    """A new run id: `prefix` + a 26-character ULID (48-bit milliseconds, 80 random bits).

    Ids sort by creation time; within one millisecond of one process they still increase
    (the random part is incremented), and across processes 80 random bits make a collision
    negligible.
    """
    with _id_lock:
        millis = time.time_ns() // 1_000_000
        if millis <= _last_id[0]:
            millis = _last_id[0]
            randomness = (_last_id[1] + 1) % (1 << 80)
        else:
            randomness = int.from_bytes(os.urandom(10), "big")
        _last_id[0], _last_id[1] = millis, randomness
    value = (millis << 80) | randomness
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return prefix + "".join(reversed(chars))
