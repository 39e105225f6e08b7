"""Checks of due work handed out in one call (`DueWork`), for stores that keep worker leases.

`claim_due` hands out orphans, due wakeups of runs nobody owns and queued runs, each to one
worker until its hold ends or the run's history moves on; racing claimers never get one run
twice; a queue's limits (concurrency across workers and per worker, rate, priority) hold; a
deduplication id is held by one live run. A store that is no `DueWork` is a whole `EventStore`
still: these checks are then not offered.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from runfold.conformance._core import Context, check
from runfold.conformance.builders import MINUTE, T0, started, write
from runfold.kernel import (
    Event,
    RunClaimed,
    RunCompleted,
    RunCreated,
    RunReleased,
    RunStarted,
    WaitCreated,
)
from runfold.stores.due_work import DueRun, DueWork, Queue
from runfold.stores.leases import WorkerLeases
from runfold.stores.protocol import EventStore

HOLD = timedelta(seconds=30)
"""How long the checks' claims hold what they hand out."""
RACERS = 8
"""Workers claiming at once in the race check."""


def _due(store: EventStore) -> DueWork:
    """`store` as a `DueWork`; the check is not offered when it hands out no due work."""
    if not isinstance(store, DueWork) or not isinstance(store, WorkerLeases):
        pytest.skip("not offered: due work (the store is no DueWork)")
    return store


def _queued(queue: str | None = None, priority: int = 0, dedup: str | None = None) -> RunCreated:
    return RunCreated(
        workflow_name="wf", input=b"", queue_name=queue, priority=priority, dedup_id=dedup
    )


def _claimed(owner: str) -> RunClaimed:
    return RunClaimed(owner_id=owner, epoch=1)


def _waiting(until: datetime, owner: str | None = None) -> tuple[Event, ...]:
    """A started run waiting on a timer until `until`, released by `owner` (None: never owned)."""
    if owner is None:
        return (*started(), WaitCreated(wait_id="t", resume_at=until))
    return (
        *started(),
        _claimed(owner),
        WaitCreated(wait_id="t", resume_at=until),
        RunReleased(owner_id=owner, epoch=1),
    )


async def _claim(
    due: DueWork,
    worker: str,
    now: datetime,
    limit: int = 100,
    queues: tuple[Queue, ...] = (),
    workflow_names: list[str] | None = None,
) -> list[tuple[str, str, str | None]]:
    found = await due.claim_due(
        worker,
        now,
        hold_until=now + HOLD,
        limit=limit,
        workflow_names=workflow_names,
        queues=queues,
    )
    assert all(isinstance(item, DueRun) for item in found), found
    return [(item.run_id, item.reason, item.displacing) for item in found]


@check("leases")
async def claim_due_hands_out_each_due_run_to_one_worker(ctx: Context, store: EventStore) -> None:
    """`claim_due` hands out orphans (oldest update first, with the owner they displace), then
    runs nobody owns with a due wakeup (earliest first), then queued runs (pending, owned by
    nobody), and nothing else: not a run whose wakeup is not due, one owned under a lease that
    holds, an ended one, another workflow's. What it handed out is held: no worker gets it
    again until the hold's end (exactly), or until the run's history moves on; `limit` holds."""
    due = _due(store)
    leases = store
    assert isinstance(leases, WorkerLeases)
    now = T0 + 10 * MINUTE
    runs: list[tuple[str, tuple[Event, ...]]] = [
        ("orphan", (*started(), _claimed("ghost"))),
        ("woken", _waiting(T0 + MINUTE, owner="gone")),
        ("woken-early", _waiting(T0, owner=None)),
        ("queued", (_queued(),)),
        ("not-yet", _waiting(now + MINUTE)),
        ("owned", (*started(), _claimed("alive"))),
        ("ended", (*started(), RunCompleted(output=b""))),
        ("other", (RunCreated(workflow_name="other", input=b""),)),
    ]
    for number, (run_id, events) in enumerate(runs):
        await write(store, run_id, *events, at=T0 + number * timedelta(seconds=1))
    assert await leases.renew_lease("alive", lease_until=now + HOLD * 10, now=T0)
    expected = [
        ("orphan", "orphan", "ghost"),
        ("woken-early", "wakeup", None),
        ("woken", "wakeup", None),
        ("queued", "queued", None),
    ]
    assert await _claim(due, "w1", now, limit=0, workflow_names=["wf"]) == []
    assert await _claim(due, "w1", now, limit=2, workflow_names=["wf"]) == expected[:2]
    assert await _claim(due, "w2", now, workflow_names=["wf"]) == expected[2:]
    assert await _claim(due, "w3", now, workflow_names=["wf"]) == [], "a held run handed out"
    assert await _claim(due, "w1", now, workflow_names=["wf"]) == [], "a holder got its run again"
    assert await _claim(due, "w3", now + HOLD - timedelta(microseconds=1)) == [
        ("other", "queued", None)
    ]
    # The holds of w1 and w2 end together: every run is due again.
    again = await _claim(due, "w3", now + HOLD, workflow_names=["wf"])
    assert again == expected, "a run held until now not handed out at now"
    # The history moves on (w3 claims the queued run and releases it): its hold no longer holds.
    await write(store, "queued", _claimed("w3"), RunReleased(owner_id="w3", epoch=1), at=now)
    assert await _claim(due, "w4", now + HOLD, workflow_names=["wf"]) == [
        ("queued", "queued", None)
    ]


