"""`StoreConformance`: the pytest base class a store implementer subclasses.

Its only required hook is `async def make_store(self)`; every check of the kit is a `test_…` method
of it (generated from the check registry), a plain synchronous method that runs the check on an
event loop of its own, so no async pytest plugin is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import tempfile
import textwrap
import warnings
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from hypothesis.errors import HypothesisWarning

from runfold.conformance import _core
from runfold.conformance._core import (
    CHECK_MODULES,
    GROUPS,
    Capabilities,
    Check,
    Context,
    Effort,
    unique_name,
)
from runfold.stores.protocol import EventStore

__all__ = ["CHECKS", "CHECK_NAMES", "StoreConformance"]

# The check modules register their checks on import, in documentation order.
for _module in CHECK_MODULES:
    importlib.import_module(f"runfold.conformance.{_module}")

CHECKS: tuple[Check, ...] = tuple(sorted(_core.CHECKS, key=lambda c: GROUPS.index(c.capability)))
"""Every check, in documentation order (by group, then as written)."""
CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in CHECKS)
"""Every check's public name (= its `StoreConformance` test method), in documentation order."""
_BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}


class StoreConformance:
    """The conformance kit as a pytest base class: subclass it, define `make_store`, run pytest.

    ```
    class TestMyStore(StoreConformance):
        async def make_store(self):
            return await MyStore.connect(DSN, schema=self.unique_name())
    ```

    Optional class attributes: `capabilities` (what the store offers beyond the core contract;
    checks needing more are skipped as "not offered"), `examples` and `seed` (hypothesis effort;
    default: `RUNFOLD_CONFORMANCE_EXAMPLES` / `RUNFOLD_CONFORMANCE_SEED`, else 25 examples with
    seed 0), `shrink` (False: report a failing example as found, without minimizing it),
    `check_timeout` (seconds one check may run). Optional hooks: `reopen_store` (with
    `Capabilities(reopen=True)`), `share_store` (with `Capabilities(sharing=True)`) and
    `corrupt_payload` (with `Capabilities(corruption=True)`).
    During a check `self.tmp_dir` is a fresh temporary directory, removed afterwards.
    """

    capabilities: ClassVar[Capabilities] = Capabilities()
    examples: ClassVar[int | None] = None
    seed: ClassVar[int | Literal["random"] | None] = None
    shrink: ClassVar[bool] = True
    check_timeout: ClassVar[float] = 120.0
    tmp_dir: Path

    async def make_store(self) -> EventStore:
        """A fresh, empty store, made once per check (once per example in property checks)."""
        raise NotImplementedError(f"{type(self).__name__} must define `async def make_store`")

    async def reopen_store(self, store: EventStore) -> EventStore:
        """A new store over the data of `store`, which the kit has just closed.

        Needed with `Capabilities(reopen=True)`.
        """
        raise NotImplementedError(
            f"{type(self).__name__} offers `reopen` but does not define `reopen_store`"
        )

    async def share_store(self, store: EventStore) -> EventStore:
        """A second store object over the data of `store`, which stays open.

        What another process opening the same database gets. Needed with
        `Capabilities(sharing=True)`.
        """
        raise NotImplementedError(
            f"{type(self).__name__} offers `sharing` but does not define `share_store`"
        )

    async def corrupt_payload(
        self, store: EventStore, run_id: str, sequence: int
    ) -> EventStore | None:
        """Damage the stored payload of event `sequence` of `run_id` so it no longer decodes.

        Needed with `Capabilities(corruption=True)`.

        Returns:
            The store to continue with if the damage needed a new one (say, closed, edited
                and reopened), else None.
        """
        raise NotImplementedError(
            f"{type(self).__name__} offers `corruption` but does not define `corrupt_payload`"
        )

    def unique_name(self, prefix: str = "rf") -> str:
        """A unique name of lowercase letters and digits: a database, schema or file per store."""
        return unique_name(prefix)

    def run_check(self, name: str) -> None:
        """Run the check called `name` (a `CHECK_NAMES` entry) against stores from `make_store`.

        When the store lacks a capability the check needs, it calls `pytest.skip` with "not
        offered: …". Otherwise it raises what the check raises (an `AssertionError` naming what
        the store got wrong).

        Raises:
            ValueError: No check is called `name`.
        """
        found = _BY_NAME.get(name)
        if found is None:
            raise ValueError(f"no conformance check is called {name!r}")
        missing = found.missing(self.capabilities)
        if missing:
            pytest.skip(f"not offered: {', '.join(missing)}")
        effort = Effort.resolve(self.examples, self.seed, self.shrink)
        with (
            tempfile.TemporaryDirectory(prefix="runfold-", ignore_cleanup_errors=True) as directory,
            asyncio.Runner() as runner,
            warnings.catch_warnings(),
        ):
            # A 2 MiB example has a 2 MiB repr, which hypothesis warns about: that is expected.
            warnings.filterwarnings("ignore", "Generating overly large repr", HypothesisWarning)
            self.tmp_dir = Path(directory)
            ctx = Context(
                capabilities=self.capabilities,
                effort=effort,
                make_store=self.make_store,
                reopen_hook=self.reopen_store,
                corrupt_hook=self.corrupt_payload,
                share_hook=self.share_store,
                runner=runner,
                timeout=self.check_timeout,
            )
            try:
                if found.kind == "store":
                    ctx.run(_store_check(ctx, found))
                else:
                    found.function(ctx)
            except BaseException:
                with contextlib.suppress(Exception):  # the check's own failure is what counts
                    ctx.run(ctx.close_all())
                raise
            ctx.run(ctx.close_all())


async def _store_check(ctx: Context, check: Check) -> None:
    store = await ctx.new_store()
    await check.function(ctx, store)


def _test_method(check: Check) -> object:
    def test(self: StoreConformance) -> None:
        self.run_check(check.name)

    test.__name__ = check.name
    test.__qualname__ = f"StoreConformance.{check.name}"
    # A summary line on what the method does, then what the check proves.
    proves = textwrap.fill(check.doc, 96, break_long_words=False, break_on_hyphens=False)
    test.__doc__ = f"Run the conformance check `{check.name}` (see `run_check`).\n\n{proves}\n"
    return test


for _check in CHECKS:
    setattr(StoreConformance, _check.name, _test_method(_check))
