"""What a `Flow` does for parents and children beyond the engine: create, wake, cancel.

Decisions and appends are the engine's; these follow-ups are the `Flow`'s, made after each of
its operations (`settle`), so they never run inside another run's drive:

- a `start_child` decision creates the child run, queued (before the decision is appended, so a
  link always names a run that exists), and has it driven: by this `Flow` after its operation,
  or, while it serves a fleet, by whichever worker takes the queued run up (this one is woken);
- a child that ended has its end delivered to the hook its parent awaits it on (now, or once
  the parent's hook is appended: the `Flow` that appended it checks the child then), which
  drives the parent;
- a parent that ended has its live children cancelled (the documented policy): the live runs
  that name it as parent in the store's index, linked or not (a child created as the parent
  ended is never linked; its creator looks at the parent once it exists); `recover` does it
  for a parent whose process died before it could (`orphans`).

While the `Flow` serves (`Flow.serve`), `keep_settling` does the follow-ups as they come.

A crash between any two of these loses nothing: a created child not yet driven is a live run
`recover` drives; a parent awaiting a child that already ended is driven by `recover`, and its
awaiting the child's hook makes the `Flow` deliver then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

from runfold.engine import (
    AwaitHook,
    Engine,
    Fail,
    LinkChildOperation,
    RunDefinitionConflict,
    RuntimeDecision,
    Worker,
)
from runfold.engine.raised import error_payload
from runfold.engine.survey import live_summaries
from runfold.flow.calls import StartChildCall
from runfold.flow.children import CHILD_KIND, RESULT_METADATA, result_payload, result_token
from runfold.flow.continuation import (
    CONTINUE_KIND,
    cancel_chain,
    continued_as,
    first_run_id,
    generation,
    last_run,
    successor_run_id,
)
from runfold.flow.encoding import PayloadCodec
from runfold.flow.info import CONTINUED_FROM, FIRST_RUN, GENERATION
from runfold.kernel import (
    CreateRun,
    EntityConflict,
    HookNotFound,
    RunExpired,
    Snapshot,
    StoreClosed,
    StoreUnavailable,
    TerminalState,
)

if TYPE_CHECKING:
    from runfold.flow.interpreting import Interpreting

__all__ = ["Family"]

_log = logging.getLogger("runfold.flow")

FollowUp: TypeAlias = tuple[Literal["drive", "ended", "awaited"], str, bytes]
"""("drive", run id, b""), ("ended", run id, b""), ("awaited", hook token, child run id)."""


class Family:
    """The parent/child follow-ups of one `Flow`'s operations."""

    def __init__(
        self,
        engine: Engine,
        interpreter: Interpreting,
        codec: PayloadCodec,
        version: Callable[[], str | None],
        worker: Callable[[], Worker | None],
    ) -> None:
        self.engine = engine
        self.handler = engine.handler
        self.interpreter = interpreter
        self.codec = codec
        self.version = version
        self.worker = worker  # the worker the Flow serves as, if it does
        self.queue: deque[FollowUp] = deque()
        self.queued = asyncio.Event()  # set when a follow-up joins the queue

    def push(self, follow_up: FollowUp) -> None:
        """Queue a follow-up."""
        self.queue.append(follow_up)
        self.queued.set()

    # --- while the engine drives --------------------------------------------------------------

    async def decided(self, snapshot: Snapshot, decision: RuntimeDecision) -> RuntimeDecision:
        """Act on a workflow decision before the engine applies it; the decision to apply."""
        if isinstance(decision, LinkChildOperation) and decision.kind == CHILD_KIND:
            await self.create_child(snapshot, decision)
        elif isinstance(decision, LinkChildOperation) and decision.kind == CONTINUE_KIND:
            return await self.start_successor(snapshot, decision)
        elif isinstance(decision, AwaitHook) and decision.hook_id in snapshot.hooks:
            # A hook the run has (a replay's): the child may have ended while nobody drove the
            # run. A hook not made yet is checked once its creation is appended (`awaits`).
            self.awaits(decision.token, decision.metadata)
        return decision

    def awaits(self, token: str, metadata: bytes | None) -> None:
        """A parent awaits a hook it has: if it is a child's, check whether the child ended.

        Called once the hook's creation is appended (`FlowRuntime.on_event`), and when a run
        that has the hook is driven again. Not before the hook is durable: the child's end is
        delivered only to a hook that exists, so a child that ends after a check made before
        the append, and before the append, would wake nobody.
        """
        if metadata is not None and metadata.startswith(RESULT_METADATA):
            self.push(("awaited", token, metadata[len(RESULT_METADATA) :]))

    async def awaited(self, token: str, child_id: str) -> None:
        """Deliver the child's end to the parent's hook `token` if the child has ended."""
        found = await self.handler.lookup(child_id)
        if found is not None:  # a child that continued as new ends with its chain
            found = await last_run(self.handler, found)
        if found is not None and found.is_terminal:  # ended before the parent asked
            await self.deliver(token, _outcome(found))

    async def create_child(self, parent: Snapshot, link: LinkChildOperation) -> None:
        """Create the child run `link` names, queued, unless it exists; have it driven."""
        session = self.interpreter.sessions.get(parent.run_id)
        call = None if session is None else session.call
        assert isinstance(call, StartChildCall) and link.child_run_id is not None
        child_id = link.child_run_id
        existing = await self.handler.lookup(child_id)
        if existing is None:
            deadline: datetime | None = None
            if call.timeout is not None:
                deadline = self.handler.clock() + call.timeout
            create = CreateRun(
                workflow_name=call.workflow.name,
                input=self.codec.encode(call.input),
                workflow_version=self.version(),
                parent_run_id=parent.run_id,
                deadline=deadline,
            )
            try:
                await self.handler.execute(child_id, create)
            except EntityConflict:  # created meanwhile (another process replaying the parent)
                existing = await self.handler.lookup(child_id)
        if existing is not None and (
            existing.parent_run_id != parent.run_id or existing.workflow_name != call.workflow.name
        ):
            raise RunDefinitionConflict(
                f"child run {child_id!r} of run {parent.run_id!r} exists as another run "
                f"(workflow {existing.workflow_name!r}, parent {existing.parent_run_id!r})",
                run_id=child_id,
            )
        # The parent may have ended (cancelled elsewhere) since this drive read it, and its
        # end's follow-up looked for its children before this one existed: look again now.
        # A parent that ends after this read finds the child in the index (`after_end`).
        now = await self.handler.lookup(parent.run_id)
        if now is not None and now.is_terminal:
            self.push(("ended", parent.run_id, b""))
        self.push(("drive", child_id, b""))

    def ended(self, run_id: str) -> None:
        """A run ended: its parent and children may need a follow-up."""
        session = self.interpreter.sessions.get(run_id)
        if session is None or session.family or session.info.parent_run_id is not None:
            self.push(("ended", run_id, b""))

    async def orphans(self, live: Iterable[Snapshot]) -> None:
        """Queue the end of each ended parent or predecessor of a run in `live`.

        `live` is what `recover` drove. A process that died after a parent's end was appended,
        before its follow-up cancelled the children, leaves them live; so does one that died
        after a run was cancelled, once its successor was made and before it was linked. The
        recovering process cancels them then (`after_end`).
        """
        parents: set[str] = set()
        predecessors: set[str] = set()
        for run in (r for r in live if r.is_live):
            if run.parent_run_id is not None:
                parents.add(run.parent_run_id)
            if CONTINUED_FROM in run.attributes:
                predecessors.add(run.attributes[CONTINUED_FROM])
        for run_id in sorted(parents | predecessors):
            found = await self.handler.lookup(run_id)
            if found is None or not found.is_terminal:
                continue
            # A predecessor that continued as new ended as it should: nothing is left to do.
            if run_id in parents or continued_as(found) is None:
                self.push(("ended", run_id, b""))

    async def start_successor(self, run: Snapshot, link: LinkChildOperation) -> RuntimeDecision:
        """Create the successor `link` names, queued, unless it exists; have it driven.

        The decision to apply: `link`, or, when a run of that id exists and is not this run's
        successor, the run's failure with `RunDefinitionConflict`.
        """
        successor_id = link.child_run_id
        assert successor_id is not None and link.metadata is not None
        handler = self.handler
        existing = await handler.lookup(successor_id)
        if existing is None:
            create = CreateRun(
                workflow_name=link.operation_id,
                input=link.metadata,
                workflow_version=self.version(),
                parent_run_id=run.parent_run_id,
                deadline=run.deadline,
                attributes={
                    CONTINUED_FROM: run.run_id,
                    FIRST_RUN: first_run_id(run),
                    GENERATION: str(generation(run) + 1),
                },
                allow_reserved=True,
            )
            try:
                await handler.execute(successor_id, create)
            except EntityConflict:  # created meanwhile (another process replaying the run)
                existing = await handler.lookup(successor_id)
        if existing is not None and existing.attributes.get(CONTINUED_FROM) != run.run_id:
            conflict = RunDefinitionConflict(
                f"run {successor_id!r}, the successor of run {run.run_id!r}, exists as another run "
                f"(workflow {existing.workflow_name!r})",
                run_id=successor_id,
            )
            return Fail(error=error_payload(conflict), error_code=type(conflict).__name__)
        # As for a child (`create_child`): the run may have ended (cancelled elsewhere) since
        # this drive read it, without the link, and its end's follow-up looked for a successor
        # before this one existed. A run that ends after this read finds it (`after_end`).
        now = await handler.lookup(run.run_id)
        if now is not None and now.is_terminal and continued_as(now) != successor_id:
            self.push(("ended", run.run_id, b""))
        self.push(("drive", successor_id, b""))
        return link

    # --- after a Flow operation ---------------------------------------------------------------

    async def settle(self) -> bool:
        """Do every follow-up, and those they bring; whether there was any.

        A follow-up that fails is logged and dropped: what it would have done is found again by
        `Flow.recover` (a live child, a parent awaiting an ended child).

        Raises:
            StoreUnavailable: The store could not be reached (`recover` carries on).
            StoreClosed: The store was closed.
        """
        worked = False
        while self.queue:
            worked = True
            kind, subject, payload = self.queue.popleft()
            try:
                worker = self.worker()
                if kind == "drive" and worker is not None:
                    worker.wake()  # a queued run: the fleet takes it up
                elif kind == "drive":
                    await self.engine.drive(subject)
                elif kind == "awaited":
                    await self.awaited(subject, payload.decode())
                else:
                    await self.after_end(subject)
            except (StoreUnavailable, StoreClosed):
                raise
            except Exception as exc:
                _log.warning("follow-up %s of %r failed: %r", kind, subject, exc)
        return worked

    async def keep_settling(self) -> None:
        """`settle` whenever a follow-up is queued, until cancelled (while the Flow serves)."""
        while True:
            await self.queued.wait()
            self.queued.clear()
            try:
                await self.settle()
            except (StoreUnavailable, StoreClosed) as exc:
                _log.warning("parent/child follow-ups wait for the store: %r", exc)
                await asyncio.sleep(1.0)
                self.queued.set()

    async def deliver(self, token: str, payload: bytes) -> None:
        """Deliver a child's end to its parent's hook, once, and drive the parent."""
        # Refused when the parent is not awaiting it (yet, or any more), or already has it.
        with contextlib.suppress(HookNotFound, RunExpired, EntityConflict):
            await self.engine.deliver(token, payload, delivery_id="child-ended")

    async def after_end(self, run_id: str) -> None:
        """Wake the ended run's parent if it awaits it; cancel its live children."""
        run = await self.handler.snapshot(run_id)
        # A run that continued as new is not the end of its chain, which its parent awaits.
        if run.parent_run_id is not None and continued_as(run) is None:
            parent = await self.handler.lookup(run.parent_run_id)
            linked = first_run_id(run)
            if parent is not None and parent.is_live:
                for link in parent.children.values():
                    if link.kind == CHILD_KIND and link.child_run_id == linked and link.metadata:
                        await self.deliver(result_token(link.metadata), _outcome(run))
        if continued_as(run) is None:
            await self.cancel_successor(run)
        # The runs that name it as parent, from the store's index, not its links: a child made
        # just before the parent ended, which it could not link, is one; so is the successor of
        # a child that continued as new (it keeps the parent) while it was being cancelled.
        reason = f"its parent run {run_id!r} ended {run.status}"
        for child_id in await self.live_children(run_id):
            # Refused when it ended or started cancelling meanwhile (continuing as new is not
            # ending: its successor, made after the listing, is asked in its place).
            with contextlib.suppress(TerminalState, EntityConflict):
                await cancel_chain(self.engine, child_id, reason)

    async def cancel_successor(self, run: Snapshot) -> None:
        """Cancel the successor of a run that ended without continuing, if it was made.

        A run decides to continue, creates its successor, then links it: a run cancelled
        elsewhere in between ends without the link, and its successor must not live on.
        """
        successor_id = successor_run_id(first_run_id(run), generation(run) + 1)
        found = await self.handler.lookup(successor_id)
        if found is None or found.attributes.get(CONTINUED_FROM) != run.run_id:
            return
        reason = f"run {run.run_id!r} ended {run.status} without continuing as it"
        with contextlib.suppress(TerminalState, EntityConflict):  # it ended, or is cancelling
            await cancel_chain(self.engine, successor_id, reason)

    async def live_children(self, run_id: str) -> list[str]:
        """The ids of the pending and running runs whose parent is `run_id`.

        One that is cancelling already is left be.
        """
        return [
            summary.run_id
            async for summary in live_summaries(self.handler, None, parent_run_id=run_id)
            if summary.status in ("pending", "running")
        ]


def _outcome(run: Snapshot) -> bytes:
    body = run.output if run.status == "completed" else run.error
    return result_payload(run.status, body)
