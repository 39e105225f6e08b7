"""How an engine resumes a run that something woke: what is due settled first, then one drive.

A sweep (`Engine.resume_due`, `Engine.recover`) resumes many runs in turn, so one run's failure
is reported in its `Resumption` and never stops the others; a store that cannot be reached
stops the sweep. What is due (a wait's time, a deadline) may have been settled by someone else
meanwhile: such a refusal is no error here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from runfold.engine.journal import Execute
from runfold.engine.suspensions import Resumption
from runfold.kernel import (
    Command,
    CompleteWait,
    EntityConflict,
    OwnershipLost,
    RunExpired,
    RunOwned,
    Snapshot,
    StoreClosed,
    StoreUnavailable,
    TerminalState,
    TimeOutRun,
    Wakeup,
)

__all__ = ["due_by_run", "resume_run", "settle"]

_log = logging.getLogger("runfold.engine")


def due_by_run(wakeups: Iterable[Wakeup], *, fleet: bool) -> dict[str, tuple[Wakeup, ...]]:
    """The due `wakeups` an engine resumes, by run.

    Input for a fleet's run (`ready`) is a worker's to take (see `Engine.deliver`): only an
    engine of the `fleet` resumes it.
    """
    by_run: dict[str, list[Wakeup]] = {}
    for wakeup in wakeups:
        if wakeup.kind != "ready" or fleet:
            by_run.setdefault(wakeup.run_id, []).append(wakeup)
    return {run_id: tuple(due) for run_id, due in by_run.items()}


async def settle(execute: Execute, run_id: str, command: Command) -> None:
    """Execute a command that someone else may have made moot.

    A wait completed or a run ended meanwhile: such a refusal is not an error here.
    """
    try:
        await execute(run_id, (command,))
    except (EntityConflict, TerminalState, RunExpired) as exc:
        _log.debug("%s on run %r was already settled: %s", type(command).__name__, run_id, exc)


async def resume_run(
    run_id: str,
    due: tuple[Wakeup, ...],
    settle: Callable[[str, Command], Awaitable[None]],
    drive: Callable[[str], Awaitable[Snapshot]],
) -> Resumption | None:
    """Settle the run's `due` waits and deadline, then `drive` it once; what it came to.

    None when another worker owns the run. A drive that fails is reported (and logged), not
    raised, so one run never stops a sweep; a store that cannot be reached does.
    """
    try:
        for wakeup in due:
            if wakeup.kind == "wait":
                await settle(run_id, CompleteWait(wait_id=wakeup.subject_id))
            elif wakeup.kind == "deadline":
                await settle(run_id, TimeOutRun(deadline=wakeup.due_at, reason="deadline passed"))
        snapshot = await drive(run_id)
    except (StoreUnavailable, StoreClosed):
        raise
    except (RunOwned, OwnershipLost) as exc:
        _log.debug("run %r is another worker's: %s", run_id, exc)
        return None
    except Exception as exc:
        _log.warning("resuming run %r failed: %r", run_id, exc)
        return Resumption(run_id=run_id, wakeups=due, snapshot=None, error=exc)
    return Resumption(run_id=run_id, wakeups=due, snapshot=snapshot, error=None)
