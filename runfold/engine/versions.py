"""Serving only some code versions: what a worker of a blue/green deploy may claim.

DBOS's `application_version`: a worker started with `versions` claims only runs whose recorded
`workflow_version` (the code version that started them, `RunCreated`) is one of them, so the
old version's workers drain its runs while the new version's take the new ones. A run that
recorded no version (a schedule's tick, made by whichever worker saw it first, or a run of a
runfold before versions) belongs to no deploy: every worker serves it. A run's version never
changes, so it is read once (the run's first event, through the handler) and kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from runfold.handler import CommandHandler
from runfold.kernel import RunCreated

__all__ = ["MISSING", "VersionFilter"]

_KEPT = 10_000  # run versions remembered; the oldest are read again when needed


class _Missing:
    """The type of `MISSING`."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
"""What `VersionFilter.version_of` answers for a run that has no history."""


class VersionFilter:
    """Keeps the runs started on one of `versions`, and those that recorded no version."""

    def __init__(self, handler: CommandHandler, versions: Collection[str]) -> None:
        if not versions or not all(isinstance(v, str) and v for v in versions):
            raise ValueError("versions must name at least one version, each a non-empty string")
        self.handler = handler
        self.versions = frozenset(versions)
        self._known: OrderedDict[str, str | None] = OrderedDict()

    async def version_of(self, run_id: str) -> str | _Missing | None:
        """The run's recorded workflow version (None: none recorded; `MISSING`: no such run)."""
        if run_id in self._known:
            return self._known[run_id]
        first = await self.handler.history(run_id, limit=1)
        if not first:
            return MISSING
        event = first[0].event
        version = event.workflow_version if isinstance(event, RunCreated) else None
        self._known[run_id] = version
        while len(self._known) > _KEPT:
            self._known.popitem(last=False)
        return version

    async def serves(self, run_id: str) -> bool:
        """Whether the run was started on one of the versions, or recorded none."""
        version = await self.version_of(run_id)
        return version is None or version in self.versions

    async def keep(self, run_ids: Sequence[str]) -> list[str]:
        """The runs among `run_ids` (in order) that this filter serves."""
        return [r for r in run_ids if await self.serves(r)]
