"""`@workflow`: an async function made a durable workflow under a stable name.

The name is what a run records and what finds the code again after a restart, so it must not
change between deploys or between being run as a script and being imported. It is `name=` when
given, else the function's qualified name without its module (`order`, `Shop.order`): a module
is `__main__` when run as a script and `shop.orders` when imported, so it cannot be part of a
stable name. Renaming the function changes the default; pass `name=` to keep it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, overload

import attrs
from croniter import croniter

from runfold.flow.errors import DuplicateWorkflow

__all__ = ["Workflow", "registered_workflows", "workflow"]

WorkflowFunction = Callable[[Any], Coroutine[Any, Any, Any]]

# Every workflow defined in this process, by name: what `Flow()` serves when given none.
_REGISTRY: dict[str, Workflow] = {}


@attrs.frozen(kw_only=True)
class Workflow:
    """A workflow function and its stable name; call it as `Flow.start(workflow, input)`."""

    name: str
    fn: WorkflowFunction = attrs.field(eq=False)
    schedule: str | None = None
    """A cron expression: a fleet's workers start a run at each tick (its input the tick's
    time, ISO 8601 in UTC), once across the fleet."""

    @property
    def origin(self) -> str:
        """Where the function was defined: `module.qualname`."""
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


def _register(found: Workflow) -> Workflow:
    known = _REGISTRY.get(found.name)
    # The same definition again (a module reloaded, an example executed twice) replaces it.
    if known is not None and known.origin != found.origin:
        raise DuplicateWorkflow(
            f"workflow name {found.name!r} is taken by {known.origin}; {found.origin} needs "
            "another name="
        )
    _REGISTRY[found.name] = found
    return found


@overload
def workflow(fn: WorkflowFunction, /) -> Workflow: ...


@overload
def workflow(
    *, name: str | None = None, schedule: str | None = None
) -> Callable[[WorkflowFunction], Workflow]: ...


def workflow(
    fn: WorkflowFunction | None = None,
    /,
    *,
    name: str | None = None,
    schedule: str | None = None,
) -> Workflow | Callable[[WorkflowFunction], Workflow]:
    """Make `async def fn(input)` a durable workflow named `name` (default: its qualified name).

    Used bare (`@workflow`) or with a name (`@workflow(name="order")`). The function takes the
    run's input (decoded) and returns its output (encoded by the `Flow`'s codec); it may await
    only `step`, `sleep` and `wait_for_event`, and must be deterministic around them.

    `schedule` (a cron expression, UTC: `"0 3 * * *"`) makes the workers that serve it
    (`Flow.serve`) start a run at each tick, once across the fleet, with the tick's time (ISO
    8601 text) as its input.

    Raises:
        DuplicateWorkflow: Another function is registered under the same name.
        ValueError: `name` is empty, or `schedule` is not a cron expression.
    """

    def wrap(function: WorkflowFunction) -> Workflow:
        chosen = name if name is not None else function.__qualname__
        if not chosen:
            raise ValueError("a workflow name must not be empty")
        if schedule is not None and not croniter.is_valid(schedule):
            raise ValueError(f"schedule {schedule!r} is not a cron expression")
        return _register(Workflow(name=chosen, fn=function, schedule=schedule))

    return wrap if fn is None else wrap(fn)


def registered_workflows() -> tuple[Workflow, ...]:
    """Every workflow defined in this process so far, by name."""
    return tuple(_REGISTRY[n] for n in sorted(_REGISTRY))
