"""`set_attributes` and `report_progress` in the interpreter: records the run keeps, once each.

The call at id n records its attributes under write id n (`attributes_set`), or its progress
report under progress id n (`progress_recorded`), then the workflow goes on; a replay finds the
record under the same id and goes past it without recording anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runfold.engine import ReportProgress, RuntimeDecision, UpdateAttributes
from runfold.flow.calls import AttributesCall, ProgressCall
from runfold.kernel import Snapshot

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting
    from runfold.flow.session import Session

__all__ = ["on_record"]


def on_record(
    interpreter: Interpreting,
    session: Session,
    snapshot: Snapshot,
    durable: Snapshot | None,
    call: AttributesCall | ProgressCall,
    call_id: str,
) -> RuntimeDecision | None:
    """Record the attributes or the progress report under the call's id, then go on."""
    if isinstance(call, AttributesCall):
        kind, done, asked = "attributes", call_id in snapshot.attribute_write_ids, "set_attributes"
    else:
        kind, done, asked = "progress", call_id in snapshot.progress, "report_progress"
    if not done:
        interpreter.other_kind(session, snapshot, call_id)
        if isinstance(call, AttributesCall):
            return UpdateAttributes(changes=call.changes, write_id=call_id)
        return ReportProgress(
            progress_id=call_id,
            completed=call.completed,
            total=call.total,
            message=call.message,
        )
    recorded = interpreter.recorded_at(snapshot, call_id)
    if recorded != asked:
        interpreter.mismatch(session, snapshot, recorded or "nothing")
    interpreter.consumed(session, durable, (kind, call_id), ("recorded", None))
    session.resume(None)
    return None
