"""Hypothesis strategies for crash tests: fault schedules for `CrashingStore`.

Needs hypothesis (the `conformance` extra).
"""

from __future__ import annotations

from hypothesis import strategies as st

from runfold.testing.crash import Fault

__all__ = ["fault_schedules"]


def fault_schedules(
    *, max_write: int = 30, max_faults: int = 3
) -> st.SearchStrategy[tuple[Fault, ...]]:
    """Schedules of up to `max_faults` faults at distinct writes 1..`max_write`, in write order.

    Each fault fails or stops the process, before or after its write; shrinking goes towards
    fewer faults at earlier writes.
    """
    if max_write < 1 or max_faults < 0:
        raise ValueError("max_write must be at least 1 and max_faults at least 0")
    fault = st.builds(
        Fault,
        write=st.integers(1, max_write),
        moment=st.sampled_from(("before", "after")),
        kind=st.sampled_from(("stop", "fail")),
    )
    return st.lists(fault, max_size=max_faults, unique_by=lambda f: f.write).map(
        lambda faults: tuple(sorted(faults, key=lambda f: f.write))
    )
