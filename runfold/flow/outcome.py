"""`FlowRun`: a run as a `Flow` reports it, its output decoded with the Flow's codec."""

from __future__ import annotations

from typing import Any

import attrs

from runfold.flow.continuation import continued_as
from runfold.flow.encoding import PayloadCodec
from runfold.kernel import Snapshot

__all__ = ["FlowRun", "flow_run"]


@attrs.frozen(kw_only=True)
class FlowRun:
    """A run as a `Flow` reports it: status, and the output decoded once it completed."""

    run_id: str
    status: str
    output: Any
    """The decoded output of a completed run, else None."""
    error: str | None
    """The error of a failed run, else None."""
    snapshot: Snapshot = attrs.field(repr=False)
    continued_as: str | None = None
    """The successor of a run that ended with `continue_as_new` (its `output` is None)."""


def flow_run(snapshot: Snapshot, codec: PayloadCodec) -> FlowRun:
    """`snapshot` as a `FlowRun`: the output of a completed run decoded with `codec`.

    A run that continued as new has no output of its own: its `continued_as` names the
    successor instead.
    """
    output = successor = None
    if snapshot.status == "completed" and snapshot.output is not None:
        successor = continued_as(snapshot)
        if successor is None:
            output = codec.decode(snapshot.output)
    error = None if snapshot.error is None else snapshot.error.decode(errors="replace")
    return FlowRun(
        run_id=snapshot.run_id,
        status=snapshot.status,
        output=output,
        error=error,
        snapshot=snapshot,
        continued_as=successor,
    )
