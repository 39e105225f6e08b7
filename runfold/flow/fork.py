"""Fork a run from a step, and restart a failed or cancelled one: DBOS's `fork_workflow`.

`Flow.fork(run_id, from_step=n)` makes a new run of the same workflow and input that reuses
the recorded outcomes of the old run's calls before call `n` and runs call `n` onwards on the
code the `Flow` serves now. The reused outcomes are copied into the new run's first append,
with its creation (so a fork is written whole or not at all): a completed step as a step that
completed with the same output, a completed sleep as a completed wait, `set_attributes` and
`report_progress` as the same records, and the patch markers recorded before call `n`. Nothing
reused runs again. The new run is linked to the old one by its reserved attributes
`$forked_from` (the old run's id) and `$forked_at` (`n`).

What a fork can reuse is the rule: every call before call `n` must be a step that completed, a
sleep that completed or a record. A `wait_for_event`, a `recv` or a child run is an exchange
with the outside or another run that a new run cannot take over, and a step that failed or is
still running has no outcome to reuse: forking from past one is refused (`ForkRefused`, naming
the call), as is a call the old run never reached. In a run with a mailbox (`recv`,
`Flow.send`) a completed wait may be a `recv`'s timer: no wait of such a run is reused.

`Flow.restart(run_id)` is the fork an operator wants after a fix is deployed: from the first
call of a failed or cancelled run that did not complete (or, when all did, from the end, so the
workflow code runs again past its last call). It is refused for a live or completed run.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from runfold.flow.errors import ForkRefused, UnknownWorkflow
from runfold.flow.messages import MAILBOX_METADATA
from runfold.flow.patches import PATCH_WRITE_PREFIX
from runfold.kernel import (
    AttributesSet,
    Command,
    CompleteStep,
    CompleteWait,
    CreateRun,
    CreateWait,
    Envelope,
    LazyStep,
    RecordProgress,
    RunCreated,
    SetAttributes,
    Snapshot,
    StartRun,
    StartStep,
    StepWriter,
)

if TYPE_CHECKING:
    from runfold.handler import CommandHandler

__all__ = ["FORKED_AT", "FORKED_FROM", "fork_commands", "restart_at", "write_fork"]

FORKED_FROM = "$forked_from"
"""The reserved attribute of a fork: the id of the run it was forked from."""
FORKED_AT = "$forked_at"
"""The reserved attribute of a fork: the call it was forked from (its first call run anew)."""
_RESTARTABLE = frozenset({"failed", "cancelled"})


def _reusable(snapshot: Snapshot, call_id: str) -> list[Command] | None:
    """The commands that record call `call_id`'s outcome again, or None if it has none to reuse."""
    step = snapshot.steps.get(call_id)
    if step is not None:
        if step.status != "completed" or step.output is None:
            return None
        lazy = LazyStep(step_name=step.step_name, input=step.input, retry=step.retry)
        return [
            StartStep(step_id=call_id, lazy=lazy),
            CompleteStep(step_id=call_id, output=step.output),
        ]
    if call_id in snapshot.hooks or call_id in snapshot.hook_conflicts:
        return None  # a wait_for_event (a timeout's wait shares its id)
    wait = snapshot.waits.get(call_id)
    if wait is not None:
        if wait.status != "completed" or _has_mailbox(snapshot):
            return None
        return [
            CreateWait(wait_id=call_id, resume_at=wait.resume_at),
            CompleteWait(wait_id=call_id),
        ]
    progress = snapshot.progress.get(call_id)
    if progress is not None:
        return [
            RecordProgress(
                progress_id=call_id,
                completed=progress.completed,
                total=progress.total,
                message=progress.message,
            )
        ]
    if call_id in snapshot.attribute_write_ids:
        return []  # its writes are copied after the call before it (`_attribute_writes`)
    return None


def _has_mailbox(snapshot: Snapshot) -> bool:
    """Whether the run has a mailbox (`recv`, `Flow.send`): then a completed wait may be a
    `recv`'s timer, which a new run cannot reuse as a sleep."""
    return any((h.metadata or b"").startswith(MAILBOX_METADATA) for h in snapshot.hooks.values())


