"""Queues, engine side: the deduplication of a start on a queue.

A queue itself is declared by the workers that serve it (`Queue`, from the stores' `DueWork`
contract); the store hands its runs out within its limits (`DueWork.claim_due`). A start with a
deduplication id first holds that id in the store (`DueWork.hold_dedup`), then records the run:
like DBOS, a second start with the same id while the first run is live is refused.
"""

from __future__ import annotations

from datetime import datetime

from runfold.engine.errors import QueueDeduplicated
from runfold.stores.due_work import DueWork, Queue
from runfold.stores.protocol import EventStore

__all__ = ["Queue", "hold_dedup"]


async def hold_dedup(
    store: EventStore, queue_name: str, dedup_id: str, run_id: str, now: datetime
) -> None:
    """Hold `dedup_id` of the queue for `run_id`, or raise `QueueDeduplicated`.

    Raises:
        QueueDeduplicated: Another live run of the queue holds the id.
        TypeError: The store keeps no queues (it is no `DueWork`).
    """
    if not isinstance(store, DueWork):
        raise TypeError(f"{type(store).__name__} keeps no queues: a deduplication id needs one")
    if not await store.hold_dedup(queue_name, dedup_id, run_id, now=now):
        raise QueueDeduplicated(
            f"queue {queue_name!r} has a live run with deduplication id {dedup_id!r}",
            run_id=run_id,
            queue_name=queue_name,
            dedup_id=dedup_id,
        )
