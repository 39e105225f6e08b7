"""What a person calls a run's step: its name, with its id when the two differ.

A `runfold.flow` run records its n-th call under step id `n` and the function's name as the
step name, so `1`, `2`, `3` would tell a reader nothing: `charge #2` does. A runtime that names
its steps by their ids (`reserve-stock`) keeps the id alone. The command line and the inspector
both label steps this way; the label is stored text, which they make inert or escape.
"""

from __future__ import annotations

from collections.abc import Iterable

from runfold.kernel.events import Envelope, StepCreated

__all__ = ["step_label", "step_names"]


def step_label(step_id: str, step_name: str | None) -> str:
    """`name #id`, or the id alone when the name is the id (or unknown)."""
    if step_name is None or step_name == step_id:
        return step_id
    return f"{step_name} #{step_id}"


def step_names(history: Iterable[Envelope]) -> dict[str, str]:
    """Each step id of a history with its label (`step_label`), from its creation."""
    return {
        e.event.step_id: step_label(e.event.step_id, e.event.step_name)
        for e in history
        if isinstance(e.event, StepCreated)
    }
