"""A live workflow session is never continued from a view older than what it was told.

Two drives of one run in one process (a worker's, and one a child's end or a delivery started)
may read the run at different moments; a drive that read it before the other appended must not
feed the session, which is past that point, a view that lacks what it already consumed.
"""

from __future__ import annotations

from runfold import MemoryStore
from runfold.flow import Flow, step, wait_for_event, workflow
from runfold.kernel import project_run


async def double(n: int) -> int:
    return 2 * n


@workflow(name="sessions-two-steps")
async def two_steps(n: int) -> int:
    first: int = await step(double, n)
    second: int = await step(double, first)
    extra = await wait_for_event("more", token="sessions-more")
    return second + int(extra)


async def test_a_view_older_than_the_session_is_replayed_not_continued() -> None:
    store = MemoryStore()
    flow = Flow(store, [two_steps])
    started = await flow.start(two_steps, 1, run_id="S")
    assert started.status == "running"  # at the wait, its session alive
    history = await store.read("S")
    assert not flow.interpreter.needs_replay(project_run(history))
    # A view read before the second step's outcome was appended: the session is past it.
    before = next(i for i, e in enumerate(history) if type(e.event).__name__ == "StepCompleted")
    assert flow.interpreter.needs_replay(project_run(history[: before + 1]))
    done = await flow.deliver("sessions-more", 3)
    assert (done.status, done.output) == ("completed", 7)
