"""Serving only some code versions: what a worker of a blue/green deploy may claim.

DBOS's `application_version`: a worker started with `versions` claims only runs whose recorded
`workflow_version` (the code version that started them, `RunCreated`) is one of them, so the
old version's workers drain its runs while the new version's take the new ones. A run's version
never changes, so it is read once (the run's first event, through the handler) and kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from runfold.handler import CommandHandler
from runfold.kernel import RunCreated

__all__ = ["VersionFilter"]

_KEPT = 10_000  # run versions remembered; the oldest are read again when needed


class VersionFilter:
    """Keeps the runs whose recorded workflow version is one of `versions`."""

    def __init__(self, handler: CommandHandler, versions: Collection[str]) -> None:
        if not versions or not all(isinstance(v, str) and v for v in versions):
            raise ValueError("versions must name at least one version, each a non-empty string")
        self.handler = handler
        self.versions = frozenset(versions)
        self._known: OrderedDict[str, str | None] = OrderedDict()

    async def version_of(self, run_id: str) -> str | None:
        """The run's recorded workflow version (None: none recorded, or no such run)."""
        if run_id in self._known:
            return self._known[run_id]
        first = await self.handler.history(run_id, limit=1)
        event = first[0].event if first else None
        version = event.workflow_version if isinstance(event, RunCreated) else None
        if first:
            self._known[run_id] = version
            while len(self._known) > _KEPT:
                self._known.popitem(last=False)
        return version

    async def keep(self, run_ids: Sequence[str]) -> list[str]:
        """The runs among `run_ids` (in order) that this filter serves."""
        return [r for r in run_ids if await self.version_of(r) in self.versions]
