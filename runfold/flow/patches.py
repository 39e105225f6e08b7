"""`patched` and `deprecated_patch`: change workflow code under runs already in flight.

Temporal's `workflow.patched()` and DBOS's `DBOS.patch()`. A deploy that inserts, removes or
reorders calls would make runs recorded on the old code diverge (`FlowNonDeterminism`). Behind
`if await patched("id"):` the new code runs only in runs that reach that point on it:

- a run whose history already holds the patch's marker took the new branch: True;
- a run whose history holds a call past this point, without the marker, went past it on the
  old code: False, and it goes on with the old branch (nothing is recorded);
- a run that reaches this point at the end of its history (a new run, or one that was stopped
  before it) records the marker, then gets True.

So every replay of a run answers the same. The marker is the run's reserved attribute
`$patch:<id>` (value: how many calls the run had made when it was recorded), written once
under the write id `patch:<id>`: `runfold show` lists the patches a run took. A patch check
takes no call id, so the calls around it keep theirs in old and new runs alike.

Once no run that took the old branch is live, `await deprecated_patch("id")` replaces the
`if` (the old branch deleted): it records the marker as `patched` does, so a worker still on
the patched code replays the new runs right, and returns None whatever the history holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runfold.engine import RuntimeDecision, UpdateAttributes
from runfold.flow.calls import PatchCall, Pending
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = [
    "PATCH_KEY_PREFIX",
    "PATCH_WRITE_PREFIX",
    "deprecated_patch",
    "on_patch",
    "patched",
    "patches_of",
]

PATCH_KEY_PREFIX = "$patch:"
"""The reserved attribute key of a patch marker is this prefix and the patch id."""
PATCH_WRITE_PREFIX = "patch:"
"""The write id of a patch marker is this prefix and the patch id."""
# A marker's key must fit the kernel's attribute key limit (256 characters) with its prefix.
_MAX_PATCH_ID_LENGTH = 200


def _checked(patch_id: str) -> str:
    if not isinstance(patch_id, str) or not patch_id:
        raise ValueError("a patch id must be a non-empty string")
    if len(patch_id) > _MAX_PATCH_ID_LENGTH:
        raise ValueError(f"a patch id is at most {_MAX_PATCH_ID_LENGTH} characters long")
    if not patch_id.isprintable():
        raise ValueError("a patch id must be printable text")
    return patch_id


def patched(patch_id: str) -> Any:
    """Whether this run takes the code behind patch `patch_id` (awaited: `await patched(...)`).

    True in a run that reaches this point on code that has the patch (the marker is recorded
    first), False in a run recorded past this point on code without it; every replay of a run
    answers the same.

    Raises:
        ValueError: `patch_id` is empty, longer than 200 characters or not printable.
    """
    return Pending(PatchCall(patch_id=_checked(patch_id)))


def deprecated_patch(patch_id: str) -> Any:
    """Mark where patch `patch_id`'s branch was (awaited); it resumes with None.

    For the deploy that removes the old branch once no run that took it is live: new runs still
    record the marker, so a worker running the patched code replays them on the new branch.

    Raises:
        ValueError: `patch_id` is empty, longer than 200 characters or not printable.
    """
    return Pending(PatchCall(patch_id=_checked(patch_id), deprecated=True))


def patches_of(snapshot: Snapshot) -> tuple[str, ...]:
    """The ids of the patches whose markers the run recorded, sorted."""
    size = len(PATCH_KEY_PREFIX)
    return tuple(
        sorted(key[size:] for key in snapshot.attributes if key.startswith(PATCH_KEY_PREFIX))
    )


def on_patch(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: PatchCall,
) -> RuntimeDecision | None:
    """Answer the patch check from the history, or record its marker first."""
    write_id = PATCH_WRITE_PREFIX + call.patch_id
    if write_id in snapshot.attribute_write_ids:
        interpreter.consumed(session, durable, ("attributes", write_id), ("recorded", None))
        session.resume(None if call.deprecated else True)
        return None
    if interpreter.recorded_at(snapshot, str(session.position + 1)) is not None:
        session.resume(None if call.deprecated else False)  # past this point on old code
        return None
    return UpdateAttributes(
        changes={PATCH_KEY_PREFIX + call.patch_id: str(session.position)},
        write_id=write_id,
        reserved=True,
    )
