"""What the commands that change runs do: `cancel`, `resume` and `delete`, on the public API of
the engine and the stores, so that a host program can do the same in a few lines."""

from __future__ import annotations

import inspect
import os
import pkgutil
import sys
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any, cast

from runfold.engine import Engine, EngineObserver, Resumption, WorkflowRuntime
from runfold.handler import CommandHandler
from runfold.kernel import CancelRun, RunStatus, Snapshot
from runfold.stores.protocol import EventStore

__all__ = [
    "RuntimeLoadError",
    "cancel",
    "delete_ended",
    "load_runtime",
    "make_runtime",
    "resolve_factory",
    "resume",
]

_DELETE_BATCH = 500
"""Runs deleted per `delete_runs` call: each is one transaction, kept short."""


_LIVE: tuple[RunStatus, ...] = ("pending", "running", "cancelling")
_RESUME_ROUNDS = 100
"""`resume_due` calls at most per `resume --due`: each handles up to 100 due wakeups."""


class RuntimeLoadError(ValueError):
    """`--runtime MODULE:FACTORY` could not be imported or did not give a `WorkflowRuntime`."""


def load_runtime(target: str, store: EventStore | None = None) -> WorkflowRuntime:
    """The runtime `MODULE:FACTORY` makes (see `make_runtime`).

    Raises:
        RuntimeLoadError: The name does not resolve, or what it makes is not a runtime.
    """
    return make_runtime(target, resolve_factory(target), store)


def resolve_factory(target: str) -> Callable[..., Any]:
    """The callable `MODULE:FACTORY` names.

    MODULE is imported with the current folder on the path, as `python -m` has it.

    Raises:
        RuntimeLoadError: The name does not resolve to a callable.
    """
    if ":" not in target:
        raise RuntimeLoadError(f"expected MODULE:FACTORY, not {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise RuntimeLoadError(f"cannot import {target!r}: {exc}") from None
    if not callable(factory):
        raise RuntimeLoadError(f"{target!r} is not callable")
    return cast(Callable[..., Any], factory)


def _wants_store(factory: Callable[..., Any]) -> bool:
    """Whether `factory` takes the store: a parameter named `store`, or a first positional
    parameter without a default."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called bare
        return False
    if any(p.name == "store" for p in parameters):
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(parameters) and (
        parameters[0].kind in positional and parameters[0].default is inspect.Parameter.empty
    )


def make_runtime(
    target: str, factory: Callable[..., Any], store: EventStore | None = None
) -> WorkflowRuntime:
    """The runtime `factory` makes, handed `store` when it takes one.

    It takes one through a parameter named `store`, or one positional parameter
    (`lambda store: Flow(store)`); otherwise it is called with nothing.
    A factory handed the store makes a runtime whose own writes (a `Flow` starting a child, a
    step delivering to another run) go to the same store as the command's.

    Raises:
        RuntimeLoadError: Calling it fails, what it makes is not a runtime, or it needs a store
            none was given.
    """
    wants_store = _wants_store(factory)
    if wants_store and store is None:
        raise RuntimeLoadError(f"{target!r} takes a store and none was given")
    try:
        runtime = factory(store) if wants_store else factory()
    except Exception as exc:  # the user's code, whatever it raises: named, never a traceback
        given = "the store" if wants_store else "no arguments"
        raise RuntimeLoadError(
            f"{target!r} failed when called with {given}: {type(exc).__name__}: {exc}"
        ) from None
    methods = (getattr(runtime, name, None) for name in ("run_workflow", "run_step"))
    if (
        inspect.isawaitable(runtime)
        or not all(callable(method) for method in methods)
        or not getattr(runtime, "workflow_names", None)
    ):
        raise RuntimeLoadError(
            f"{target!r} made a {type(runtime).__name__}, not a WorkflowRuntime "
            "(run_workflow, run_step and workflow_names)"
        )
    return cast(WorkflowRuntime, runtime)


async def cancel(store: EventStore, run_id: str, reason: str | None) -> Snapshot:
    """End a live run as cancelled now (`CancelRun`): no runtime is needed, nothing runs.

    Raises:
        RunNotFound: The run has no history.
        TerminalState: The run already ended otherwise.
    """
    outcome = await CommandHandler(store).execute(run_id, CancelRun(reason=reason))
    return outcome.snapshot


async def resume(
    store: EventStore, runtime: WorkflowRuntime, run_id: str | None
) -> tuple[Resumption, ...]:
    """Drive `run_id` to its next suspension, or (None) every interrupted or due run.

    A run interrupted mid-step gets a new attempt of that step (`Engine.drive`); with no
    `run_id`, `Engine.recover` drives every live run of the runtime's workflows once, then
    `Engine.resume_due` the ones whose timers are due.
    """
    # A runtime that observes (a Flow confirms its live coroutines) sees what is appended.
    observes = callable(getattr(runtime, "on_event", None))
    observers = (cast(EngineObserver, runtime),) if observes else ()
    engine = Engine(CommandHandler(store), runtime, observers=observers)
    if run_id is None:
        before = await _live_heads(store, engine.workflow_names)
        resumed: list[Resumption] = [
            one
            for one in await engine.recover()
            if one.snapshot is None or one.snapshot.last_sequence != before.get(one.run_id)
        ]  # a run that only waits, as it did, is not news
        for _ in range(_RESUME_ROUNDS):
            batch = await engine.resume_due()
            resumed.extend(batch)
            if not batch or all(one.error is not None for one in batch):
                break  # nothing left, or the same failing runs would come back
        return tuple(resumed)
    snapshot = await engine.drive(run_id)
    return (Resumption(run_id=run_id, wakeups=(), snapshot=snapshot, error=None),)


async def _live_heads(store: EventStore, workflow_names: Collection[str]) -> dict[str, int]:
    """The last sequence of every live run of `workflow_names`, as the run index lists it."""
    heads: dict[str, int] = {}
    for workflow_name in workflow_names:
        for status in _LIVE:
            cursor: str | None = None
            while True:
                page = await store.list_runs(
                    workflow_name=workflow_name, status=status, cursor=cursor, limit=500
                )
                heads.update((s.run_id, s.last_sequence) for s in page.items)
                if not page.has_more or page.cursor is None:
                    break
                cursor = page.cursor
    return heads


async def delete_run(store: EventStore, run_id: str) -> bool:
    """Delete `run_id` if it ended (by now) and retains no hook token; whether it was deleted."""
    now = datetime.now(UTC)
    return await store.delete_runs(terminal_before=now, limit=1, run_ids=(run_id,)) == 1


async def delete_ended(store: EventStore, before: datetime, limit: int | None) -> int:
    """Delete up to `limit` (None: all) runs that ended before `before`; how many went."""
    deleted = 0
    while limit is None or deleted < limit:
        batch = _DELETE_BATCH if limit is None else min(_DELETE_BATCH, limit - deleted)
        gone = await store.delete_runs(terminal_before=before, limit=batch)
        deleted += gone
        if gone < batch:
            break
    return deleted
