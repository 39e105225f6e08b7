"""The kit's skeleton: capabilities, effort, the check registry, and the context a check runs in.

A check is an async function registered with `@check(capability, ...)`; its public name is
`test_` + the function name, which is also the `StoreConformance` method pytest runs. Checks of
kind "store" get a fresh store; checks of kind "sync" (hypothesis-driven ones) drive the loop
themselves through `Context.run`, one store per example.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, TypeAlias, TypeVar

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed

from runfold.stores.protocol import EventStore

__all__ = [
    "CAPABILITIES",
    "CHECKS",
    "CHECK_MODULES",
    "GROUPS",
    "Capabilities",
    "Check",
    "Context",
    "Effort",
    "StoreFactory",
    "check",
    "parse_seed",
    "unique_name",
]

T = TypeVar("T")
StoreFactory: TypeAlias = Callable[[], Awaitable[EventStore]]
"""An async callable that returns a fresh, empty store (what `make_store` is)."""

DEFAULT_EXAMPLES = 25
"""Hypothesis examples per property check when nothing else is configured: a quick CI run."""
DEFAULT_SEED = 0
"""The fixed seed used when nothing else is configured, so a CI run is repeatable."""
EXAMPLES_VARIABLE = "RUNFOLD_CONFORMANCE_EXAMPLES"
"""The environment variable that sets the examples when a suite does not (`make test-deep`)."""
SEED_VARIABLE = "RUNFOLD_CONFORMANCE_SEED"
"""The environment variable that sets the seed (an integer or "random") when a suite does not."""


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a store offers beyond the core contract.

    Checks needing a capability the store lacks are reported "not offered" (a pytest skip),
    never passed.

    - `global_feed`: `read_all` with store-wide positions.
    - `retention`: `delete_runs`.
    - `concurrency`: many tasks may use one store object at once (racing writers and readers).
    - `reopen`: the data outlives `close()` (file and server stores); needs
      `StoreConformance.reopen_store`.
    - `corruption`: the test can damage a stored payload; needs `StoreConformance.corrupt_payload`.
    - `sharing`: a second store object can be opened over the same data while the first stays
      open (another process's view of one database); needs `StoreConformance.share_store`.
    - `rewrite_index`: the store offers the optional repair `rewrite_index(run_id, index, *,
      now)` (`runfold verify --rebuild-index`).
    - `replay`: the store offers the optional `replay(run_id, *, limits)` (`Replayer`), a run's
      snapshot folded as its history is read.
    - `leases`: the store keeps worker leases when it is a `WorkerLeases` (its checks are not
      offered for a store that is not one); False leaves them out all the same.
    - `signals`: the store wakes waiters on news when it is a `RunSignals` (its checks are not
      offered for a store that is not one); False leaves them out all the same.
    """

    global_feed: bool = True
    retention: bool = True
    concurrency: bool = True
    reopen: bool = False
    corruption: bool = False
    sharing: bool = False
    rewrite_index: bool = False
    replay: bool = False
    leases: bool = True
    signals: bool = True

    def offers(self, name: str) -> bool:
        """Whether the capability called `name` is offered."""
        value: bool = getattr(self, name)
        return value


CAPABILITIES: tuple[str, ...] = tuple(field.name for field in attrs.fields(Capabilities))
"""Every capability name, in declaration order."""


@attrs.frozen(kw_only=True)
class Effort:
    """How hard the hypothesis-driven checks try.

    `examples` per property (state machine runs included), `seed` (None: a fresh random seed
    each run), and whether a failure is `shrink`ed to a minimal example (slower) or reported as
    first found.
    """

    examples: int = DEFAULT_EXAMPLES
    seed: int | None = DEFAULT_SEED
    shrink: bool = True

    @classmethod
    def resolve(
        cls, examples: int | None, seed: int | Literal["random"] | None, shrink: bool = True
    ) -> Effort:
        """The effort from explicit values, else the environment, else the quick defaults.

        The environment is `RUNFOLD_CONFORMANCE_EXAMPLES` / `RUNFOLD_CONFORMANCE_SEED` (an
        integer or "random"); the defaults are 25 examples with seed 0.

        Raises:
            ValueError: Fewer than 1 example, or a seed that is neither an integer nor "random".
        """
        if examples is None:
            examples = int(os.environ.get(EXAMPLES_VARIABLE, DEFAULT_EXAMPLES))
        if examples < 1:
            raise ValueError(f"examples must be at least 1, not {examples}")
        if seed is None:
            seed = parse_seed(os.environ.get(SEED_VARIABLE, str(DEFAULT_SEED)))
        return cls(examples=examples, seed=None if seed == "random" else seed, shrink=shrink)

    def settings(self) -> settings:
        """Hypothesis settings for this effort, whatever profile the caller's test suite loaded."""
        return settings(
            max_examples=self.examples,
            phases=tuple(Phase) if self.shrink else tuple(p for p in Phase if p != Phase.shrink),
            deadline=None,
            derandomize=False,
            database=None,
            report_multiple_bugs=False,
            stateful_step_count=50,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.large_base_example,
            ],
        )

    def seeded(self, test: T) -> T:
        """`test` (a `@given` function or a state machine class) with this effort's seed."""
        if self.seed is None:
            return test
        seeded: T = hypothesis_seed(self.seed)(test)  # type: ignore[type-var]
        return seeded


