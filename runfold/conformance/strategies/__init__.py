"""Hypothesis strategies for runtime authors: commands, histories, snapshots and events.

- `commands()`: arbitrary commands of every class (or of `types`), with ids from small pools so
  they hit the entities `valid_histories()` creates; valid and invalid field values
  (`malformed=True` adds a field of the wrong type, for "decide raises only `Rejection`").
- `valid_histories()`: histories built by deciding commands with `decide` on the current snapshot,
  so always valid; they reach retries, cancellation, late step outcomes, retained hooks, deliveries.
- `invalid_histories()`: a valid history with one defect and the sequence `HistoryError` names.
- `histories()`: both, for error-path tests.
- `snapshots()`: `project_run` of `valid_histories()` (or of one of their prefixes).
- `events()`: arbitrary event instances of every type, for codec round trips.

Everything is deterministic given hypothesis' choices: no clock, no randomness of its own.
"""

# Each family lives in a private module of its own, re-exported here: the run ids, start time and
# id pools every strategy shares (`_pools`), field values from accepted to hostile (`_values`),
# commands (`_arbitrary_commands`), valid histories and snapshots (`_guided_histories`), invalid
# histories (`_defects`) and events (`_arbitrary_events`); `_odds` weighs their alternatives.

from runfold.conformance.strategies._arbitrary_commands import commands
from runfold.conformance.strategies._arbitrary_events import events
from runfold.conformance.strategies._defects import (
    INVALID_HISTORY_KINDS,
    InvalidHistory,
    InvalidHistoryKind,
    histories,
    invalid_histories,
)
from runfold.conformance.strategies._guided_histories import snapshots, valid_histories
from runfold.conformance.strategies._pools import (
    ATTRIBUTE_KEYS,
    DEFAULT_RUN_ID,
    DELIVERY_IDS,
    FOREIGN_RUN_ID,
    HOOK_IDS,
    PROGRESS_IDS,
    REFERENCE_IDS,
    START,
    STEP_IDS,
    TOKENS,
    WAIT_IDS,
    WRITE_IDS,
)

__all__ = [
    "ATTRIBUTE_KEYS",
    "DEFAULT_RUN_ID",
    "DELIVERY_IDS",
    "FOREIGN_RUN_ID",
    "HOOK_IDS",
    "INVALID_HISTORY_KINDS",
    "PROGRESS_IDS",
    "REFERENCE_IDS",
    "START",
    "STEP_IDS",
    "TOKENS",
    "WAIT_IDS",
    "WRITE_IDS",
    "InvalidHistory",
    "InvalidHistoryKind",
    "commands",
    "events",
    "histories",
    "invalid_histories",
    "snapshots",
    "valid_histories",
]
