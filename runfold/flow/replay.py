"""Replay recorded runs against workflow code: does the code still agree with their histories?

Temporal's `Replayer`. `ReplayChecker(workflows).check(snapshot)` starts the run's workflow
function again and feeds it every recorded result, as a `Flow` does after a restart, without
running a step body or writing anything; it reports the first call where the code asks for
something other than what the history holds (`Divergence`), or a pass. A run that ended
completed or failed must also end so on the code now: code asking for another call after the
recorded end diverges there. A cancelled or timed-out run ended from outside, and a live run
has not ended: for them, agreeing with the history recorded so far is a pass. A live run of a
workflow the code does not define diverges as a whole (call 0): no code would carry it on; an
ended one passes.

`runfold replay-check` runs it over a store's runs, `runfold.testing.replay` over histories
exported to a file (`runfold export`), so CI checks a deploy against production's histories.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import attrs

from runfold.engine import (
    AwaitHook,
    Cancel,
    CloseHook,
    Complete,
    Fail,
    LinkChildOperation,
    ReportProgress,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    TimeOut,
    UpdateAttributes,
    WaitUntil,
)
from runfold.flow.definition import Workflow
from runfold.flow.encoding import JsonCodec, PayloadCodec
from runfold.flow.errors import FlowError, FlowNonDeterminism
from runfold.flow.interpreter import Interpreter
from runfold.kernel import Snapshot

__all__ = ["Divergence", "ReplayChecker", "ReplayResult"]

_END = "the end of the workflow"
# How a recorded run ended, as a divergence names it; runs ended otherwise are not compared.
_RECORDED_ENDS = {"completed": "its completion", "failed": "its failure"}


@attrs.frozen(kw_only=True)
class Divergence:
    """Where a run's history and the workflow code part: the first call that differs."""

    call: int
    """The call's position (1 for the workflow's first call; 0: the run as a whole)."""
    recorded: str
    """What the history holds there."""
    asked: str
    """What the code asks for now."""

    def __str__(self) -> str:
        return (
            f"at call {self.call}: the history recorded {self.recorded}, "
            f"the code asks for {self.asked}"
        )


@attrs.frozen(kw_only=True)
class ReplayResult:
    """One run replayed: a pass, or its first `divergence`."""

    run_id: str
    workflow_name: str
    status: str
    """The run's recorded status."""
    workflow_version: str | None
    """The code version the run started on (`Flow(version=...)`), if recorded."""
    divergence: Divergence | None

    @property
    def passed(self) -> bool:
        """Whether the code agrees with the run's history."""
        return self.divergence is None


class ReplayChecker:
    """Replays runs of `workflows` (as one `Flow` serving them would) to check their histories.

    `codec` decodes inputs and recorded results (default `JsonCodec`, the `Flow`'s default).
    """

    def __init__(self, workflows: Iterable[Workflow], *, codec: PayloadCodec | None = None) -> None:
        self.workflows = {w.name: w for w in workflows}
        self._now = datetime.min
        self.interpreter = Interpreter(
            self.workflows, codec if codec is not None else JsonCodec(), self._clock, max_sessions=1
        )

    def _clock(self) -> datetime:
        return self._now  # a new sleep's due time: never recorded here

    def check(self, snapshot: Snapshot) -> ReplayResult:
        """Replay the run `snapshot` folds (`project_run` of its history) against the code."""
        return ReplayResult(
            run_id=snapshot.run_id,
            workflow_name=snapshot.workflow_name,
            status=snapshot.status,
            workflow_version=snapshot.workflow_version,
            divergence=self._divergence(snapshot),
        )

    def _divergence(self, snapshot: Snapshot) -> Divergence | None:
        if snapshot.workflow_name not in self.workflows:
            if snapshot.is_terminal:
                return None  # an ended run needs no code
            return Divergence(
                call=0,
                recorded=f"a run of workflow {snapshot.workflow_name!r}",
                asked="nothing: the code defines no such workflow",
            )
        interpreter = self.interpreter
        self._now = snapshot.updated_at
        try:
            session = interpreter.start(snapshot)
            decision = interpreter.next_decision(session, snapshot, None)
        except FlowNonDeterminism as exc:
            return Divergence(call=exc.call, recorded=exc.recorded, asked=exc.asked)
        except FlowError as exc:  # a recorded value the code's codec cannot decode, say
            return Divergence(call=0, recorded="the run's history", asked=f"{exc} [{exc.code}]")
        finally:
            interpreter.forget(snapshot.run_id)
        ended = _RECORDED_ENDS.get(snapshot.status)
        if ended is None:
            return None
        if isinstance(decision, Complete):
            now = "its completion"
        elif isinstance(decision, Fail):
            now = "its failure"
        else:
            return Divergence(call=session.position, recorded=_END, asked=_described(decision))
        if now != ended:
            return Divergence(call=session.position + 1, recorded=ended, asked=now)
        return None


def _described(decision: RuntimeDecision) -> str:
    """What the code asks for, as `FlowNonDeterminism` words it."""
    match decision:
        case ScheduleStep():
            return f"step {decision.step_name!r}"
        case ScheduleSteps():
            return f"asyncio.gather of {len(decision.steps)} steps"
        case WaitUntil():
            return "a sleep"
        case AwaitHook():
            return f"wait_for_event({(decision.metadata or b'').decode(errors='replace')!r})"
        case UpdateAttributes() if decision.reserved:
            return "a patch marker"
        case UpdateAttributes():
            return "set_attributes"
        case ReportProgress():
            return "report_progress"
        case LinkChildOperation():
            return f"start_child of {decision.operation_id!r}"
        case CloseHook():
            return "the close of a wait_for_event"
        case Cancel() | TimeOut():
            return "the run's end from outside"
    return type(decision).__name__