@check("leases", requires=("concurrency",))
async def racing_claimers_never_get_one_run_twice(ctx: Context, store: EventStore) -> None:
    """8 workers calling `claim_due` at once (each for at most 4 runs) over 12 orphans, 12 runs
    with a due wakeup and 12 queued runs never get one run twice; what none got then is
    handed out by the next call."""
    due = _due(store)
    everything = set()
    for number in range(12):
        await write(store, f"o{number}", *started(), _claimed("ghost"))
        await write(store, f"w{number}", *_waiting(T0))
        await write(store, f"q{number}", _queued())
        everything |= {f"o{number}", f"w{number}", f"q{number}"}
    now = T0 + MINUTE
    results = await asyncio.gather(
        *(_claim(due, f"racer-{n}", now, limit=4) for n in range(RACERS))
    )
    handed = [run_id for found in results for run_id, _, _ in found]
    twice = sorted({run_id for run_id in handed if handed.count(run_id) > 1})
    assert not twice, f"runs handed to two racing workers: {twice}"
    rest = [run_id for run_id, _, _ in await _claim(due, "last", now)]
    assert not set(rest) & set(handed), "a held run handed out again"
    assert set(rest) | set(handed) == everything


@check("leases")
async def queues_hand_out_within_their_limits(ctx: Context, store: EventStore) -> None:
    """Queued runs on a queue go only to a worker that serves the queue, by priority (0 first,
    then lower) then age, within the queue's limits: runs started and not ended or held across
    workers (`concurrency`), those of one worker (`worker_concurrency`, which also holds back
    a run of the queue it would resume from a wait), and starts per `rate_period`
    (`rate_limit`, counted from the hand-out)."""
    due = _due(store)
    priorities = [5, 0, 1, 5, 0, 9]
    for number, priority in enumerate(priorities):
        await write(store, f"e{number}", _queued("emails", priority), at=T0 + number * MINUTE)
    await write(store, "r0", _queued("reports"), at=T0)
    now = T0 + 10 * MINUTE
    assert await _claim(due, "w1", now) == [], "a run of a queue not served handed out"
    emails = Queue(name="emails", concurrency=3, worker_concurrency=2)
    first = await _claim(due, "w1", now, queues=(emails,))
    assert first == [("e1", "queued", None), ("e4", "queued", None)], "priority or worker limit"
    second = await _claim(due, "w2", now, queues=(emails,))
    assert second == [("e2", "queued", None)], "the queue's concurrency not honoured"
    assert await _claim(due, "w3", now, queues=(emails,)) == []
    # e1 starts under w1 and ends: one slot is free again, for any worker.
    await write(store, "e1", _claimed("w1"), RunStarted(), RunCompleted(output=b""), at=now)
    assert await _claim(due, "w3", now, queues=(emails,)) == [("e0", "queued", None)]
    # e2 (w2's) waits on a timer, released: when it is due, w3, which holds 1 of the queue
    # besides, may not resume it (its limit is 2, e0 and this), w1 (1: e4) may.
    await write(store, "e2", _claimed("w2"), RunStarted(), at=now)
    await write(store, "e2", WaitCreated(wait_id="t", resume_at=now), at=now)
    await write(store, "e2", RunReleased(owner_id="w2", epoch=1), at=now)
    assert isinstance(store, WorkerLeases)
    assert await store.renew_lease("w3", lease_until=now + 10 * MINUTE, now=now)
    await write(store, "e5", _claimed("w3"), RunStarted(), at=now)  # w3 owns e5 and holds e0
    assert await _claim(due, "w3", now, queues=(emails,)) == [], "a worker's limit passed"
    assert await _claim(due, "w1", now, queues=(emails,)) == [("e2", "wakeup", None)]
    assert await store.renew_lease("w1", lease_until=now + 10 * MINUTE, now=now)
    await write(store, "e2", RunClaimed(owner_id="w1", epoch=2), at=now)  # w1 resumes it
    # A rate limit: 2 starts per minute, whatever the concurrency.
    reports = Queue(name="reports", rate_limit=2, rate_period=MINUTE)
    for number in range(1, 5):
        await write(store, f"r{number}", _queued("reports"), at=T0 + number * MINUTE)
    got = await _claim(due, "w4", now, queues=(reports,))
    assert [run_id for run_id, _, _ in got] == ["r0", "r1"], "rate limit not honoured"
    # Taken by w4, under a lease (their holds would lapse before the next look).
    assert await store.renew_lease("w4", lease_until=now + 10 * MINUTE, now=now)
    for run_id in ("r0", "r1"):
        await write(store, run_id, _claimed("w4"), at=now)
    assert (
        await _claim(due, "w5", now + MINUTE - timedelta(microseconds=1), queues=(reports,)) == []
    )
    later = await _claim(due, "w5", now + MINUTE, queues=(reports,))
    assert [run_id for run_id, _, _ in later] == ["r2", "r3"]


@check("leases")
async def a_dedup_id_is_held_by_one_live_run(ctx: Context, store: EventStore) -> None:
    """`hold_dedup` holds a queue's deduplication id for one run: again for the same run, not
    for another while the holder lives (in another queue, the id is another), and for another
    once the holder ended, or when the holder was never created, a minute after it was held."""
    due = _due(store)
    assert await due.hold_dedup("q", "d", "a", now=T0)
    assert await due.hold_dedup("q", "d", "a", now=T0)
    assert not await due.hold_dedup("q", "d", "b", now=T0 + MINUTE - timedelta(microseconds=1))
    assert await due.hold_dedup("other", "d", "b", now=T0)
    assert await due.hold_dedup("q", "d", "b", now=T0 + MINUTE), "a never-created holder kept it"
    await write(store, "b", _queued("q", dedup="d"))
    assert not await due.hold_dedup("q", "d", "c", now=T0 + 10 * MINUTE), "a live holder lost it"
    await write(store, "b", RunStarted(), RunCompleted(output=b""))
    assert await due.hold_dedup("q", "d", "c", now=T0 + 10 * MINUTE), "an ended holder kept it"
