"""`runfold.testing`: crash-test a durable runtime, replay-test workflow code.

`replay` checks workflow code against recorded histories (an export file, say).
`CrashingStore` wraps any store and fails or stops the process around chosen writes (a
`DelegatingStore`, the pass-through base of such wrappers);
`crash_and_resume` runs a `runfold.flow` workflow under such a schedule, resumes it in fresh
`Flow`s and compares the outcome (the run and its child runs) with a clean run, sending
messages with `Flow.send` on the way; `runfold.testing.strategies.fault_schedules`
draws schedules for hypothesis (the `conformance` extra).
"""

from runfold.testing.crash import CrashingStore, Fault, FaultKind, FaultMoment, SimulatedCrash
from runfold.testing.delegating import DelegatingStore
from runfold.testing.replay import replay
from runfold.testing.resume import (
    CrashOutcome,
    Message,
    RoundClock,
    crash_and_resume,
    family,
    run_to_end,
    shape,
)

__all__ = [
    "CrashOutcome",
    "CrashingStore",
    "DelegatingStore",
    "Fault",
    "FaultKind",
    "FaultMoment",
    "Message",
    "RoundClock",
    "SimulatedCrash",
    "crash_and_resume",
    "family",
    "replay",
    "run_to_end",
    "shape",
]
