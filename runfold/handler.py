"""`CommandHandler`: load → decide → append, retried on conflict, over any `EventStore`.

The handler is where the pure kernel meets a store. Every rule lives in `decide`; the store only
makes "check the head, then append" atomic; the handler retries the whole cycle on a
`SequenceConflict` (someone else appended first) and re-decides on a `TokenConflict` (another run
holds the hook token), so every rule holds on every store, concurrency included. A store that
cannot be reached for now (`StoreUnavailable`) is tried again under a `StoreRetry` policy, and
an append whose outcome was lost is recognised by its events when the run is read back, so a
retried command that was applied returns its outcome instead of a refusal.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial

import attrs

from runfold.kernel import (
    BatchDecision,
    Command,
    CommitUnknown,
    CreateRun,
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
    StartRun,
    StoreUnavailable,
    TokenConflict,
    apply,
    decide_many,
    recheck_decision,
    run_index,
)
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.store_retry import DEFAULT_STORE_RETRY, Patience, StoreRetry
from runfold.stores.arguments import check_text
from runfold.stores.protocol import EventStore, replay_run

__all__ = ["CommandHandler", "Outcome", "new_run_id", "utc_now"]


_MAX_CONFLICT_PAUSE = 0.05
"""Seconds: the longest pause `conflict_backoff` makes before one attempt."""


def utc_now() -> datetime:
    """The default clock: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


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


@attrs.frozen
class _Cached:
    """A run as this handler last knew it.

    `snapshot` None: the run had no history. `first_position` and `head_position` are the feed
    positions of its first and last events (None when the store gives none): the first names
    this incarnation of the run (retention may delete it and the id be used again), the last
    fences appends decided on the snapshot (`expected_position`).
    """

    snapshot: Snapshot | None
    first_position: int | None = None
    head_position: int | None = None

    @property
    def fenced(self) -> bool:
        """Whether an append decided on this snapshot can go without reading first: the store
        checks both its head and its incarnation (a run it lacks must still not exist)."""
        return self.snapshot is None or self.head_position is not None


_ABSENT = _Cached(None)


