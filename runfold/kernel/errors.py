"""The error taxonomy: every error runfold raises on purpose is a `RunfoldError`.

Each class has a stable `code` (a snake_case string, part of the public API) and an HTTP-like
`status`. Messages name what was wrong; they never contain a hook token (tokens are bearer secrets).

- `Rejection`: `decide` refused a command. Subclasses say why.
- `HistoryError`: a history breaks a law of `project_run` (corruption is loud, never guessed over).
- `EventDecodeError`: bytes that do not decode into an event.
- Store errors: `SequenceConflict`, `TokenConflict`, `CorruptEvent`, `CorruptIndex`,
  `StoreUnavailable` (and its `StoreTimeout`, `CommitUnknown`), `StoreClosed`.
- `InvalidArgument`: a store method called with an argument the store contract refuses.
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "AttemptsExhausted",
    "CommitUnknown",
    "CorruptEvent",
    "CorruptIndex",
    "EntityConflict",
    "EntityNotFound",
    "EventDecodeError",
    "HistoryError",
    "HistoryLimitExceeded",
    "HookNotFound",
    "InvalidArgument",
    "InvalidAttributes",
    "InvalidCommand",
    "NonDeterministic",
    "OwnershipLost",
    "Rejection",
    "RunExpired",
    "RunNotFound",
    "RunNotSupported",
    "RunOwned",
    "RunfoldError",
    "SequenceConflict",
    "StepNotFound",
    "StoreClosed",
    "StoreError",
    "StoreOpenError",
    "StoreTimeout",
    "StoreUnavailable",
    "TerminalState",
    "TokenConflict",
    "TooEarly",
    "WaitNotFound",
]


class RunfoldError(Exception):
    """Base of every error runfold raises on purpose."""

    code: str = "runfold_error"
    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# --- rejections: decide refused a command -------------------------------------------------------


class Rejection(RunfoldError):
    """A command refused by `decide`; nothing was written.

    Subclasses say why; `run_id` names the run when it is known. `command_index` is the refused
    command's place in its batch (`decide_many`, `CommandHandler.execute_many`; 0 for a single
    command).
    """

    code = "rejected"
    status = 400

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.command_index = 0


class RunNotFound(Rejection):
    """The command needs a run that has no history."""

    code = "run_not_found"
    status = 404


class EntityNotFound(Rejection):
    """The command names a step, wait or hook the run does not have (or no longer exposes)."""

    code = "entity_not_found"
    status = 404


class StepNotFound(EntityNotFound):
    """The command names a step the run does not have."""

    code = "step_not_found"


class WaitNotFound(EntityNotFound):
    """The command names a wait the run does not have."""

    code = "wait_not_found"


class HookNotFound(EntityNotFound):
    """The command names a hook the run does not have or no longer exposes (disposed, ended)."""

    code = "hook_not_found"


class EntityConflict(Rejection):
    """Duplicate creation, a lost lazy-start race, a reused write or delivery id."""

    code = "entity_conflict"
    status = 409


class NonDeterministic(EntityConflict):
    """The same id was issued again with a different definition."""

    code = "non_deterministic"


class TerminalState(Rejection):
    """The run, step or wait is in a state that no longer accepts this command."""

    code = "terminal_state"
    status = 409


class RunExpired(Rejection):
    """The run has ended; the command would have acted on it while it was live."""

    code = "run_expired"
    status = 410


class TooEarly(Rejection):
    """A step's retry is not due yet; try again at `retry_after`."""

    code = "too_early"
    status = 425

    def __init__(self, message: str, *, run_id: str | None = None, retry_after: datetime) -> None:
        super().__init__(message, run_id=run_id)
        self.retry_after = retry_after


class AttemptsExhausted(Rejection):
    """A step was asked for another attempt, but its retry policy has none left.

    Either the attempt before was interrupted (its process died) in the policy's last attempt,
    or a new policy (`StartStep.retry`) allows no more attempts than the step has made. The host
    fails the step instead.
    """

    code = "attempts_exhausted"
    status = 409


class RunOwned(Rejection):
    """A worker claimed a run that another worker owns (and the claim did not displace it).

    `owner_id` is the run's owner. A claim displaces an owner only when it names it, which a
    worker does once it found that owner's lease lapsed.
    """

    code = "run_owned"
    status = 409

    def __init__(self, message: str, *, run_id: str | None = None, owner_id: str) -> None:
        super().__init__(message, run_id=run_id)
        self.owner_id = owner_id


class OwnershipLost(Rejection):
    """A command made on a worker's behalf, but that worker no longer owns the run.

    Another claim took the run (the worker's lease lapsed: it was paused, cut off or too slow to
    renew), or the worker released it. Nothing was written: a displaced worker records nothing,
    and should drop the run.
    """

    code = "ownership_lost"
    status = 409


class InvalidCommand(Rejection):
    """The command itself is malformed: ids, sizes, limits, times."""

    code = "invalid_command"
    status = 400


class InvalidAttributes(InvalidCommand):
    """Attribute keys or values break a rule (length, reserved prefix, count)."""

    code = "invalid_attributes"


class RunNotSupported(Rejection):
    """The run was stamped by a newer kernel spec than this one understands."""

    code = "run_not_supported"
    status = 409


