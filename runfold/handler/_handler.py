"""`CommandHandler`'s cycle: load → decide → append, retried on conflicts and store faults."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial

import attrs

from runfold.handler._cache import Cached, RunCache
from runfold.handler._doubt import Doubts, Recognised, Sent, moved_past, recognise
from runfold.handler._ids import utc_now
from runfold.kernel import (
    BatchDecision,
    Command,
    CommitUnknown,
    Envelope,
    HookHolder,
    HookNotFound,
    InvalidArgument,
    InvalidCommand,
    Limits,
    Ownership,
    ReceiveHook,
    Rejection,
    RunNotFound,
    SequenceConflict,
    Snapshot,
    StoreUnavailable,
    TokenConflict,
    decide_many,
    recheck_decision,
    run_index,
)
from runfold.kernel.fast import fast_init
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.store_retry import DEFAULT_STORE_RETRY, Patience, StoreRetry
from runfold.stores.arguments import check_text
from runfold.stores.protocol import EventStore

__all__ = ["CommandHandler", "Outcome"]


_MAX_CONFLICT_PAUSE = 0.05
"""Seconds: the longest pause `conflict_backoff` makes before one attempt."""
_DOUBTS_KEPT = 1024
"""How many runs' appends in doubt (of calls that gave up) a handler keeps, the oldest dropped."""


@fast_init
@attrs.frozen(kw_only=True)
class Outcome:
    """What `CommandHandler.execute` (or `execute_many`) did.

    `snapshot` is the run after the commands; `appended` the envelopes they wrote (empty when
    all were no-ops); `missed` the envelopes other writers appended after the caller's
    `known_sequence` and before this decision; `created_step` is True when a lazy `StartStep`
    created its step, i.e. this caller won the race and should run the step body.
    """

    snapshot: Snapshot
    appended: tuple[Envelope, ...]
    missed: tuple[Envelope, ...]
    created_step: bool = False