@attrs.frozen
class _Sent:
    """An append that failed with `StoreUnavailable`: perhaps written, until read back."""

    head: int
    batch: BatchDecision
    at: datetime
    cached: _Cached
    missed: tuple[Envelope, ...]


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
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_size = cache_size
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
                back: it may have been written. Executing the same command again is safe (it
                is recognised, or decided anew on the run as it is).
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
        token_holder: HookHolder | None = None
        conflict: SequenceConflict | None = None
        attempts = token_conflicts = 0
        patience = Patience(self.store_retry, run_id)
        sent: list[_Sent] = []  # appends that failed with StoreUnavailable: perhaps written
        cached, fresh = await patience.call(lambda: self._load(run_id, commands))
        while attempts < self._max_attempts:
            if sent and _moved_past(cached, sent):
                found = await patience.call(lambda: self._recognise(run_id, sent))
                if found is not None:
                    return found
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
                await patience.call(partial(self._missed, run_id, before, known_sequence))
                if known_sequence is not None
                and before is not None
                and before.last_sequence > known_sequence
                else ()
            )
            after = batch.snapshot
            if not batch.events:
                assert after is not None  # only an existing run can make a command a no-op
                return Outcome(snapshot=after, appended=(), missed=missed)
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
                sent.append(_Sent(head, batch, at, cached, missed))
                patience.doubt = (
                    exc
                    if isinstance(exc, CommitUnknown)
                    else CommitUnknown(run_id, head, f"the append failed: {exc}")
                )
                await patience.wait(exc)
                found = await patience.call(lambda: self._recognise(run_id, sent))
                if found is not None:
                    return found
                if not isinstance(exc, CommitUnknown):
                    patience.doubt = None  # the store settled it, and it is not there
                cached, fresh = await self._caught_up(patience, run_id, cached), True
                continue
            first = cached.first_position if before is not None else appended[0].position
            self._remember(run_id, _Cached(after, first, appended[-1].position))
            return Outcome(
                snapshot=after,
                appended=tuple(appended),
                missed=missed,
                created_step=bool(batch.created_steps),
            )
        assert conflict is not None
        raise conflict

    async def _caught_up(self, patience: Patience, run_id: str, cached: _Cached) -> _Cached:
        """`_catch_up`, tried again after store faults."""
        return await patience.call(lambda: self._catch_up(run_id, cached))

    async def _recognise(self, run_id: str, sent: Sequence[_Sent]) -> Outcome | None:
        """The outcome of whichever of the appends in `sent` the store holds, or None.

        An append is recognised by what it wrote: its events, stamped with its time, right
        after the head it was fenced on. The fence lets at most one of them in.
        """
        for attempt in sent:
            events = attempt.batch.events
            tail = await self.store.read(run_id, after=attempt.head, limit=len(events))
            if len(tail) != len(events) or any(
                envelope.event != event or envelope.recorded_at != attempt.at
                for envelope, event in zip(tail, events, strict=True)
            ):
                continue
            after = attempt.batch.snapshot
            assert after is not None
            first = attempt.cached.first_position if attempt.head else tail[0].position
            self._remember(run_id, _Cached(after, first, tail[-1].position))
            return Outcome(
                snapshot=after,
                appended=tuple(tail),
                missed=attempt.missed,
                created_step=bool(attempt.batch.created_steps),
            )
        return None

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
            return (await patience.call(lambda: self._read(run_id))).snapshot
        return (await self._caught_up(patience, run_id, cached)).snapshot

    async def history(self, run_id: str, *, limit: int | None = None) -> list[Envelope]:
        """The run's history, oldest first, at most `limit` events (empty for an unknown run)."""
        return await Patience(self.store_retry, run_id).call(
            lambda: self.store.read(run_id, limit=limit)
        )

    # --- cache --------------------------------------------------------------------------------

    async def _load(self, run_id: str, commands: Sequence[Command]) -> tuple[_Cached, bool]:
        """The run as cached when the next append is fenced by it, else as the store has it;
        and whether it was read from the store just now.

        A run not cached that `commands` begin by creating is taken to be new without a read:
        the append at sequence 0 holds only if it is, and if it is not, the conflict makes the
        handler read it and decide again, as for any run that moved.
        """
        cached = self._cache.get(run_id)
        if cached is None:
            if _creates_run(commands[0]) if commands else False:
                return _ABSENT, False
            return await self._read(run_id), True
        if not cached.fenced:
            return await self._catch_up(run_id, cached), True
        self._cache.move_to_end(run_id)
        return cached, False

    async def _read(self, run_id: str) -> _Cached:
        """The run read whole from the store and folded (`replay_run`), and remembered."""
        replayed = await replay_run(self.store, run_id, limits=self.limits)
        if replayed is None:
            self._remember(run_id, _ABSENT)
            return _ABSENT
        found = _Cached(replayed.snapshot, replayed.first_position, replayed.last_position)
        self._remember(run_id, found)
        return found

    async def _catch_up(self, run_id: str, cached: _Cached) -> _Cached:
        """`cached` with what was appended since, or the run read afresh when `cached` is not
        this incarnation of it any more (retention deleted the run, perhaps it was created
        again): the last event it knows must still be there, the same one."""
        known = cached.snapshot
        if known is None:
            return await self._read(run_id)
        tail = await self.store.read(run_id, after=known.last_sequence - 1)
        last = tail[0] if tail else None
        same = last is not None and last.sequence == known.last_sequence
        if same and cached.head_position is not None:
            same = last.position == cached.head_position  # type: ignore[union-attr]
        elif same:  # a store without positions: the best evidence left is the time
            same = last.recorded_at == known.updated_at  # type: ignore[union-attr]
        if not same:
            self._cache.pop(run_id, None)
            return await self._read(run_id)
        if len(tail) == 1:
            self._cache.move_to_end(run_id)
            return cached
        caught_up = _Cached(
            apply(known, tail[1:], limits=self.limits), cached.first_position, tail[-1].position
        )
        self._remember(run_id, caught_up)
        return caught_up

    def _remember(self, run_id: str, found: _Cached) -> None:
        if self._cache_size == 0:
            return
        cached = self._cache.get(run_id)
        if (
            cached is not None
            and cached.snapshot is not None
            and found.snapshot is not None
            and cached.first_position == found.first_position
            and cached.snapshot.last_sequence > found.snapshot.last_sequence
        ):
            return  # a slower task must not replace a fresher snapshot of the same run
        self._cache[run_id] = found
        self._cache.move_to_end(run_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _missed(
        self, run_id: str, before: Snapshot | None, known_sequence: int | None
    ) -> tuple[Envelope, ...]:
        if known_sequence is None or before is None or before.last_sequence <= known_sequence:
            return ()
        return tuple(
            await self.store.read(
                run_id, after=known_sequence, limit=before.last_sequence - known_sequence
            )
        )


def _moved_past(cached: _Cached, sent: Sequence[_Sent]) -> bool:
    """Whether the run as cached has moved past the head of an append in `sent`."""
    found = cached.snapshot
    return found is not None and any(found.last_sequence > s.head for s in sent)


def _creates_run(command: Command) -> bool:
    """Whether `command` creates its run (so the run is usually new)."""
    return isinstance(command, CreateRun) or (
        isinstance(command, StartRun) and command.create is not None
    )


# --- run ids ------------------------------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_id_lock = threading.Lock()
_last_id = [0, 0]  # [milliseconds, random part] of the last id made in this process


def new_run_id(prefix: str = "run_") -> str:
    """A new run id: `prefix` + a 26-character ULID (48-bit milliseconds, 80 random bits).

    Ids sort by creation time; within one millisecond of one process they still increase
    (the random part is incremented), and across processes 80 random bits make a collision
    negligible.
    """
    with _id_lock:
        millis = time.time_ns() // 1_000_000
        if millis <= _last_id[0]:
            millis = _last_id[0]
            randomness = (_last_id[1] + 1) % (1 << 80)
        else:
            randomness = int.from_bytes(os.urandom(10), "big")
        _last_id[0], _last_id[1] = millis, randomness
    value = (millis << 80) | randomness
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return prefix + "".join(reversed(chars))
