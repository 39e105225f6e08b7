"""Checks of the argument rules: every store refuses the same arguments with the same
`InvalidArgument` naming them, before any I/O and before `StoreClosed`, and takes every value at
the edges of what is allowed (`runfold.stores.arguments`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    T0,
    caught_up_feed,
    created,
    envelopes_for,
    everything,
    hook,
    index_after,
    raises,
    started,
    write,
)
from runfold.kernel import InvalidArgument, RunCompleted, WaitCreated
from runfold.stores.protocol import EventStore

SURROGATE = "run-\ud800"
"""Text UTF-8 cannot encode: a lone surrogate."""
NAIVE = datetime(2026, 1, 1, 12, 0)
"""A naive datetime: no instant at all."""
TOO_BIG = 2**63
"""One past the largest count a 64-bit signed column holds."""
TOO_SMALL = -(2**63) - 1
"""One below the smallest."""
HIGHEST = 2**63 - 1
LOWEST = -(2**63)

Call = Callable[[Any], Awaitable[Any]]
"""A call of a store method (the store typed `Any`: the calls break the protocol's types)."""


class _Refusals:
    """The calls that break one argument rule each, with the argument the refusal must name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Call]] = []

    def add(self, argument: str, method: str, *args: Any, **kwargs: Any) -> None:
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])

        async def call(store: Any) -> Any:
            return await getattr(store, method)(*args, **kwargs)

        self.calls.append((f"{method}({shown})", argument, call))


def _refusals(ctx: Context) -> list[tuple[str, str, Call]]:
    """`(the call shown, the argument its refusal must name, the call)`."""
    events = [created()]
    good = {
        "run_id": "new",
        "expected_sequence": 0,
        "events": events,
        "index": index_after([], envelopes_for("new", 0, events, T0)),
        "recorded_at": T0,
    }
    found = _Refusals()
    for argument, value in [
        ("run_id", SURROGATE),
        ("run_id", 7),
        ("expected_sequence", 0.0),
        ("expected_sequence", False),
        ("events", "run_created"),
        ("events", [object()]),
        ("events", []),
        ("index", None),
        ("recorded_at", NAIVE),
        ("recorded_at", "2026-01-01"),
        ("expected_position", 1.5),
    ]:
        found.add(argument, "append_if_sequence", **{**good, argument: value})
    found.add("index", "append_if_sequence", **{**good, "run_id": "other"})
    for text in (SURROGATE, None, b"r"):
        found.add("run_id", "read", text)
        found.add("run_id", "head", text)
        found.add("run_id", "read_by_correlation", text, "s")
        found.add("correlation_id", "read_by_correlation", "r", text)
    for bad in (TOO_BIG, TOO_SMALL, 1.5, True, "1"):
        for argument in ("after", "limit"):
            found.add(argument, "read", "r", **{argument: bad})
            found.add(argument, "read_by_correlation", "r", "s", **{argument: bad})
        found.add("limit", "list_runs", limit=bad)
        found.add("limit", "list_hooks", limit=bad, now=T0)
        found.add("limit", "due_wakeups", T0, limit=bad)
    for flag in ("yes", None, 1):
        found.add("descending", "read", "r", descending=flag)
        found.add("descending", "read_by_correlation", "r", "s", descending=flag)
    for argument, value in [
        ("workflow_name", SURROGATE),
        ("workflow_name", 1),
        ("status", "finished"),
        ("parent_run_id", SURROGATE),
        ("created_before", NAIVE),
        ("cursor", SURROGATE),
        ("cursor", "not-a-cursor"),
        ("cursor", 7),
    ]:
        found.add(argument, "list_runs", **{argument: value})
    found.add("run_ids", "get_runs", "r")
    found.add("run_ids", "get_runs", None)
    found.add("an item of run_ids", "get_runs", ["r", SURROGATE])
    found.add("an item of run_ids", "get_runs", [1])
    found.add("token", "find_hook", "secret-\udfff", now=T0)
    found.add("token", "find_hook", b"secret", now=T0)
    found.add("now", "find_hook", "tok", now=NAIVE)
    found.add("run_id", "list_hooks", run_id=SURROGATE, now=T0)
    found.add("cursor", "list_hooks", cursor="x", now=T0)
    found.add("now", "list_hooks", now=NAIVE)
    found.add("now", "due_wakeups", NAIVE)
    found.add("now", "due_wakeups", None)
    found.add("workflow_names", "due_wakeups", T0, workflow_names="wf")
    found.add("an item of workflow_names", "due_wakeups", T0, workflow_names=[SURROGATE])
    found.add("workflow_names", "next_wakeup", workflow_names="wf")
    found.add("an item of workflow_names", "next_wakeup", workflow_names=["wf", SURROGATE])
    if ctx.capabilities.global_feed:
        for bad in (TOO_BIG, TOO_SMALL, 1.5, False):
            found.add("after_position", "read_all", after_position=bad)
            found.add("limit", "read_all", limit=bad)
    if ctx.capabilities.retention:
        found.add("terminal_before", "delete_runs", terminal_before=NAIVE, limit=1)
        found.add("limit", "delete_runs", terminal_before=T0, limit=TOO_BIG)
        found.add("limit", "delete_runs", terminal_before=T0, limit=1.0)
        found.add("run_ids", "delete_runs", terminal_before=T0, limit=1, run_ids="r")
        found.add(
            "an item of run_ids", "delete_runs", terminal_before=T0, limit=1, run_ids=[SURROGATE]
        )
    if ctx.capabilities.rewrite_index:
        found.add("run_id", "rewrite_index", SURROGATE, None, now=T0)
        found.add("index", "rewrite_index", "r", "rows", now=T0)
        found.add("now", "rewrite_index", "r", None, now=NAIVE)
    return found.calls


async def _refused(store: EventStore, what: str, argument: str, call: Call) -> None:
    refusal = await raises(InvalidArgument, call(store), what)
    assert refusal.argument == argument, f"{what}: the refusal names {refusal.argument!r}"
    assert "secret" not in str(refusal), f"{what}: the message quotes the token"


@check("arguments")
async def arguments_refused_alike(ctx: Context, store: EventStore) -> None:
    """Every method refuses an argument the contract does not allow with `InvalidArgument` (a
    `ValueError`) whose `argument` names it, and writes nothing: text UTF-8 cannot encode (lone
    surrogates in run ids, tokens, filters, cursors), text of another type, a single string
    where a collection is due, counts and offsets that are not `int`s (floats, bools) or that
    a 64-bit column cannot hold, naive or non-`datetime` times, a non-`bool` `descending`, an
    unknown `status`, a cursor the store did not make, and, for an append, empty or non-event
    `events` or an `index` of another run. A closed store gives the same refusals: arguments
    are checked before anything else."""
    await write(store, "r", *started(), hook("h", "tok"), WaitCreated(wait_id="w", resume_at=T0))
    before = await everything(store, ["r", "new"], ctx.capabilities)
    refusals = _refusals(ctx)
    for what, argument, call in refusals:
        await _refused(store, what, argument, call)
    assert await everything(store, ["r", "new"], ctx.capabilities) == before, "a refusal wrote"
    await store.close()
    for what, argument, call in refusals:
        await _refused(store, f"{what}, on a closed store", argument, call)


@check("arguments")
async def arguments_at_their_bounds(ctx: Context, store: EventStore) -> None:
    """Every value at the edge of what is allowed is taken: counts and offsets of -2**63 and
    2**63 - 1 (a negative limit or offset means 0: no item, or from the start), times with any
    offset and at the ends of the `datetime` range, text with U+0000 and characters outside the
    Basic Multilingual Plane (an unknown run reads as empty), and any collection of ids (a
    tuple, a set, an empty one)."""
    written = await write(store, "r", *started())
    await write(store, "done", created(), RunCompleted(output=b""))
    everyone = [s.run_id for s in (await store.list_runs(limit=ALL)).items]
    far_east = timezone(timedelta(hours=14))
    latest = datetime.max.replace(tzinfo=far_east) - timedelta(days=1)
    earliest = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
    assert [e.sequence for e in await store.read("r", after=LOWEST)] == [1, 2]
    assert await store.read("r", after=HIGHEST) == []
    assert [e.sequence for e in await store.read("r", limit=HIGHEST)] == [1, 2]
    assert await store.read("r", limit=-1) == [], "a negative limit is 0"
    assert await store.read("r", limit=LOWEST) == []
    descending = await store.read("r", after=LOWEST, limit=HIGHEST, descending=True)
    assert [e.sequence for e in descending] == [2, 1], "after <= 0 reads down from the head"
    assert await store.read_by_correlation("r", "s", after=HIGHEST, limit=HIGHEST) == []
    for limit, count in [(HIGHEST, 2), (0, 0), (-1, 0), (LOWEST, 0)]:
        page = await store.list_runs(limit=limit, created_before=latest)
        assert (len(page.items), page.has_more) == (count, False), f"list_runs limit {limit}"
        hooks = await store.list_hooks(limit=limit, now=latest)
        assert hooks.items == () and not hooks.has_more, f"list_hooks limit {limit}"
        assert await store.due_wakeups(latest, limit=limit) == [], f"due_wakeups limit {limit}"
    assert sorted(everyone) == ["done", "r"]
    assert (await store.list_runs(created_before=earliest)).items == ()
    for odd in ["a\x00b", "\U0001f600", "\ufffe", ""]:
        assert await store.read(odd) == [] and await store.head(odd) == 0
        assert await store.find_hook(odd, now=T0) is None
        assert (await store.list_runs(workflow_name=odd)).items == ()
    for run_ids in [("r", "done"), (), [], ["r", "r"]]:
        summaries = await store.get_runs(run_ids)
        assert [s and s.run_id for s in summaries] == list(run_ids)
    assert await store.due_wakeups(latest, workflow_names=("wf",)) == []
    assert await store.due_wakeups(latest, workflow_names=frozenset()) == []
    assert await store.next_wakeup(workflow_names={"wf"}) is None
    if ctx.capabilities.global_feed:
        assert await store.read_all(after_position=HIGHEST) == []
        assert await store.read_all(limit=-1) == [] and await store.read_all(limit=LOWEST) == []
        assert len(await caught_up_feed(store)) == 4
        feed = await store.read_all(after_position=LOWEST, limit=HIGHEST)
        assert len(feed) == 4, "after_position <= 0 reads the feed from its start"
    if ctx.capabilities.retention:
        assert await store.delete_runs(terminal_before=earliest, limit=HIGHEST) == 0
        assert await store.delete_runs(terminal_before=latest, limit=-1) == 0
        assert await store.delete_runs(terminal_before=latest, limit=HIGHEST, run_ids=()) == 0
        assert await store.delete_runs(terminal_before=latest, limit=HIGHEST) == 1
    assert [e.sequence for e in await store.read("r")] == [e.sequence for e in written]
