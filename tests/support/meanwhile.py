"""Store wrappers that stage a race: something happens elsewhere in the middle of an append."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from runfold import EventStore
from runfold.flow.children import RESULT_METADATA
from runfold.kernel import Envelope, Event, HookCreated
from runfold.testing import DelegatingStore

__all__ = ["AroundCreation", "BeforeEvent", "ChildEndsFirst"]


class AroundCreation(DelegatingStore):
    """Around the append that creates run `run_id`, has `meanwhile` run once (`before` or
    after it): a parent or predecessor ends elsewhere once it decided to make the run, before
    it links it."""

    def __init__(
        self,
        inner: EventStore,
        run_id: str,
        meanwhile: Callable[[], Awaitable[None]],
        *,
        before: bool,
    ) -> None:
        super().__init__(inner)
        self.run_id = run_id
        self.before = before
        self.meanwhile: Callable[[], Awaitable[None]] | None = meanwhile

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        meanwhile = self.meanwhile
        if meanwhile is None or call[0] != self.run_id or call[1] != 0:
            return await super()._append_if_sequence(*call)
        self.meanwhile = None
        if self.before:
            await meanwhile()
        appended = await super()._append_if_sequence(*call)
        if not self.before:
            await meanwhile()
        return appended


class BeforeEvent(DelegatingStore):
    """Before the first append of an event of type `kind` to run `run_id`, has `meanwhile`
    run once: the run moves on elsewhere after the caller read it, before its append."""

    def __init__(
        self,
        inner: EventStore,
        run_id: str,
        kind: type[Event],
        meanwhile: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(inner)
        self.run_id = run_id
        self.kind = kind
        self.meanwhile: Callable[[], Awaitable[None]] | None = meanwhile

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        meanwhile = self.meanwhile
        events: Sequence[Event] = call[2]
        if (
            meanwhile is not None
            and call[0] == self.run_id
            and any(isinstance(e, self.kind) for e in events)
        ):
            self.meanwhile = None
            await meanwhile()
        return await super()._append_if_sequence(*call)


class ChildEndsFirst(DelegatingStore):
    """Before it appends the hook a parent awaits child `child_id` on, has `meanwhile` run:
    the child ends elsewhere after the parent looked at it and before its hook exists."""

    def __init__(
        self, inner: EventStore, child_id: str, meanwhile: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(inner)
        self.metadata = RESULT_METADATA + child_id.encode()
        self.meanwhile: Callable[[], Awaitable[None]] | None = meanwhile

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        events: Sequence[Event] = call[2]
        meanwhile = self.meanwhile
        if meanwhile is not None and any(
            isinstance(e, HookCreated) and e.metadata == self.metadata for e in events
        ):
            self.meanwhile = None
            await meanwhile()
        return await super()._append_if_sequence(*call)