def _what(snapshot: Snapshot, call_id: str) -> str:
    step = snapshot.steps.get(call_id)
    if step is not None:
        return f"step {step.step_name!r} ({step.status})"
    if call_id in snapshot.hooks or call_id in snapshot.hook_conflicts:
        return "a wait_for_event"
    if call_id in snapshot.waits and _has_mailbox(snapshot):
        return "a sleep or a recv's timer (the run has a mailbox)"
    if call_id in snapshot.waits:
        return f"a sleep ({snapshot.waits[call_id].status})"
    if call_id in snapshot.children:
        return "a child run"
    return "nothing: the run never reached it"


def _attribute_writes(history: Sequence[Envelope], from_step: int) -> dict[int, list[Command]]:
    """The attribute writes to copy, by the call they follow: the run's creation's (0), those of
    `set_attributes` and of step bodies before `from_step`, and the patch markers recorded
    before the call preceding it (a later patch check is made anew)."""
    writes: dict[int, list[Command]] = {}
    for envelope in history:
        event = envelope.event
        if not isinstance(event, AttributesSet):
            continue
        write_id = event.write_id
        if isinstance(event.writer, StepWriter):
            after = int(event.writer.step_id) if event.writer.step_id.isdigit() else from_step
        elif write_id is not None and write_id.isdigit():
            after = int(write_id)
        elif write_id is not None and write_id.startswith(PATCH_WRITE_PREFIX):
            after = int(event.changes[0].value or "0")
            if after + 1 >= from_step:
                continue
        else:
            continue
        if after < from_step:
            writes.setdefault(after, []).append(
                SetAttributes(
                    changes=event.changes,
                    writer=event.writer,
                    write_id=write_id,
                    allow_reserved=event.allow_reserved,
                )
            )
    return writes


def fork_commands(
    old: Snapshot, history: Sequence[Envelope], from_step: int, *, version: str | None
) -> list[Command]:
    """The commands of a fork's first append: its creation and the reused outcomes.

    Raises:
        ForkRefused: A call before `from_step` has no outcome a new run can reuse.
        ValueError: `from_step` is below 1.
    """
    if from_step < 1:
        raise ValueError("a fork starts from call 1 or later")
    writes = _attribute_writes(history, from_step)
    first = history[0].event
    created = first.attributes if isinstance(first, RunCreated) else {}
    attributes = {k: v for k, v in created.items() if not k.startswith("$")}
    create = CreateRun(
        workflow_name=old.workflow_name,
        input=old.input,
        workflow_version=version,
        attributes={**attributes, FORKED_FROM: old.run_id, FORKED_AT: str(from_step)},
        allow_reserved=True,
    )
    commands: list[Command] = [StartRun(create=create), *writes.get(0, [])]
    for position in range(1, from_step):
        call_id = str(position)
        reused = _reusable(old, call_id)
        if reused is None:
            raise ForkRefused(
                f"run {old.run_id!r} cannot be forked from step {from_step}: call {position} is "
                f"{_what(old, call_id)}, which a new run cannot reuse (fork from step "
                f"{position} or earlier)"
            )
        commands.extend(reused)
        commands.extend(writes.get(position, []))
    return commands


def restart_at(old: Snapshot) -> int:
    """The call a restart of `old` forks from: its first that did not complete.

    Raises:
        ForkRefused: `old` did not fail and was not cancelled.
    """
    if old.status not in _RESTARTABLE:
        raise ForkRefused(
            f"run {old.run_id!r} is {old.status}: only a failed or cancelled run is restarted "
            "(fork any run from a step with `fork`)"
        )
    position = 1
    while _reusable(old, str(position)) is not None:
        position += 1
    return position


async def write_fork(
    handler: CommandHandler,
    workflows: Collection[str],
    version: str,
    run_id: str,
    from_step: int,
    new_run_id: str | None,
) -> str:
    """Write the fork of `run_id` from `from_step` as `new_run_id` (else a new id); its id.

    `workflows` are the names the caller serves (a fork of another workflow's run is refused
    before anything is written); `version` is the code version the new run records.
    """
    old = await handler.snapshot(run_id)
    if old.workflow_name not in workflows:
        raise UnknownWorkflow(
            f"run {run_id!r} is of workflow {old.workflow_name!r}, which this Flow does not serve"
        )
    history = await handler.history(run_id)
    commands = fork_commands(old, history, from_step, version=version)
    new_id = new_run_id if new_run_id is not None else f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
    await handler.execute_many(new_id, commands)
    return new_id