def parse_seed(text: str) -> int | Literal["random"]:
    """A hypothesis seed from text: an integer, or "random"; `ValueError` for anything else."""
    if text == "random":
        return "random"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"a seed is an integer or 'random', not {text!r}") from None


def unique_name(prefix: str = "rf") -> str:
    """A unique name of lowercase letters and digits, for a file, database or schema."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


@attrs.define(kw_only=True, eq=False)
class Context:
    """What a check runs with: capabilities, effort, the store hooks, and the check's event loop.

    Stores obtained here are closed when the check ends (closing twice is harmless by contract).
    """

    capabilities: Capabilities
    effort: Effort
    make_store: StoreFactory
    """The raw `make_store` hook, for code that manages stores on a loop of its own."""
    reopen_hook: Callable[[EventStore], Awaitable[EventStore]]
    corrupt_hook: Callable[[EventStore, str, int], Awaitable[EventStore | None]]
    share_hook: Callable[[EventStore], Awaitable[EventStore]]
    runner: asyncio.Runner
    timeout: float
    stores: list[EventStore] = attrs.field(factory=list)

    async def new_store(self) -> EventStore:
        """A fresh, empty store from `make_store`, closed at the end of the check."""
        store = await self.make_store()
        self.stores.append(store)
        return store

    async def reopen(self, store: EventStore) -> EventStore:
        """The data of the closed `store`, opened again (`reopen_store`)."""
        reopened = await self.reopen_hook(store)
        self.stores.append(reopened)
        return reopened

    async def share(self, store: EventStore) -> EventStore:
        """A second store object over the data of the open `store` (`share_store`)."""
        shared = await self.share_hook(store)
        self.stores.append(shared)
        return shared

    async def corrupt(self, store: EventStore, run_id: str, sequence: int) -> EventStore:
        """Damage the payload of one stored event (`corrupt_payload`).

        Returns:
            The store to continue with: the same one unless the hook reopened it.
        """
        replaced = await self.corrupt_hook(store, run_id, sequence)
        if replaced is None:
            return store
        self.stores.append(replaced)
        return replaced

    async def close(self, store: EventStore) -> None:
        """Close `store` now (a per-example store) instead of at the end of the check."""
        if store in self.stores:
            self.stores.remove(store)
        await store.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the check's loop, failing it after the check's timeout."""
        return self.runner.run(_bounded(coroutine, self.timeout))

    async def close_all(self) -> None:
        """Close every store the check still holds."""
        while self.stores:
            await self.stores.pop().close()


async def _bounded(coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
    try:
        async with asyncio.timeout(timeout):
            return await coroutine
    except TimeoutError:
        raise AssertionError(f"the check did not finish within {timeout:g} s") from None


CheckKind: TypeAlias = Literal["store", "sync"]


@attrs.frozen(kw_only=True)
class Check:
    """One registered check: its public name, report row, needs, and what it proves.

    `name` is public, `capability` the row it reports under, `requires` the capabilities it
    needs, and `doc` what it proves (the function's docstring on one line).
    """

    name: str
    capability: str
    requires: tuple[str, ...]
    kind: CheckKind
    function: Callable[..., Any]
    doc: str

    def missing(self, capabilities: Capabilities) -> list[str]:
        """The capabilities this check needs that `capabilities` does not offer."""
        return [name for name in self.requires if not capabilities.offers(name)]


GROUPS: tuple[str, ...] = (
    "append",
    "reads",
    "indexes",
    "retention",
    "leases",
    "signals",
    "global_feed",
    "concurrency",
    "faults",
    "reopen",
    "sharing",
    "rewrite_index",
    "replay",
    "corruption",
    "lifecycle",
    "arguments",
    "rules",
    "state_machine",
)
"""The rows of the report, in documentation order: a check reports under one of them."""

CHECKS: list[Check] = []
"""Every registered check, in registration order."""

CHECK_MODULES: tuple[str, ...] = (
    "_append",
    "_arguments",
    "_concurrency",
    "_edges",
    "_faults",
    "_feed",
    # The index checks' modules, in the order their checks were written: a group reports its
    # checks in registration order.
    "_index_agreement",
    "_run_listing",
    "_hook_tokens",
    "_wakeups",
    "_retention",
    "_leases",
    "_due_work",
    "_signals",
    "_reads",
    "_replay",
    "_rules",
    "_served",
    "_sharing",
    "machine",
)
"""The modules of `runfold.conformance` that register checks, imported by `kit` in this order."""

F = TypeVar("F", bound=Callable[..., Any])


def check(
    capability: str, *, requires: tuple[str, ...] = (), sync: bool = False
) -> Callable[[F], F]:
    """Register the decorated function as the check `test_<function name>`.

    `capability` is the report row; it is required too when it names a `Capabilities` field.
    A store check is `async def f(ctx, store)`; a `sync=True` check is `def f(ctx)`.
    """

    if capability not in GROUPS:
        raise ValueError(f"unknown check group {capability!r}")

    def register(function: F) -> F:
        needed = tuple(
            dict.fromkeys((capability, *requires) if capability in CAPABILITIES else requires)
        )
        unknown = [name for name in needed if name not in CAPABILITIES]
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}")
        name = f"test_{function.__name__}"
        if any(existing.name == name for existing in CHECKS):
            raise ValueError(f"check {name} registered twice")
        CHECKS.append(
            Check(
                name=name,
                capability=capability,
                requires=needed,
                kind="sync" if sync else "store",
                function=function,
                doc=" ".join((function.__doc__ or "").split()),
            )
        )
        return function

    return register
