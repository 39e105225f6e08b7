"""What code raised, as an outcome to record: its error text, and whose exception it is.

Workflow code and step bodies fail by raising. Any `Exception` they raise is theirs to bear: it
fails the step's attempt or the run. `SystemExit`, `KeyboardInterrupt`, `GeneratorExit`,
`asyncio.CancelledError` (and a `BaseExceptionGroup`) are not `Exception`s, so they would pass
every `except Exception` on their way out of `recover()` and stop the runs behind it; raised by
the code itself, they are its failure too, recorded as a `BaseExceptionRaised`.

Two kinds of `BaseException` are not the code's. The cancellation of the task that drives the
run, from outside (a host shutting down, `asyncio.timeout` around a drive): the task's
`cancelling()` count tells it from a `CancelledError` the code raised itself. And any other
`BaseException` subclass, which exists precisely to pass every handler (a test harness's
simulated process death, say). Both propagate, and nothing is recorded for them: the next drive
takes the run from its last append.
"""

from __future__ import annotations

import asyncio

from runfold.engine.errors import BaseExceptionRaised

__all__ = [
    "CODE_BASE_EXCEPTIONS",
    "MAX_ERROR_CHARS",
    "as_failure",
    "error_payload",
    "error_text",
    "is_code_failure",
    "is_host_cancellation",
]

CODE_BASE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    SystemExit,
    KeyboardInterrupt,
    GeneratorExit,
    asyncio.CancelledError,
    BaseExceptionGroup,
)
"""The `BaseException`s other than `Exception` that code raising them fails with."""

MAX_ERROR_CHARS = 4096
"""The longest error text recorded for a failed step or run, in characters."""


def error_text(exc: BaseException) -> str:
    """`"ClassName: message"` for `exc` (the class name alone without a message), bounded.

    Whatever its `__str__` does: one that raises gives a note in place of the message.
    """
    try:
        message = str(exc)
    except BaseException as failure:  # a broken __str__ must not lose the error itself
        message = f"<its message could not be read: {type(failure).__name__}>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def error_payload(exc: BaseException) -> bytes:
    """`error_text(exc)` in UTF-8; a lone surrogate is written as its escape (`\\udc80`)."""
    return error_text(exc).encode("utf-8", "backslashreplace")


def is_code_failure(exc: BaseException) -> bool:
    """Whether `exc`, raised out of code the engine ran, is the code's failure to record.

    That is an `Exception`, or one of `CODE_BASE_EXCEPTIONS` unless it is the host's
    cancellation (`is_host_cancellation`).
    """
    if isinstance(exc, Exception):
        return True
    return isinstance(exc, CODE_BASE_EXCEPTIONS) and not is_host_cancellation(exc)


def is_host_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is the cancellation of the running task, asked from outside it.

    A `CancelledError` the code raised of itself leaves the task's `cancelling()` count at 0.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def as_failure(exc: BaseException, *, run_id: str, where: str) -> Exception:
    """`exc` as the failure to record for code `where` describes (`"step 'pay' (id '2')"`).

    An `Exception` is itself; any other `BaseException` becomes a `BaseExceptionRaised` naming
    it. (Check `is_code_failure` first.)
    """
    if isinstance(exc, Exception):
        return exc
    try:
        shown = repr(exc)
    except BaseException:
        shown = type(exc).__name__
    failure = BaseExceptionRaised(
        f"{where} of run {run_id!r} raised {shown[: MAX_ERROR_CHARS // 2]}, which is taken as its "
        "failure (code fails by raising an Exception)",
        run_id=run_id,
        raised=type(exc).__name__,
    )
    failure.__cause__ = exc
    return failure
