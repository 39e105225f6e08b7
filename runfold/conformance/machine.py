"""`StoreStateMachine`: random appends and queries against a store and the memory oracle at once.

Each example draws a valid history for each of three runs (`strategies.valid_histories()`) and
appends a random prefix of each; then hypothesis interleaves rules: appending the next pieces of
the histories, appending at a stale, future or negative sequence, empty batches, claiming a token
another run holds, retention, and every query of the protocol. Each call goes to the store under
test and to a `MemoryStore`, and the answers must be the same (feed positions are each store's
own: only their order is compared). Summaries are also checked against the kernel's derivation
from the stored history.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runfold.conformance import strategies
from runfold.conformance._core import Capabilities, Context, check
from runfold.conformance.builders import (
    ALL,
    caught_up_feed,
    created,
    envelopes_for,
    index_after,
    kernel_summary,
    log,
    plain,
    positions,
    walk,
)
from runfold.kernel import (
    LIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Envelope,
    Event,
    HookClaim,
    HookCreated,
    HookHolder,
    RunIndex,
    SequenceConflict,
    TokenConflict,
)
from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore

__all__ = ["StoreStateMachine"]

T = TypeVar("T")

RUN_IDS = ("run-1", "run-2", "run-3")
"""The runs of every example (run-2 is also `strategies.FOREIGN_RUN_ID`, a parent and a holder)."""
_RUNS = st.sampled_from(RUN_IDS)
_ANY_RUN = st.sampled_from((*RUN_IDS, "run-unknown"))
_CORRELATIONS = st.sampled_from(("s0", "s1", "w0", "h0", "h1", "wr0", "p0", "c0", "nope"))
_OFFSETS = st.sampled_from(
    tuple(timedelta(seconds=s) for s in (0, 1, 60, 3600, 86_400, 31 * 86_400, -3600))
)
_LATER = st.sampled_from(tuple(timedelta(seconds=s) for s in (0, 1, 3600, 86_400, 31 * 86_400)))
_STATUSES = st.sampled_from(tuple(sorted(LIVE_RUN_STATUSES | TERMINAL_RUN_STATUSES)))


def _head_of(run_id: str) -> Callable[[EventStore], Awaitable[int]]:
    return lambda store: store.head(run_id)


def _read_of(run_id: str) -> Callable[[EventStore], Awaitable[list[Envelope]]]:
    return lambda store: store.read(run_id)


def _holder_of(token: str, now: datetime) -> Callable[[EventStore], Awaitable[HookHolder | None]]:
    return lambda store: store.find_hook(token, now=now)


def _after(feed: list[Envelope], count: int) -> int:
    """The position to read the feed after to skip its first `count` envelopes (which must have
    rising positions)."""
    return positions(feed)[count - 1] if count else 0


def _outcome(result: Any) -> Any:
    """A comparable form of an answer or an error: feed positions and cursors are left out."""
    if isinstance(result, SequenceConflict):
        return ("SequenceConflict", result.run_id, result.expected, result.actual)
    if isinstance(result, TokenConflict):
        return ("TokenConflict", result.token, result.holder_run_id, result.holder_hook_id)
    if isinstance(result, BaseException):
        return (type(result).__name__,)
    if isinstance(result, list) and result and isinstance(result[0], Envelope):
        return plain(result)
    return result


class StoreStateMachine(RuleBasedStateMachine):
    """A hypothesis state machine comparing a store with `MemoryStore` call by call.

    Subclass it with `async def make_store(self)` (and `capabilities` if the store lacks the
    global feed or retention), then `TestMyStoreMachine = MyMachine.TestCase` lets pytest run it
    under your hypothesis settings. It drives its own event loop, one per example.
    `StoreConformance.test_state_machine` runs it with the kit's effort and seed.
    """

    capabilities: ClassVar[Capabilities] = Capabilities()
    timeout: ClassVar[float] = 120.0
    """Seconds any one store call may take before the example fails."""

    async def make_store(self) -> EventStore:
        """A fresh, empty store of the kind under test (the one hook a subclass must give)."""
        raise NotImplementedError("a StoreStateMachine subclass must define `async def make_store`")

    def __init__(self) -> None:
        super().__init__()
        self._runner = asyncio.Runner()
        self.oracle = MemoryStore()
        try:
            self.store = self._await(self.make_store())
        except BaseException:
            self._runner.close()
            raise
        self.plans: dict[str, list[Envelope]] = {}
        self.done: dict[str, int] = dict.fromkeys(RUN_IDS, 0)
        self.tokens: list[str] = []
        self.latest = strategies.START

    def _await(self, coroutine: Coroutine[Any, Any, T]) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(self.timeout):
                return await coroutine

        return self._runner.run(bounded())

    def teardown(self) -> None:
        """Close the store and the example's event loop."""
        try:
            self._await(self.store.close())
        finally:
            self._runner.close()

    def _answer(self, store: EventStore, call: Callable[[EventStore], Awaitable[Any]]) -> Any:
        """What `call(store)` returns, or the error it raises."""

        async def answer() -> Any:
            try:
                return await call(store)
            except Exception as exc:
                return exc

        return self._await(answer())

    @staticmethod
    def _compare(actual: Any, expected: Any, what: str) -> None:
        assert _outcome(actual) == _outcome(expected), (
            f"{what}: the store answered {_outcome(actual)!r}, the oracle {_outcome(expected)!r}"
        )

    def _both(self, call: Callable[[EventStore], Awaitable[Any]], what: str) -> Any:
        """`call` on the store and on the oracle; their answers (or errors) must be the same.
        Returns the oracle's answer, or its error."""
        expected = self._answer(self.oracle, call)
        self._compare(self._answer(self.store, call), expected, what)
        return expected

    # --- appends --------------------------------------------------------------------------------

    @initialize(
        plans=st.tuples(*(strategies.valid_histories(r, max_commands=20) for r in RUN_IDS)),
        data=st.data(),
    )
    def plan(self, plans: tuple[list[Envelope], ...], data: st.DataObject) -> None:
        """Draw the history each run will be built from, piece by piece, and append a prefix.

        A drawn prefix of each is appended at once (interleaved), so every example starts from a
        populated store.
        """
        self.plans = {history[0].run_id: history for history in plans}
        self.tokens = sorted(
            {e.event.token for h in plans for e in h if isinstance(e.event, HookCreated)}
        )
        targets = {r: data.draw(st.integers(0, len(p)), label=r) for r, p in self.plans.items()}
        while pending := [r for r in RUN_IDS if self.done[r] < targets[r]]:
            run_id = data.draw(st.sampled_from(pending))
            if not self._append_next(run_id, data.draw(st.integers(1, 4))):
                targets[run_id] = 0  # refused (a token another run holds): leave it to the rules

    @rule(pieces=st.lists(st.tuples(_RUNS, st.integers(1, 4)), min_size=1, max_size=8))
    def append(self, pieces: list[tuple[str, int]]) -> None:
        """Append the next pieces of the runs' plans, one after the other."""
        for run_id, size in pieces:
            self._append_next(run_id, size)

    def _append_next(self, run_id: str, size: int) -> bool:
        """Append the next piece (up to `size` events of one `recorded_at`) of the run's plan;
        False when there is none or the append was refused."""
        plan, done = self.plans[run_id], self.done[run_id]
        if done == len(plan):
            return False
        at = plan[done].recorded_at
        piece = list(itertools.takewhile(lambda e: e.recorded_at == at, plan[done : done + size]))
        index = index_after(plan[:done], piece)
        events = [e.event for e in piece]
        result = self._both(
            lambda s: s.append_if_sequence(run_id, done, events, index=index, recorded_at=at),
            f"append {len(events)} event(s) to {run_id} at {done}",
        )
        if not isinstance(result, list):
            return False
        self.done[run_id] += len(events)
        self.latest = max(self.latest, at)
        self._check_positions(self._await(self.store.read(run_id, after=done)))
        return True

    def _check_positions(self, envelopes: list[Envelope]) -> None:
        if self.capabilities.global_feed:
            positions(envelopes)

    def _index(self, run_id: str, head: int, events: Sequence[Event], at: datetime) -> RunIndex:
        """Index rows for an append the store must refuse: the run's current ones (the events
        need not be valid after its history), or those of `events` for a run with none."""
        if head:
            return index_after(self.plans[run_id][:head], [])
        return index_after([], envelopes_for(run_id, 0, events, at))

    @rule(run_id=_ANY_RUN, delta=st.sampled_from((-3, -1, 0, 1, 2)))
    def append_refused(self, run_id: str, delta: int) -> None:
        """An append at a wrong sequence, or an empty one, is refused the same way by both stores.

        The sequence is stale, future or negative (`delta` from the head); `delta` 0 appends
        nothing.
        """
        head = self.done.get(run_id, 0)
        at = self.latest
        events: list[Event] = [log("stale")] if head else [created()]
        index = self._index(run_id, head, events, at)
        if not delta:
            events = []
        self._both(
            lambda s: s.append_if_sequence(
                run_id, head + delta, events, index=index, recorded_at=at
            ),
            f"append {len(events)} event(s) to {run_id} (head {head}) at {head + delta}",
        )

    @rule(run_id=_RUNS, data=st.data())
    def claim_held_token(self, run_id: str, data: st.DataObject) -> None:
        """An append claiming a token another run's hook holds is refused the same way."""
        head = self.done[run_id]
        if not head or not self.tokens:
            return
        token = data.draw(st.sampled_from(self.tokens))
        held = self._await(self.oracle.find_hook(token, now=self.latest))
        if held is None or held.run_id == run_id:
            return
        at = self.latest
        events = [log("intruder")]
        index = self._index(run_id, head, events, at)
        claim = HookClaim(token=token, hook_id="intruder", retained_until=None)
        index = attrs.evolve(index, hooks=(*index.hooks, claim))
        result = self._both(
            lambda s: s.append_if_sequence(run_id, head, events, index=index, recorded_at=at),
            f"{run_id} claims a token {held.run_id} holds",
        )
        assert isinstance(result, TokenConflict), f"the oracle accepted a held token: {result!r}"

    @precondition(lambda self: self.capabilities.retention)
    @rule(offset=_OFFSETS, limit=st.integers(0, 3))
    def delete_runs(self, offset: timedelta, limit: int) -> None:
        """Retention deletes the same runs; a deleted run is then built again from its start."""
        cutoff = self.latest + offset
        self._both(
            lambda s: s.delete_runs(terminal_before=cutoff, limit=limit),
            f"delete_runs(terminal_before={cutoff}, limit={limit})",
        )
        for run_id in RUN_IDS:
            if self._await(self.oracle.head(run_id)) == 0:
                self.done[run_id] = 0

    # --- queries --------------------------------------------------------------------------------

    @rule(
        run_id=_ANY_RUN,
        after=st.integers(-1, 14),
        limit=st.none() | st.integers(0, 5),
        descending=st.booleans(),
    )
    def read(self, run_id: str, after: int, limit: int | None, descending: bool) -> None:
        """`read` answers the same."""
        self._both(
            lambda s: s.read(run_id, after=after, limit=limit, descending=descending),
            f"read({run_id}, after={after}, limit={limit}, descending={descending})",
        )

    @rule(
        run_id=_ANY_RUN,
        correlation=_CORRELATIONS,
        after=st.integers(0, 14),
        limit=st.none() | st.integers(0, 5),
        descending=st.booleans(),
    )
    def read_by_correlation(
        self, run_id: str, correlation: str, after: int, limit: int | None, descending: bool
    ) -> None:
        """`read_by_correlation` answers the same."""
        self._both(
            lambda s: s.read_by_correlation(
                run_id, correlation, after=after, limit=limit, descending=descending
            ),
            f"read_by_correlation({run_id}, {correlation!r}, after={after}, limit={limit}, "
            f"descending={descending})",
        )

    @rule(run_ids=st.lists(_ANY_RUN, max_size=4))
    def get_runs(self, run_ids: list[str]) -> None:
        """`get_runs` answers the same."""
        self._both(lambda s: s.get_runs(run_ids), f"get_runs({run_ids})")

    @rule(
        workflow_name=st.none() | st.sampled_from(("fetch", "send", "charge")),
        status=st.none() | _STATUSES,
        parent_run_id=st.none() | _RUNS,
        created_before=st.none() | _OFFSETS,
        limit=st.integers(1, 4),
    )
    def list_runs(
        self,
        workflow_name: str | None,
        status: Any,
        parent_run_id: str | None,
        created_before: timedelta | None,
        limit: int,
    ) -> None:
        """Every page of `list_runs` answers the same, cursor after cursor."""
        before = None if created_before is None else strategies.START + created_before

        def listing(store: EventStore) -> Awaitable[list[Any]]:
            return walk(
                lambda cursor: store.list_runs(
                    workflow_name=workflow_name,
                    status=status,
                    parent_run_id=parent_run_id,
                    created_before=before,
                    cursor=cursor,
                    limit=limit,
                ),
                limit,
            )

        self._both(
            listing,
            f"list_runs(workflow_name={workflow_name}, status={status}, "
            f"parent_run_id={parent_run_id}, created_before={before}, limit={limit})",
        )

    def _now(self, later: timedelta) -> datetime:
        return self.latest + later

    @rule(data=st.data(), later=_LATER)
    def find_hook(self, data: st.DataObject, later: timedelta) -> None:
        """`find_hook` answers the same, now or later (never before the latest append)."""
        token = data.draw(st.sampled_from([*self.tokens, "tok-none"]))
        now = self._now(later)
        self._both(lambda s: s.find_hook(token, now=now), f"find_hook at {now}")

    @rule(run_id=st.none() | _ANY_RUN, limit=st.integers(1, 4), later=_LATER)
    def list_hooks(self, run_id: str | None, limit: int, later: timedelta) -> None:
        """Every page of `list_hooks` answers the same."""
        now = self._now(later)

        def listing(store: EventStore) -> Awaitable[list[HookHolder]]:
            return walk(
                lambda cursor: store.list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now),
                limit,
            )

        self._both(listing, f"list_hooks(run_id={run_id}, limit={limit}, now={now})")

    @rule(offset=_OFFSETS, limit=st.integers(0, 5))
    def wakeups(self, offset: timedelta, limit: int) -> None:
        """`due_wakeups` (at any time) and `next_wakeup` answer the same."""
        now = self.latest + offset
        self._both(lambda s: s.due_wakeups(now, limit=limit), f"due_wakeups({now}, {limit})")
        self._both(lambda s: s.next_wakeup(), "next_wakeup()")

    @precondition(lambda self: self.capabilities.global_feed)
    @rule(start=st.integers(0, 60), limit=st.integers(0, 6))
    def read_all(self, start: int, limit: int) -> None:
        """The feed holds the same envelopes in the same order, at rising positions.

        Reading after the `start`-th of them answers the same too.
        """
        feed = self._both(caught_up_feed, "read_all()")
        mine = self._await(caught_up_feed(self.store))
        start = min(start, len(feed))
        expected = self._answer(
            self.oracle, lambda s: s.read_all(after_position=_after(feed, start), limit=limit)
        )
        actual = self._answer(
            self.store, lambda s: s.read_all(after_position=_after(mine, start), limit=limit)
        )
        self._compare(actual, expected, f"read_all after envelope {start}, limit {limit}")

    @invariant()
    def heads_agree(self) -> None:
        """Every run's head is the same in both and is what was appended."""
        for run_id in RUN_IDS:
            head = self._both(_head_of(run_id), f"head({run_id})")
            assert head == self.done[run_id]

    @rule(later=_LATER)
    def everything_agrees(self, later: timedelta) -> None:
        """Every query over everything answers the same, and summaries are the kernel's.

        That is reads of every run, summaries, the whole listing, every token's holder, every
        live hook, every wakeup and the whole feed; each run's summary is the kernel's
        derivation from its stored history.
        """
        now = self._now(later)
        for run_id in (*RUN_IDS, "run-unknown"):
            self._both(_read_of(run_id), f"read({run_id})")
            expected = self._await(kernel_summary(self.store, run_id))
            assert self._await(self.store.get_runs([run_id])) == [expected], (
                f"the summary of {run_id} is not the kernel's"
            )
        self._both(lambda s: s.list_runs(limit=ALL), "list_runs(limit=ALL)")
        for token in self.tokens:
            self._both(_holder_of(token, now), f"find_hook at {now}")
        self._both(lambda s: s.list_hooks(now=now, limit=ALL), f"list_hooks(now={now})")
        self._both(lambda s: s.due_wakeups(now, limit=ALL), f"due_wakeups({now})")
        self._both(lambda s: s.next_wakeup(), "next_wakeup()")
        if self.capabilities.global_feed:
            self._both(caught_up_feed, "read_all()")


@check("state_machine", sync=True)
def state_machine(ctx: Context) -> None:
    """Property: `StoreStateMachine` (random valid, stale, future, negative, empty and
    token-conflicting appends, retention, and every query of the protocol, interleaved) finds no
    answer where the store and the `MemoryStore` oracle differ, and no summary that differs from
    the kernel's derivation."""

    async def make_store(machine: StoreStateMachine) -> EventStore:
        return await ctx.make_store()

    machine = type(
        "ConformanceMachine",
        (StoreStateMachine,),
        {"make_store": make_store, "capabilities": ctx.capabilities, "timeout": ctx.timeout},
    )
    run_state_machine_as_test(ctx.effort.seeded(machine), settings=ctx.effort.settings())
