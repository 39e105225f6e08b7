"""`runfold verify`: replay every run and check that its index rows are what the kernel derives.

Indexes are projections (`run_index(snapshot)`), so they can always be rebuilt from the log. A
store that offers the optional `rewrite_index(run_id, index, *, now)` can be repaired in place;
the check itself needs only the `EventStore` protocol.

Index rows that do not decode (`CorruptIndex`, say a summary whose attributes are not JSON) stop
a listing where they are: verify reports the run, and with `rebuild` rewrites its rows from its
events and lists again, so whatever the index holds, it is rebuilt from the log.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

import attrs

from runfold.kernel import (
    CorruptEvent,
    CorruptIndex,
    HistoryError,
    HookHolder,
    RunIndex,
    RunNotSupported,
    RunSummary,
    SequenceConflict,
    TokenConflict,
    Wakeup,
    run_index,
)
from runfold.stores.protocol import EventStore, IndexRewriter, replay_run

__all__ = ["IndexRewriter", "Problem", "VerifyReport", "can_rebuild", "verify_store"]

_FAR_FUTURE = datetime.max.replace(tzinfo=UTC)
_EVERY = 2**31 - 1
_PAGE = 500


@attrs.frozen(kw_only=True)
class Problem:
    """Something wrong with one run: its history does not replay, or its index rows differ."""

    run_id: str
    kind: Literal["history", "index"]
    detail: str
    repaired: bool


@attrs.frozen(kw_only=True)
class VerifyReport:
    """What `verify_store` found: how many runs it replayed and the problems."""

    runs: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        """True when nothing is left wrong (every problem found was repaired)."""
        return all(p.repaired for p in self.problems)


def can_rebuild(store: EventStore) -> bool:
    """Whether `store` offers the optional `rewrite_index` repair (an `isinstance` check)."""
    return isinstance(store, IndexRewriter)


async def verify_store(
    store: EventStore,
    *,
    now: datetime,
    rebuild: bool = False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> VerifyReport:
    """Replay every run and compare its summary, hook and wakeup rows with `run_index`.

    Runs are listed page by page (`list_runs`) and each is replayed (`replay_run`); rows of
    runs without a summary are found too. With `rebuild`, a run whose history replays gets its
    index rows rewritten. A listing that meets rows that do not decode (`CorruptIndex`) reports
    their run; with `rebuild` it rewrites them from the run's events and lists again, without it
    the check ends there (it cannot list past them). `progress(done, total)` is called as runs
    are checked. Other store errors propagate.

    Raises:
        ValueError: `rebuild` is asked of a store without `rewrite_index`.
    """
    if rebuild and not can_rebuild(store):
        raise ValueError(f"{type(store).__name__} cannot rewrite its index (no rewrite_index)")
    problems: list[Problem] = []
    while True:
        try:
            summaries, hooks, wakeups = await _index_rows(store, now)
            break
        except CorruptIndex as exc:
            repaired = rebuild and not any(p.run_id == exc.run_id for p in problems)
            if repaired:
                repaired = await _rebuild_from_log(store, exc.run_id, now)
            detail = str(exc) + ("" if repaired else _CANNOT_LIST_PAST)
            problems.append(
                Problem(run_id=exc.run_id, kind="index", detail=detail, repaired=repaired)
            )
            if not repaired:
                return VerifyReport(runs=0, problems=tuple(problems))

    run_ids = sorted(summaries.keys() | hooks.keys() | wakeups.keys())
    for done, run_id in enumerate(run_ids, start=1):
        found = await _check_run(
            store,
            run_id,
            summaries.get(run_id),
            hooks.get(run_id, set()),
            wakeups.get(run_id, set()),
            now=now,
            rebuild=rebuild,
        )
        if found is not None:
            problems.append(found)
        progress(done, len(run_ids))
    if not rebuild:  # (a rebuild is fenced on the run's head: it never rewrites a moving run)
        problems = await _confirmed(store, problems, now)
    return VerifyReport(runs=len(run_ids), problems=tuple(problems))


_LOOKS = 3


async def _confirmed(store: EventStore, problems: list[Problem], now: datetime) -> list[Problem]:
    """`problems`, less the index differences that were only a store being written meanwhile.

    Index rows are listed first and runs replayed after, so a run appended to in between looks
    wrong. Each suspect is looked at again, from fresh rows, and kept only if the difference
    shows while its head stood still from before the rows were listed until after its replay;
    a run that keeps moving through `_LOOKS` looks is not reported (the next verify sees it).
    """
    suspects = {p.run_id: p for p in problems if p.kind == "index" and not p.repaired}
    if not suspects:
        return problems
    kept = [p for p in problems if p.run_id not in suspects]
    for _ in range(_LOOKS):
        heads = {run_id: await store.head(run_id) for run_id in suspects}
        try:
            summaries, hooks, wakeups = await _index_rows(store, now)
        except CorruptIndex:
            return problems  # the listing itself is broken: the first look stands
        moving: dict[str, Problem] = {}
        for run_id, problem in suspects.items():
            found = await _check_run(
                store,
                run_id,
                summaries.get(run_id),
                hooks.get(run_id, set()),
                wakeups.get(run_id, set()),
                now=now,
                rebuild=False,
            )
            if await store.head(run_id) != heads[run_id]:
                moving[run_id] = problem
            elif found is not None:
                kept.append(found)
        if not moving:
            break
        suspects = moving
    return kept


_CANNOT_LIST_PAST = " (the check stopped there: --rebuild-index rewrites the rows from the events)"


async def _rebuild_from_log(store: EventStore, run_id: str, now: datetime) -> bool:
    """Rewrite the run's index rows from its events; whether that was done."""
    assert isinstance(store, IndexRewriter)
    try:
        replayed = await replay_run(store, run_id)
        expected = run_index(replayed.snapshot) if replayed is not None else None
        await store.rewrite_index(run_id, expected, now=now)
    except (CorruptEvent, HistoryError, RunNotSupported, SequenceConflict, TokenConflict):
        return False
    return True


