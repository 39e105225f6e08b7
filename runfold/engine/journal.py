"""`Journal`: what one drive decided on a run and has not appended yet, and when it appends it.

The commands a workflow's decisions make are decided at once, by the kernel, on a provisional
snapshot (the durable run and what is pending), and appended together at the last moment that
keeps the durability contract: before a step body runs, when the run waits, and when it ends.
Every append is fenced by the claim the drive acts on (`acting_as`), and refused here first when
the worker's lease no longer holds by this process's clock.

`StepsInFlight` is the engine's record of the step bodies its drives are running, so that two
drives of one engine never run one step at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Literal, Protocol, TypeAlias

from runfold.engine.errors import InvalidDecision, RunDefinitionConflict
from runfold.engine.lease import Lease
from runfold.engine.raised import error_payload, unrecordable
from runfold.handler import CommandHandler, Outcome
from runfold.kernel import (
    BatchDecision,
    Command,
    CompleteStep,
    EntityConflict,
    Envelope,
    FailRun,
    FailStep,
    HistoryLimitExceeded,
    InvalidCommand,
    NonDeterministic,
    Ownership,
    OwnershipLost,
    Rejection,
    RetryStep,
    Snapshot,
    StartRun,
    decide,
    decide_after,
    decide_many,
)

__all__ = ["Execute", "Flushed", "Journal", "Notify", "StepsInFlight"]

_log = logging.getLogger("runfold.engine")
_OUTCOMES = (CompleteStep, RetryStep, FailStep)

Flushed: TypeAlias = Literal["shown", "moved", "refused"]
"""How `Journal.flush` went (see there)."""


class Execute(Protocol):
    """Appends commands to a run (the handler's `execute_many`)."""

    def __call__(
        self,
        run_id: str,
        commands: Sequence[Command],
        *,
        known_sequence: int | None = None,
        now: datetime | None = None,
        decided: BatchDecision | None = None,
        acting_as: Ownership | None = None,
    ) -> Awaitable[Outcome]: ...


Notify: TypeAlias = Callable[[Sequence[Envelope]], Awaitable[None]]
"""Shows the engine's observers what an append wrote (`ObserverFanOut.notify`)."""


class StepsInFlight:
    """The steps whose bodies the drives of one engine are running.

    Or whose outcomes they hold unappended: another drive of the engine leaves them be.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: set[tuple[str, str]] = set()

    def running(self, run_id: str, step_id: str) -> bool:
        """Whether a drive of this engine is running the step's body (or holds its outcome)."""
        return (run_id, step_id) in self._held

    def hold(self, run_id: str, step_ids: Iterable[str]) -> None:
        """Mark steps as run by a drive of this engine."""
        held = self._held
        for step_id in step_ids:
            held.add((run_id, step_id))

    def let_go(self, run_id: str, step_ids: Iterable[str]) -> None:
        """Undo `hold`: the steps' outcomes are durable, or the drive ended."""
        held = self._held
        for step_id in step_ids:
            held.discard((run_id, step_id))


class Journal:
    """The durable snapshot of one run, the commands pending on it, and the provisional view.

    The view is the two together: what the workflow is shown. `flush` appends what is pending.
    """

    __slots__ = (
        "acting_as",
        "clock",
        "decision",
        "durable",
        "execute",
        "handler",
        "held",
        "in_flight",
        "lease",
        "limits",
        "notify",
        "pending",
        "run_id",
        "view",
    )

    def __init__(
        self,
        run_id: str,
        durable: Snapshot | None,
        *,
        handler: CommandHandler,
        execute: Execute,
        notify: Notify | None,
        in_flight: StepsInFlight,
        lease: Lease | None,
    ) -> None:
        self.run_id = run_id
        self.durable = durable
        self.view = durable
        self.handler = handler
        self.clock: Callable[[], datetime] = handler.clock
        self.limits = handler.limits
        self.execute = execute
        self.notify = notify  # None: the engine has no observer
        self.in_flight = in_flight
        self.lease = lease
        self.pending: list[Command] = []
        # The kernel's one decision of what is pending: its events, its snapshot (the view) and
        # its time (the append's); None while nothing is.
        self.decision: BatchDecision | None = None
        self.held: set[str] = set()  # step ids this drive runs or holds an outcome of
        self.acting_as: Ownership | None = None  # the claim of the worker the drive acts for

    @property
    def snapshot(self) -> Snapshot:
        """The provisional snapshot (the durable one once nothing is pending)."""
        assert self.view is not None
        return self.view

    # --- steps held by this drive ---------------------------------------------------------------

    def hold(self, step_ids: Sequence[str]) -> None:
        """Mark steps as this drive's to run (before their first await)."""
        self.in_flight.hold(self.run_id, step_ids)
        self.held.update(step_ids)

    def hold_one(self, step_id: str) -> None:
        """`hold` of one step, as a sequential workflow holds each (no sequence to walk)."""
        self.in_flight._held.add((self.run_id, step_id))
        self.held.add(step_id)

    def let_go(self, step_ids: Iterable[str]) -> None:
        """Undo `hold` for `step_ids`."""
        chosen = tuple(step_ids)  # `held` itself, as a drive ends
        self.in_flight.let_go(self.run_id, chosen)
        self.held.difference_update(chosen)

    def elsewhere(self, step_id: str) -> bool:
        """Whether another drive of this engine runs the step.

        A hold of this drive's own only holds an outcome not yet appended.
        """
        return step_id not in self.held and self.in_flight.running(self.run_id, step_id)

    # --- pending commands -----------------------------------------------------------------------

    def propose(self, command: Command) -> bool:
        """Decide `command` on the provisional snapshot and add it to what is pending.

        Returns False when it changes nothing.

        Raises:
            Rejection: The kernel refused it on the provisional snapshot.
        """
        before = self.decision
        if before is None:
            batch = decide_many(
                self.view,
                (command,),
                now=self.clock(),
                limits=self.limits,
                run_id=self.run_id,
                acting_as=self.acting_as,
            )
            if not batch.events:
                return False
        else:
            # One decision of everything pending, extended (not a second one joined to it).
            batch = decide_after(
                before, command, limits=self.limits, run_id=self.run_id, acting_as=self.acting_as
            )
            if batch is before:
                return False
        self.decision = batch
        self.pending.append(command)
        self.view = batch.snapshot
        return True

    def discard(self) -> None:
        """Drop what is pending: the view becomes the durable run again."""
        self.pending.clear()
        self.decision = None
        self.view = self.durable

    async def record(self, command: Command, what: str) -> bool:
        """Propose `command` for the decision `what`; True when the run moved.

        A refusal (or a command that changes nothing) on a view that others have moved past
        means "look again"; on the freshest view it is the workflow's to bear and is raised:
        asking again would give the same answer forever.
        """
        try:
            if self.propose(command):
                return True
        except Rejection as exc:
            if await self.moved_on():
                return True
            if isinstance(exc, InvalidCommand):  # the decision itself is malformed
                raise unrecordable(what, exc, self.run_id) from exc
            raise
        if await self.moved_on():
            return True
        raise InvalidDecision(
            f"{what} changed nothing on run {self.run_id!r}: the workflow would be asked the "
            "same question again",
            run_id=self.run_id,
        )

    def fail_run(self, exc: InvalidDecision | HistoryLimitExceeded) -> bool:
        """Propose the run's failure with `exc`, a decision that can never be recorded.

        Raises `exc` itself if even the failure cannot be (the run ended meanwhile, say).
        """
        failure = FailRun(error=error_payload(exc), error_code=type(exc).__name__)
        try:
            return self.propose(failure)
        except Rejection:
            raise exc from None

    def same_definition(self, command: Command, now: datetime) -> None:
        """Raise the kernel's `NonDeterministic` if `command` redefines an existing entity."""
        try:
            decide(self.view, command, now=now, limits=self.limits)
        except NonDeterministic:
            raise
        except EntityConflict:
            pass  # the same definition: the entity the workflow issued before

    # --- appending ------------------------------------------------------------------------------

    def check_lease(self) -> None:
        """Refuse to write for a worker whose lease no longer holds by this process's clock.

        Raises:
            OwnershipLost: The lease lapsed (the process was paused or cut off too long).
        """
        lease = self.lease
        if self.acting_as is not None and lease is not None and not lease.holds():
            raise OwnershipLost(
                f"worker {lease.worker_id!r} let its lease lapse: it records nothing more on run "
                f"{self.run_id!r}",
                run_id=self.run_id,
            )

    async def flush(self) -> Flushed:
        """Append what is pending in one batch.

        Returns "shown" when the run is now what the view said; "moved" when the batch went in
        but others had appended first or the store decided otherwise (a hook token held
        elsewhere); "refused" when the stored run refused a command (others moved it): what
        came before that command went in, the rest did not. Either way but "shown", the
        workflow must look again.
        """
        decided = self.decision  # what the handler would decide again on the same snapshot
        if decided is None:
            return "shown"
        commands = tuple(self.pending)
        acting_as = self.acting_as
        if acting_as is not None:
            lease = self.lease
            if lease is not None and not lease.holds():
                await lease.settled()  # a renewal the store is late to take may make it hold
            self.check_lease()
        durable = self.durable
        try:
            outcome = await self.execute(
                self.run_id,
                commands,
                known_sequence=durable.last_sequence if durable is not None else None,
                now=decided.now,
                decided=decided,
                acting_as=acting_as,
            )
        except OwnershipLost:
            raise
        except Rejection as exc:
            await self._refused(commands, exc)
            return "refused"
        if self.notify is not None:
            await self.notify(outcome.appended)
        self._settle(commands, outcome.snapshot)
        appended, proposed = outcome.appended, decided.events
        if outcome.missed or len(appended) != len(proposed):
            return "moved"
        # The handler appends the proposed events themselves when it decided nothing anew, so
        # identity settles the common case before any field is compared.
        for envelope, event in zip(appended, proposed, strict=True):
            if envelope.event is not event and envelope.event != event:
                return "moved"
        return "shown"

    def _settle(self, commands: Sequence[Command], durable: Snapshot) -> None:
        """The pending `commands` are durable: `durable` is the run now."""
        self.durable = self.view = durable
        self.pending.clear()
        self.decision = None
        held = self.held
        if held:
            in_flight = self.in_flight._held
            run_id = self.run_id
            for command in commands:
                if isinstance(command, _OUTCOMES) and command.step_id in held:
                    step_id = command.step_id
                    held.discard(step_id)  # `let_go` of the one step, without its tuples
                    in_flight.discard((run_id, step_id))

    async def _refused(self, commands: Sequence[Command], exc: Rejection) -> None:
        """Handle the stored run's refusal of command `exc.command_index` of a pending batch.

        The view took it, so others moved the run (the kernel decides alike on both). What came
        before that command is recorded; the rest is dropped, and the view becomes the stored
        run, for the workflow to decide again on it.
        """
        place = exc.command_index
        refused = commands[place]
        at = self.decision.now if self.decision is not None else None
        if isinstance(refused, StartRun) and isinstance(exc, NonDeterministic):
            self.discard()  # the run is another's: nothing of this batch can be recorded
            raise RunDefinitionConflict(
                f"run {self.run_id!r} already exists with another definition", run_id=self.run_id
            ) from exc
        _log.debug("run %r moved on under %s: %s", self.run_id, type(refused).__name__, exc)
        while place > 0:  # the run may keep moving: each try keeps what still stands
            try:
                outcome = await self.execute(
                    self.run_id, commands[:place], now=at, acting_as=self.acting_as
                )
            except Rejection as again:
                place = again.command_index
                continue
            if self.notify is not None:
                await self.notify(outcome.appended)
            self._settle(commands[:place], outcome.snapshot)
            return
        self.durable = await self.handler.snapshot(self.run_id)
        self.discard()

    async def moved_on(self) -> bool:
        """Record what is pending, then tell whether others moved the stored run.

        True (and the view is then the stored run) if others appended since the workflow was
        shown the view.
        """
        if self.pending and await self.flush() != "shown":
            return True
        before = self.durable.last_sequence if self.durable is not None else 0
        fresh = await self.handler.lookup(self.run_id)
        if fresh is None or fresh.last_sequence <= before:
            return False
        self.durable = self.view = fresh
        return True
