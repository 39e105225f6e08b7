"""`CommandHandler`: load → decide → append, retried on conflict, over any `EventStore`.

The handler is where the pure kernel meets a store. Every rule lives in `decide`; the store only
makes "check the head, then append" atomic; the handler retries the whole cycle on a
`SequenceConflict` (someone else appended first) and re-decides on a `TokenConflict` (another run
holds the hook token), so every rule holds on every store, concurrency included. A store that
cannot be reached for now (`StoreUnavailable`) is tried again under a `StoreRetry` policy, and
an append whose outcome was lost is recognised by its events when the run is read back, so a
retried command that was applied returns its outcome instead of a refusal.

Its parts: the cycle (`_handler`), the cache of runs it decides on (`_cache`), the appends in
doubt and their recognition (`_doubt`), run ids and the clock (`_ids`).
"""

from __future__ import annotations

from runfold.handler._handler import CommandHandler, Outcome
from runfold.handler._ids import new_run_id, utc_now

__all__ = ["CommandHandler", "Outcome", "new_run_id", "utc_now"]
