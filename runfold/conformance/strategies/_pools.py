"""The ground every strategy shares: the run ids, the start time, and the small id pools.

`valid_histories()` names new entities `s0, s1, …`, `w0, …`, `h0, …` in creation order, so
`commands()` drawing from these pools hits existing entities as well as unknown ones.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = [
    "ATTRIBUTE_KEYS",
    "DEFAULT_RUN_ID",
    "DELIVERY_IDS",
    "FOREIGN_RUN_ID",
    "HOOK_IDS",
    "OWNER_IDS",
    "PROGRESS_IDS",
    "REASONS",
    "REFERENCE_IDS",
    "START",
    "STEP_IDS",
    "TOKENS",
    "WAIT_IDS",
    "WRITE_IDS",
]

DEFAULT_RUN_ID = "run-1"
"""The run id histories and snapshots use unless told otherwise."""
FOREIGN_RUN_ID = "run-2"
"""Another run: holder of conflicting hook tokens, parent of children, intruder in histories."""
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""When generated histories begin, and what `commands()` draws its near times around."""

STEP_IDS = ("s0", "s1", "s2", "s3")
"""Step ids `commands()` draws; `valid_histories()` creates `s0, s1, …` in that order."""
WAIT_IDS = ("w0", "w1", "w2")
"""Wait ids `commands()` draws; `valid_histories()` creates `w0, w1, …` in that order."""
HOOK_IDS = ("h0", "h1", "h2")
"""Hook ids `commands()` draws; `valid_histories()` creates `h0, h1, …` in that order."""
OWNER_IDS = ("worker-a", "worker-b")
"""Worker ids both strategies draw, so claims contend for runs and displace each other."""
TOKENS = ("tok-0", "tok-1", "tok-2")
"""Hook tokens both strategies draw, so hooks contend for the same tokens."""
PROGRESS_IDS = ("p0", "p1")
"""Progress ids `commands()` draws."""
REFERENCE_IDS = ("c0", "c1")
"""Child reference ids `commands()` draws."""
WRITE_IDS = ("wr0", "wr1")
"""Attribute write ids `commands()` draws."""
DELIVERY_IDS = ("d0", "d1")
"""Hook delivery ids `commands()` draws."""
ATTRIBUTE_KEYS = ("k0", "k1", "k2", "$sys")
"""Attribute keys `commands()` draws, `$sys` among them for the reserved prefix."""
REASONS: tuple[str | None, ...] = (None, "user", "shutdown")
"""Cancellation and time-out reasons both strategies draw."""
