"""The rules are pure, so their examples run on `MemoryStore` alone.

`decide` reads a snapshot and a command and does no I/O: whether a command is accepted, what it
appends and how it is refused does not depend on the store that carries the events. Running the
examples here once per backend checked the same decisions four times over. What a store adds is
checked on every backend where it lives:

- `tests/stores/test_law_through_stores.py`: whatever `decide` accepts (the kit's command
  generators with hostile values mixed in: 64-bit bounds, NUL, lone surrogates, naive times,
  extreme retry policies) is appended, read back and replayed to an equal snapshot and equal
  index rows, on every backend; a refused command writes nothing.
- `tests/stores/test_conformance.py`: the conformance kit on every bundled store. Every event
  type reads back equal (`round_trip_*`, spec versions included), index rows agree with the
  kernel after every append (`summary_agrees_with_kernel`, `index_agrees_with_kernel`), and the
  rule families run through `CommandHandler` on the store (`rule_run_lifecycle`,
  `rule_resilient_start`, `rule_cancellation`, `rule_attributes`, `rule_step_retry_and_redelivery`,
  `rule_lazy_start_race`, `rule_late_step_outcome`, `rule_wait_wakeups`, `rule_hook_delivery`,
  `rule_hook_token_conflict`, `rule_retained_hook_token`, `rule_concurrent_commands`), with the
  store-backed lookups they rely on (`find_hook`, token claims, `due_wakeups`, `get_runs`,
  a closed store's refusals).

This fixture shadows the suite's `store` (every backend) for `tests/kernel/` only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runfold import EventStore, MemoryStore


@pytest.fixture
async def store() -> AsyncIterator[EventStore]:
    """A fresh, empty `MemoryStore`."""
    opened = MemoryStore()
    try:
        yield opened
    finally:
        await opened.close()