async def _index_rows(
    store: EventStore, now: datetime
) -> tuple[dict[str, RunSummary], dict[str, set[HookHolder]], dict[str, set[Wakeup]]]:
    """Every summary, live hook holder and wakeup the store lists, by run id."""
    summaries: dict[str, RunSummary] = {}
    cursor: str | None = None
    while True:
        page = await store.list_runs(cursor=cursor, limit=_PAGE)
        summaries.update((s.run_id, s) for s in page.items)
        if not page.has_more or page.cursor is None:
            break
        cursor = page.cursor
    hooks: dict[str, set[HookHolder]] = {}
    cursor = None
    while True:
        held = await store.list_hooks(cursor=cursor, limit=_PAGE, now=now)
        for holder in held.items:
            hooks.setdefault(holder.run_id, set()).add(holder)
        if not held.has_more or held.cursor is None:
            break
        cursor = held.cursor
    wakeups: dict[str, set[Wakeup]] = {}
    for wakeup in await store.due_wakeups(_FAR_FUTURE, limit=_EVERY):
        wakeups.setdefault(wakeup.run_id, set()).add(wakeup)
    return summaries, hooks, wakeups


async def _check_run(
    store: EventStore,
    run_id: str,
    summary: RunSummary | None,
    hooks: set[HookHolder],
    wakeups: set[Wakeup],
    *,
    now: datetime,
    rebuild: bool,
) -> Problem | None:
    try:
        replayed = await replay_run(store, run_id)
        expected: RunIndex | None = run_index(replayed.snapshot) if replayed else None
    except (CorruptEvent, HistoryError, RunNotSupported) as exc:
        return Problem(run_id=run_id, kind="history", detail=str(exc), repaired=False)
    differences = _differences(summary, hooks, wakeups, expected, now)
    if expected is not None:
        for claim in expected.claims_at(now):
            try:
                holder = await store.find_hook(claim.token, now=now)
            except CorruptIndex as exc:
                differences.append(f"the token of hook {claim.hook_id!r}: {exc.reason}")
                continue
            if holder is None or (holder.run_id, holder.hook_id) != (run_id, claim.hook_id):
                differences.append(f"the token of hook {claim.hook_id!r} is not indexed to it")
    if not differences:
        return None
    detail = "; ".join(differences)
    if not rebuild or not isinstance(store, IndexRewriter):
        return Problem(run_id=run_id, kind="index", detail=detail, repaired=False)
    try:
        await store.rewrite_index(run_id, expected, now=now)
    except SequenceConflict:
        detail += " (not repaired: the run moved on while being verified; verify again)"
        return Problem(run_id=run_id, kind="index", detail=detail, repaired=False)
    except TokenConflict as exc:
        detail += f" (not repaired: {exc})"
        return Problem(run_id=run_id, kind="index", detail=detail, repaired=False)
    return Problem(run_id=run_id, kind="index", detail=detail, repaired=True)


def _differences(
    summary: RunSummary | None,
    hooks: set[HookHolder],
    wakeups: set[Wakeup],
    expected: RunIndex | None,
    now: datetime,
) -> list[str]:
    if expected is None:
        return ["index rows of a run that has no events"]
    found = []
    if summary is None:
        found.append("no summary row")
    elif summary != expected.summary:
        fields = [
            f.name
            for f in attrs.fields(RunSummary)
            if getattr(summary, f.name) != getattr(expected.summary, f.name)
        ]
        found.append(f"summary differs in {', '.join(fields)}")
    live_claims = {
        HookHolder(
            run_id=expected.summary.run_id, hook_id=c.hook_id, retained_until=c.retained_until
        )
        for c in expected.claims_at(now)
    }
    if hooks != live_claims:
        found.append(
            f"hook rows {sorted(h.hook_id for h in hooks)} should be "
            f"{sorted(h.hook_id for h in live_claims)}"
        )
    if wakeups != set(expected.wakeups):
        found.append(f"{len(wakeups)} wakeup row(s), expected {len(expected.wakeups)}")
    return found
