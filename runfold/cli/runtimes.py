"""The workflow runtime a `--runtime MODULE:FACTORY` option names: imported, made, checked.

`runfold resume` and the inspector's resume action drive runs with the operator's own runtime;
this is how they get it, and `RuntimeLoadError` says why they could not.
"""

from __future__ import annotations

import inspect
import os
import pkgutil
import sys
from collections.abc import Callable
from typing import Any, cast

from runfold.engine import WorkflowRuntime
from runfold.stores.protocol import EventStore

__all__ = ["RuntimeLoadError", "load_runtime", "make_runtime", "resolve_factory"]


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
