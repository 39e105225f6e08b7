"""What a run's history holds at a call id, and whether it agrees with what the code asked.

The interpreter compares each call of the workflow code with the history's entry at the same
call id: `recorded` and `describe_recorded` say what is there (for a `FlowNonDeterminism`'s
message), `describe_call` what the code asked, and `agrees` whether a result a session
consumed is the one a snapshot holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from runfold.flow.calls import (
    AttributesCall,
    Call,
    ChildResultCall,
    ContinueCall,
    EventCall,
    PatchCall,
    ProgressCall,
    RecvCall,
    SleepCall,
    StartChildCall,
    StepCall,
)
from runfold.flow.continuation import CONTINUE_KIND
from runfold.flow.gathering import Gathered
from runfold.flow.session import Consumed, Expected
from runfold.kernel import Snapshot

__all__ = ["agrees", "describe_call", "describe_recorded", "is_recorded", "other_kinds"]


def agrees(snapshot: Snapshot, key: Consumed, expected: Expected) -> bool:
    """Whether `snapshot` holds the result a session consumed as `key`: `expected`."""
    kind, entity_id = key
    if kind == "step":
        step = snapshot.steps.get(entity_id)
        if step is None:
            return False
        payload = step.output if step.status == "completed" else step.error
        return (step.status, payload) == expected
    if kind == "hook":
        hook = snapshot.hooks.get(entity_id)
        return hook is not None and hook.status != "active" and not hook.deliveries
    if kind == "attributes":
        return entity_id in snapshot.attribute_write_ids
    if kind == "progress":
        return entity_id in snapshot.progress
    if kind == "child":
        return entity_id in snapshot.children
    wait = snapshot.waits.get(entity_id)
    return wait is not None and wait.status == "completed"


def is_recorded(snapshot: Snapshot, entity_id: str, *, steps: bool = True) -> bool:
    """Whether the history holds anything at call id `entity_id`.

    That is, whether `describe_recorded` is not None, without building the entries' states.
    `steps=False` leaves the steps out, for a caller that just looked there.
    """
    if steps and entity_id in snapshot.steps:
        return True
    # Asked for every new call: an empty kind (most runs hold no waits, hooks, ...) is passed
    # on its length alone, without a lookup.
    return any(entries and entity_id in entries for entries in other_kinds(snapshot))


def other_kinds(snapshot: Snapshot) -> tuple[Mapping[str, object], ...]:
    """The history's entries of every kind but steps, kind by kind."""
    return (
        snapshot.waits,
        snapshot.hooks,
        snapshot.hook_conflicts,
        snapshot.attribute_write_ids,
        snapshot.progress,
        snapshot.children,
    )


def describe_recorded(snapshot: Snapshot, entity_id: str) -> str | None:
    """What the history holds at call id `entity_id`, or None when nothing."""
    step = snapshot.steps.get(entity_id)
    if step is not None:
        return f"step {step.step_name!r}"
    hook = snapshot.hooks.get(entity_id)  # before the waits: a timeout's wait shares its id
    if hook is not None:
        return f"wait_for_event({(hook.metadata or b'').decode(errors='replace')!r})"
    if entity_id in snapshot.hook_conflicts:
        return "a wait_for_event"
    if entity_id in snapshot.waits:
        return "a sleep"
    if entity_id in snapshot.attribute_write_ids:
        return "set_attributes"
    if entity_id in snapshot.progress:
        return "report_progress"
    link = snapshot.children.get(entity_id)
    if link is not None and link.kind == CONTINUE_KIND:
        return f"continue_as_new as {link.operation_id!r}"
    if link is not None:
        return f"start_child of {link.operation_id!r}"
    return None


def describe_call(call: Call | Gathered | None) -> str:
    """What the code asked for, in a `FlowNonDeterminism`'s words."""
    match call:
        case Gathered():
            return f"{call.label} of {len(call.children)} steps"
        case StepCall():
            return f"step {call.name!r}"
        case SleepCall():
            return "a sleep"
        case EventCall():
            return f"wait_for_event({call.hook_id!r})"
        case AttributesCall():
            return "set_attributes"
        case ProgressCall():
            return "report_progress"
        case StartChildCall():
            return f"start_child of {call.workflow.name!r}"
        case ChildResultCall():
            return f"the result of child {call.handle.run_id!r}"
        case RecvCall():
            return f"recv({call.topic!r})"
        case ContinueCall():
            return "continue_as_new"
        case PatchCall():
            return f"patched({call.patch_id!r})"
    return "the end of the workflow"