class HistoryLimitExceeded(Rejection):
    """The decision would take the run past `Limits.max_events_per_run`."""

    code = "history_limit_exceeded"
    status = 413


# --- history and wire-format errors -------------------------------------------------------------


class HistoryError(RunfoldError):
    """A history breaks a law of `project_run`; names the run, the sequence and the reason."""

    code = "invalid_history"
    status = 500

    def __init__(self, run_id: str | None, sequence: int, reason: str) -> None:
        super().__init__(f"invalid history for run {run_id!r} at sequence {sequence}: {reason}")
        self.run_id = run_id
        self.sequence = sequence
        self.reason = reason


class EventDecodeError(RunfoldError):
    """Bytes that do not decode into an event of the named type and schema version."""

    code = "event_decode_error"
    status = 500

    def __init__(self, event_type: str, schema_version: int, reason: str) -> None:
        super().__init__(f"cannot decode {event_type!r} (schema {schema_version}): {reason}")
        self.event_type = event_type
        self.schema_version = schema_version
        self.reason = reason


# --- store errors -------------------------------------------------------------------------------


class StoreError(RunfoldError):
    """Base of the errors a store raises."""

    code = "store_error"
    status = 500


class SequenceConflict(StoreError):
    """The run's head was not `expected`; nothing was written. `actual` is the true head."""

    code = "sequence_conflict"
    status = 409

    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"run {run_id!r}: expected head at sequence {expected}, but it is at {actual}"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class TokenConflict(StoreError):
    """A hook token is already held by another live or retained hook; nothing was written.

    The token itself is kept on the instance for the handler but never put in the message.
    """

    code = "token_conflict"
    status = 409

    def __init__(self, token: str, holder_run_id: str, holder_hook_id: str) -> None:
        super().__init__(
            f"hook token is already held by hook {holder_hook_id!r} of run {holder_run_id!r}"
        )
        self.token = token
        self.holder_run_id = holder_run_id
        self.holder_hook_id = holder_hook_id


class CorruptEvent(StoreError):
    """A stored row does not decode; raised for that run only."""

    code = "corrupt_event"
    status = 500

    def __init__(self, run_id: str, sequence: int, reason: str) -> None:
        super().__init__(f"run {run_id!r}: stored event {sequence} is corrupt: {reason}")
        self.run_id = run_id
        self.sequence = sequence
        self.reason = reason


class CorruptIndex(StoreError):
    """A run's stored index rows do not decode; raised for that run, never skipped over.

    The run's events are intact: `runfold verify --rebuild-index` rewrites its rows from them.
    """

    code = "corrupt_index"
    status = 500

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"run {run_id!r}: stored index rows are corrupt: {reason}")
        self.run_id = run_id
        self.reason = reason


class StoreUnavailable(StoreError):
    """The store could not be reached for now (connection lost, database locked): transient.

    Raised by an append, it means nothing was written: the store settled the append's fate
    before raising, so retrying is safe. Its subclass `CommitUnknown` is the one exception: the
    store could not settle it.
    """

    code = "store_unavailable"
    status = 503


class StoreTimeout(StoreUnavailable, TimeoutError):
    """A store call did not finish within its deadline (a hung server, a silent network).

    Transient, as any `StoreUnavailable`: for an append, nothing was written (a timed-out append
    that did commit returns its envelopes; one whose fate is unknown is `CommitUnknown`). It is a
    `TimeoutError` too, so code written for `asyncio.timeout` still catches it.
    """

    code = "store_timeout"
    status = 504


class CommitUnknown(StoreUnavailable):
    """An append whose outcome the store could not settle: it may or may not have been written.

    The connection was lost after the append was sent, and the store could not read the run
    back to see (the database still unreachable) within its deadline. `run_id` names the run,
    `expected` the head the append was fenced on.

    A `StoreUnavailable` on purpose: the condition is transient, code that retries on
    `StoreUnavailable` rides through it, and retrying the same append at the same head is safe
    (if the first copy was written, the fence refuses the second with `SequenceConflict`). What
    is not safe is to take it for "nothing was written" and act on that: read the run first.
    `CommandHandler` does so itself.
    """

    code = "commit_unknown"
    status = 503

    def __init__(self, run_id: str, expected: int, reason: str) -> None:
        super().__init__(
            f"run {run_id!r}: whether the append at sequence {expected + 1} was written is "
            f"unknown: {reason}"
        )
        self.run_id = run_id
        self.expected = expected
        self.reason = reason


class StoreOpenError(StoreError):
    """A store cannot be opened: not a runfold database, or written by a newer runfold.

    Also raised for a store that is not writable. Not transient: retrying will not help.
    """

    code = "store_open_error"
    status = 500


class StoreClosed(StoreError):
    """The store was closed; open a new one."""

    code = "store_closed"
    status = 503


# --- arguments ----------------------------------------------------------------------------------


class InvalidArgument(RunfoldError, ValueError):
    """A store method was called with an argument the store contract refuses.

    `argument` names it and `reason` says what is wrong; the message never quotes a hook token.
    Every store refuses the same arguments (`runfold.stores.arguments`), before any I/O, so
    nothing was read or written. It is a `ValueError` too.
    """

    code = "invalid_argument"
    status = 400

    def __init__(self, argument: str, reason: str) -> None:
        super().__init__(f"{argument} {reason}")
        self.argument = argument
        self.reason = reason
