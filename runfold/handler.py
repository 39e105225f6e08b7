"""`CommandHandler`: load → decide → append, retried on conflict, over any `EventStore`.

The handler is where the pure kernel meets a store. Every rule lives in `decide`; the store only
makes "check the head, then append" atomic; the handler retries the whole cycle on a
`SequenceConflict` (someone else appended first) and re-decides on a `TokenConflict` (another run
holds the hook token), so every rule holds on every store, concurrency included.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

import attrs

from runfold.kernel import (
    Command,
    Envelope,
    HookHolder,
    HookNotFound,
    Limits,
    ReceiveHook,
    RunNotFound,
    SequenceConflict,
    Snapshot,
    StartStep,
    StepCreated,
    TokenConflict,
    apply,
    decide,
    project_run,
    run_index,
)
from runfold.stores.protocol import EventStore

__all__ = ["CommandHandler", "Outcome", "new_run_id", "utc_now"]


_MAX_CONFLICT_PAUSE = 0.05
"""Seconds: the longest pause `conflict_backoff` makes before one attempt."""


def utc_now() -> datetime:
    """The default clock: the current time, timezone-aware UTC."""
    return datetime.now(UTC)


@attrs.frozen(kw_only=True)
class Outcome:
    """What `CommandHandler.execute` did.

    `snapshot` is the run after the command; `appended` the envelopes it wrote (empty for a
    no-op); `missed` the envelopes other writers appended after the caller's `known_sequence`
    and before this decision; `created_step` is True when a lazy `StartStep` created the step,
    i.e. this caller won the race and should run the step body.
    """

    snapshot: Snapshot
    appended: tuple[Envelope, ...]
    missed: tuple[Envelope, ...]
    created_step: bool = False


class CommandHandler:
    """Executes commands against runs kept in `store`: load, decide, append, retry on conflict.

    Snapshots are cached (LRU) and caught up with `store.read(after=…)` before every decision,
    so a command costs O(new events), not O(history). Every rule is `decide`'s, so it holds on
    every store, concurrency included.

    Args:
        store: Where the runs are kept.
        clock: Supplies `now` for each decision and every appended event's `recorded_at`.
        limits: The bounds `decide` and `project_run` check; `Limits()` when None.
        cache_size: How many runs' snapshots to keep cached (0: none).
        max_attempts: How many sequence conflicts one `execute` absorbs before giving up.
        conflict_backoff: Seconds. After its second sequence conflict in a row, an `execute`
            pauses before each further attempt, for a random time below `conflict_backoff ×
            2**conflicts` (at most 50 ms), so that writers racing for one run take turns
            instead of all retrying at once; 0 retries at once.

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
    ) -> None:
        if cache_size < 0 or max_attempts < 1 or not conflict_backoff >= 0:
            raise ValueError("cache_size must be >= 0, max_attempts >= 1, conflict_backoff >= 0")
        self.store = store
        self.clock = clock
        self.limits = limits if limits is not None else Limits()
        self._cache: OrderedDict[str, Snapshot] = OrderedDict()
        self._cache_size = cache_size
        self._max_attempts = max_attempts
        self._conflict_backoff = conflict_backoff

    # --- the cycle ----------------------------------------------------------------------------

    async def execute(
        self, run_id: str, command: Command, *, known_sequence: int | None = None
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

        Returns:
            The run after the command, what was appended (nothing for a no-op) and what was missed.

        Raises:
            Rejection: `decide` refused the command; nothing was written.
            SequenceConflict: The run kept moving under the command for `max_attempts` tries.
            TokenConflict: The store kept refusing a hook token for as many re-decisions.
            CorruptEvent: A stored event of the run does not decode.
            HistoryError: The stored history breaks a law of `project_run`.
            StoreUnavailable: The store could not be reached (safe to retry).
            StoreClosed: The store was closed.
        """
        token_holder: HookHolder | None = None
        conflict: SequenceConflict | None = None
        attempts = token_conflicts = 0
        while attempts < self._max_attempts:
            before = await self._load(run_id)
            now = self.clock()
            decision = decide(
                before,
                command,
                now=now,
                limits=self.limits,
                token_holder=token_holder,
                run_id=run_id,
            )
            missed = await self._missed(run_id, before, known_sequence)
            if not decision.events:
                assert before is not None  # only an existing run can make a command a no-op
                return Outcome(snapshot=before, appended=(), missed=missed)
            head = before.last_sequence if before is not None else 0
            envelopes = [
                Envelope(run_id=run_id, sequence=head + offset, event=event, recorded_at=now)
                for offset, event in enumerate(decision.events, start=1)
            ]
            after = (
                apply(before, envelopes, limits=self.limits)
                if before is not None
                else project_run(envelopes, limits=self.limits)
            )
            try:
                appended = await self.store.append_if_sequence(
                    run_id, head, decision.events, index=run_index(after), recorded_at=now
                )
            except SequenceConflict as exc:
                attempts += 1
                conflict = exc
                token_holder = None
                if exc.actual < head:  # the run shrank (retention): forget what we knew
                    self._cache.pop(run_id, None)
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
            self._remember(after)
            created_step = isinstance(command, StartStep) and isinstance(
                decision.events[0], StepCreated
            )
            return Outcome(
                snapshot=after, appended=tuple(appended), missed=missed, created_step=created_step
            )
        assert conflict is not None
        raise conflict

    async def deliver(self, token: str, payload: bytes, delivery_id: str | None = None) -> Outcome:
        """Deliver `payload` to the live hook holding `token` (a `ReceiveHook` on its run).

        A repeated `delivery_id` with the same payload is a no-op, so a lost-ack retry is safe.

        Raises:
            HookNotFound: No live hook holds the token (the message never quotes it).
            Rejection: What `execute` raises for the `ReceiveHook`, e.g. `EntityConflict`.
        """
        holder = await self.store.find_hook(token, now=self.clock())
        if holder is None:
            raise HookNotFound("no live hook holds the given token")
        return await self.execute(
            holder.run_id,
            ReceiveHook(hook_id=holder.hook_id, payload=payload, delivery_id=delivery_id),
        )

    async def snapshot(self, run_id: str) -> Snapshot:
        """The run's current snapshot.

        Raises:
            RunNotFound: The run has no history.
        """
        found = await self._load(run_id)
        if found is None:
            raise RunNotFound(f"run {run_id!r} not found", run_id=run_id)
        return found

    async def history(self, run_id: str) -> list[Envelope]:
        """The run's whole history, oldest first (empty for an unknown run)."""
        return await self.store.read(run_id)

    # --- cache --------------------------------------------------------------------------------

    async def _load(self, run_id: str) -> Snapshot | None:
        cached = self._cache.get(run_id)
        if cached is not None:
            # Re-read the last event the cached snapshot knows as well: if it is gone or is
            # another event, retention deleted the run (perhaps it was created again since), and
            # the snapshot must not be used or caught up.
            tail = await self.store.read(run_id, after=cached.last_sequence - 1)
            if (
                tail
                and tail[0].sequence == cached.last_sequence
                and tail[0].recorded_at == cached.updated_at
            ):
                if len(tail) == 1:
                    self._cache.move_to_end(run_id)
                    return cached
                snapshot = apply(cached, tail[1:], limits=self.limits)
                self._remember(snapshot)
                return snapshot
            self._cache.pop(run_id, None)
        history = await self.store.read(run_id)
        if not history:
            return None
        snapshot = project_run(history, limits=self.limits)
        self._remember(snapshot)
        return snapshot

    def _remember(self, snapshot: Snapshot) -> None:
        if self._cache_size == 0:
            return
        cached = self._cache.get(snapshot.run_id)
        if cached is not None and cached.last_sequence > snapshot.last_sequence:
            return  # a slower task must not replace a fresher snapshot
        self._cache[snapshot.run_id] = snapshot
        self._cache.move_to_end(snapshot.run_id)
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