class CommandHandler:
    """Executes commands against runs kept in `store`: load, decide, append, retry on conflict.

    Snapshots are cached (LRU). On a warm cache a command costs one store call, the append: it
    is fenced by the cached head's sequence and feed position, so a run that moved (or was
    deleted and created again) refuses it with `SequenceConflict`, and only then does the handler
    read what it missed, from the cached head on, and decide again. Every rule is `decide`'s, so
    it holds on every store, concurrency included.

    Args:
        store: Where the runs are kept.
        clock: Supplies `now` for each decision and every appended event's `recorded_at`.
        limits: The bounds `decide` and `project_run` check; `DEFAULT_LIMITS` when None.
        cache_size: How many runs to keep cached (0: none; every command then reads the run).
        max_attempts: How many sequence conflicts one `execute` absorbs before giving up.
        conflict_backoff: Seconds. After its second sequence conflict in a row, an `execute`
            pauses before each further attempt, for a random time below `conflict_backoff ×
            2**conflicts` (at most 50 ms), so that writers racing for one run take turns
            instead of all retrying at once; 0 retries at once.
        store_retry: How long and how often a call that meets `StoreUnavailable` tries again
            (`DEFAULT_STORE_RETRY`: for up to 30 s); None raises the first one.

    Raises:
        ValueError: `cache_size` or `conflict_backoff` is negative, or `max_attempts` is
            below 1.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        clock: Callable[[], datetime] = utc_now,
        limits: Limits | None = None,
        cache_size: int = 1024,
        max_attempts: int = 16,
        conflict_backoff: float = 0.001,
        store_retry: StoreRetry | None = DEFAULT_STORE_RETRY,
    ) -> None:
        if cache_size < 0 or max_attempts < 1 or not conflict_backoff >= 0:
            raise ValueError("cache_size must be >= 0, max_attempts >= 1, conflict_backoff >= 0")
        self.store = store
        self.clock = clock
        self.limits = limits if limits is not None else DEFAULT_LIMITS
        self._cache = RunCache(store, self.limits, cache_size)
        self._doubts = Doubts(_DOUBTS_KEPT)
        self._max_attempts = max_attempts
        self._conflict_backoff = conflict_backoff
        self.store_retry = store_retry

    # --- the cycle ----------------------------------------------------------------------------

    async def execute(
        self,
        run_id: str,
        command: Command,
        *,
        known_sequence: int | None = None,
        now: datetime | None = None,
        acting_as: Ownership | None = None,
    ) -> Outcome:
        """Decide `command` on the run's freshest snapshot and append the result atomically.

        On a `SequenceConflict` (another writer appended first) the whole cycle runs again on
        the new tail; on a `TokenConflict` it decides again knowing the holder, which turns a
        `CreateHook` into a `HookConflict` event.

        Args:
            run_id: The run the command is for.
            command: What to decide.
            known_sequence: The last sequence the caller saw; what others appended after it
                comes back in `Outcome.missed`.
            now: The time of the decision, for every attempt (default: the clock's time at each
                attempt): the `recorded_at` of the events, so a host that showed its workflow
                the events before appending them can append them as shown.
            acting_as: The worker of a fleet the command is made for; it must own the run.

        Returns:
            The run after the command, what was appended (nothing for a no-op) and what was missed.

        Raises:
            Rejection: `decide` refused the command; nothing was written (`OwnershipLost`:
                `acting_as` does not own the run).
            SequenceConflict: The run kept moving under the command for `max_attempts` tries.
            TokenConflict: The store kept refusing a hook token for as many re-decisions.
            CorruptEvent: A stored event of the run does not decode.
            HistoryError: The stored history breaks a law of `project_run`.
            StoreUnavailable: The store could not be reached for longer than `store_retry`
                allows; nothing was written, retrying is safe.
            CommitUnknown: As `StoreUnavailable`, but an append was sent that could not be read
                back: it may have been written. Executing the same command again is safe: this
                handler keeps the append and, once the store answers, recognises it and returns
                the outcome it had; another handler decides the command anew on the run as it
                is (a `RecordLog` with a `log_id` is then a no-op, most other commands already
                applied are refused).
            StoreClosed: The store was closed.
        """
        return await self.execute_many(
            run_id, (command,), known_sequence=known_sequence, now=now, acting_as=acting_as
        )

    async def execute_many(
        self,
        run_id: str,
        commands: Sequence[Command],
        *,
        known_sequence: int | None = None,
        now: datetime | None = None,
        decided: BatchDecision | None = None,
        acting_as: Ownership | None = None,
    ) -> Outcome:
        """Decide `commands` as one (`decide_many`) and append all their events in one append.

        Each command is decided on the snapshot the ones before it left; the events of all go
        in one `append_if_sequence`, all or nothing. Conflicts retry the whole batch, as in
        `execute`, whose arguments and errors these are.

        `decided` is what `decide_many` gave for these same `commands` at `now` with this
        handler's limits, for a caller that decided them already (a host showing its workflow
        the result): when it was decided on the very snapshot the handler holds, the handler
        appends its events instead of deciding again, once the kernel has folded them onto
        that snapshot (`recheck_decision`): events that break a law of history there are
        refused with `InvalidCommand`, and nothing is written.

        `acting_as` is the worker of a fleet the commands are made for (`decide`'s argument):
        each is refused with `OwnershipLost` unless that worker owns the run, on every attempt,
        so a worker displaced while it waited for the store records nothing.

        Raises:
            Rejection: A command was refused (its `command_index` says which); nothing was
                written.
            InvalidCommand: `commands` is empty.
        """
        commands = tuple(commands)
        patience = Patience(self.store_retry, run_id)
        # The appends that failed with StoreUnavailable, perhaps written: this call's, and those
        # of an earlier call for the same commands that gave up in doubt.
        sent: list[Sent] = list(self._doubts.of(run_id, commands))
        seeded = bool(sent)
        try:
            outcome = await self._cycle(
                run_id, commands, patience, sent, known_sequence, now, decided, acting_as
            )
        except CommitUnknown:
            self._doubts.keep(run_id, commands, sent)
            raise
        if seeded:
            self._doubts.settled(run_id)
        return outcome

    async def _cycle(
        self,
        run_id: str,
        commands: tuple[Command, ...],
        patience: Patience,
        sent: list[Sent],
        known_sequence: int | None,
        now: datetime | None,
        decided: BatchDecision | None,
        acting_as: Ownership | None,
    ) -> Outcome:
        """`execute_many`'s cycle, each append that failed in doubt added to `sent`."""
        token_holder: HookHolder | None = None
        conflict: SequenceConflict | None = None
        attempts = token_conflicts = 0
        known = self._cache.fenced(run_id)  # the usual case, without a coroutine
        if known is not None:
            cached, fresh = known, False
        else:
            cached, fresh = await patience.call(lambda: self._cache.load(run_id, commands))
        while attempts < self._max_attempts:
            if sent and moved_past(cached, sent):
                found = await patience.call(lambda: recognise(self._cache, run_id, sent))
                if found is not None:
                    return _outcome(found)
            before = cached.snapshot
            at = now if now is not None else self.clock()
            reuse = (
                decided is not None
                and decided.decided_on is before
                and decided.now == at
                and token_holder is None
                and (decided.snapshot is None or decided.snapshot.run_id == run_id)
            )
            try:
                batch = (
                    recheck_decision(decided, before, run_id=run_id, limits=self.limits)
                    if reuse and decided is not None
                    else decide_many(
                        before,
                        commands,
                        now=at,
                        limits=self.limits,
                        token_holder=token_holder,
                        run_id=run_id,
                        acting_as=acting_as,
                    )
                )
            except Rejection:
                if fresh:
                    raise
                # Decided on the cache alone: the run may have moved on to where the commands
                # hold, so only a refusal of what the store has now counts.
                cached, fresh = await self._caught_up(patience, run_id, cached), True
                continue
            if not batch.events and not fresh:  # a no-op too must hold on the stored run
                cached, fresh = await self._caught_up(patience, run_id, cached), True
                continue
            missed = (
                await patience.call(partial(self._cache.missed, run_id, before, known_sequence))
                if known_sequence is not None
                and before is not None
                and before.last_sequence > known_sequence
                else ()
            )
            after = batch.snapshot
            if not batch.events:
                assert after is not None  # only an existing run can make a command a no-op
                # A lazy start found applied (its `start_id`) still tells its caller to run it.
                return Outcome(
                    snapshot=after,
                    appended=(),
                    missed=missed,
                    created_step=bool(batch.created_steps),
                )
            assert after is not None
            head = before.last_sequence if before is not None else 0
            try:
                appended = await self.store.append_if_sequence(
                    run_id,
                    head,
                    batch.events,
                    index=run_index(after),
                    recorded_at=at,
                    expected_position=cached.head_position,
                )
            except SequenceConflict as exc:
                attempts += 1
                conflict = exc
                token_holder = None
                cached, fresh = await self._caught_up(patience, run_id, cached), True
                if attempts > 1 and attempts < self._max_attempts and self._conflict_backoff:
                    # Many writers on one run: the losers of a round, retrying all at once,
                    # would each cost a read and a decision for the next round's one winner.
                    limit = min(self._conflict_backoff * 2**attempts, _MAX_CONFLICT_PAUSE)
                    await asyncio.sleep(random.random() * limit)
                continue
            except TokenConflict as exc:
                # Deciding again knowing the holder is not a lost race, so it costs no attempt;
                # a store that keeps refusing is still bounded.
                token_conflicts += 1
                if token_conflicts > self._max_attempts:
                    raise
                token_holder = HookHolder(
                    run_id=exc.holder_run_id, hook_id=exc.holder_hook_id, retained_until=None
                )
                continue
            except StoreUnavailable as exc:
                # Perhaps written (a store without settling, or one that could not settle it):
                # after a pause the run is read back, and this batch recognised if it is there.
                sent.append(Sent(head, batch, at, cached, missed))
                patience.doubt = (
                    exc
                    if isinstance(exc, CommitUnknown)
                    else CommitUnknown(run_id, head, f"the append failed: {exc}")
                )
                await patience.wait(exc)
                found = await patience.call(lambda: recognise(self._cache, run_id, sent))
                if found is not None:
                    return _outcome(found)
                if not isinstance(exc, CommitUnknown):
                    patience.doubt = None  # the store settled it, and it is not there
                cached, fresh = await self._caught_up(patience, run_id, cached), True
                continue
            first = cached.first_position if before is not None else appended[0].position
            self._cache.remember(run_id, Cached(after, first, appended[-1].position))
            return Outcome(
                snapshot=after,
                appended=tuple(appended),
                missed=missed,
                created_step=bool(batch.created_steps),
            )
        assert conflict is not None
        raise conflict

    async def _caught_up(self, patience: Patience, run_id: str, cached: Cached) -> Cached:
        """`RunCache.catch_up`, tried again after store faults."""
        return await patience.call(lambda: self._cache.catch_up(run_id, cached))

    async def deliver(self, token: str, payload: bytes, delivery_id: str | None = None) -> Outcome:
        """Deliver `payload` to the live hook holding `token` (a `ReceiveHook` on its run).

        A repeated `delivery_id` with the same payload is a no-op, so a lost-ack retry is safe.

        Raises:
            HookNotFound: No live hook holds the token (the message never quotes it).
            InvalidCommand: The token is not a `str` UTF-8 can encode (a lone surrogate): no
                hook can hold it, and the store is not asked.
            Rejection: What `execute` raises for the `ReceiveHook`, e.g. `EntityConflict`.
        """
        try:
            check_text(token, "token")  # a webhook caller chooses the token: before any I/O
        except InvalidArgument as refused:
            raise InvalidCommand(f"hook {refused.message}") from None
        holder = await Patience(self.store_retry, None).call(
            lambda: self.store.find_hook(token, now=self.clock())
        )
        if holder is None:
            raise HookNotFound("no live hook holds the given token")
        return await self.execute(
            holder.run_id,
            ReceiveHook(hook_id=holder.hook_id, payload=payload, delivery_id=delivery_id),
        )

    async def snapshot(self, run_id: str) -> Snapshot:
        """The run's current snapshot, caught up with the store (one read on a warm cache).

        Raises:
            RunNotFound: The run has no history.
        """
        found = await self.lookup(run_id)
        if found is None:
            raise RunNotFound(f"run {run_id!r} not found", run_id=run_id)
        return found

    async def lookup(self, run_id: str) -> Snapshot | None:
        """The run's current snapshot caught up with the store, or None if it has no history."""
        cached = self._cache.get(run_id)
        patience = Patience(self.store_retry, run_id)
        if cached is None:
            return (await patience.call(lambda: self._cache.read(run_id))).snapshot
        return (await self._caught_up(patience, run_id, cached)).snapshot

    async def history(self, run_id: str, *, limit: int | None = None) -> list[Envelope]:
        """The run's history, oldest first, at most `limit` events (empty for an unknown run)."""
        return await Patience(self.store_retry, run_id).call(
            lambda: self.store.read(run_id, limit=limit)
        )


def _outcome(found: Recognised) -> Outcome:
    """The outcome of an append in doubt that was found written: the one it had."""
    return Outcome(
        snapshot=found.snapshot,
        appended=found.appended,
        missed=found.missed,
        created_step=found.created_step,
    )
