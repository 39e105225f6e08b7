"""`run_conformance`: the kit without writing a test file, and the table it prints.

`python -m runfold.conformance MODULE:FACTORY [--examples N] [--seed S|random] [--check NAME]`
runs every check against the store `FACTORY` makes and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeAlias, cast

import attrs
import pytest

from runfold.conformance import builders
from runfold.conformance._core import CAPABILITIES, GROUPS, Capabilities, Effort, parse_seed
from runfold.conformance.kit import CHECK_NAMES, CHECKS, StoreConformance
from runfold.stores.protocol import EventStore

__all__ = [
    "CheckResult",
    "ConformanceReport",
    "StoreTarget",
    "load_factory",
    "main",
    "run_conformance",
]

StoreTarget: TypeAlias = type[StoreConformance] | Callable[[], EventStore | Awaitable[EventStore]]
"""What the kit runs against: a `StoreConformance` subclass, or a store factory.

A subclass's hooks and capabilities are used; a factory is called with no arguments and returns
a fresh store or an awaitable of one.
"""

Outcome: TypeAlias = Literal["passed", "failed", "not offered"]
"""What became of one check."""

_HELPERS = Path(builders.__file__).resolve()


@attrs.frozen(kw_only=True)
class CheckResult:
    """How one check went: `outcome` is "passed", "failed" or "not offered".

    `detail` says why it failed (or what was not offered).
    """

    name: str
    capability: str
    outcome: Outcome
    seconds: float
    detail: str = ""


@attrs.frozen(kw_only=True)
class ConformanceReport:
    """The results of one run of the kit, in check order, and the effort it ran with."""

    results: tuple[CheckResult, ...]
    effort: Effort

    @property
    def ok(self) -> bool:
        """True when no check failed (checks not offered do not count as failures)."""
        return not self.failed

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the checks that failed."""
        return self._named("failed")

    @property
    def passed(self) -> tuple[str, ...]:
        """The names of the checks that passed."""
        return self._named("passed")

    @property
    def not_offered(self) -> tuple[str, ...]:
        """The names of the checks the store's capabilities do not offer."""
        return self._named("not offered")

    def _named(self, outcome: Outcome) -> tuple[str, ...]:
        return tuple(r.name for r in self.results if r.outcome == outcome)

    def result(self, name: str) -> CheckResult:
        """The result of the check called `name`."""
        for found in self.results:
            if found.name == name:
                return found
        raise KeyError(name)

    def table(self) -> str:
        """The summary by capability: checks, passed, failed, not offered, seconds."""
        order = [c for c in GROUPS if any(r.capability == c for r in self.results)]
        header = ("capability", "checks", "passed", "failed", "not offered", "seconds")
        rows = [self._row(c, [r for r in self.results if r.capability == c]) for c in order]
        rows.append(self._row("all", list(self.results)))
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        lines = []
        for row in [header, *rows]:
            cells = [str(row[0]).ljust(widths[0])]
            cells += [
                str(cell).rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
            ]
            lines.append("  ".join(cells))
        return "\n".join(lines)

    @staticmethod
    def _row(capability: str, results: list[CheckResult]) -> tuple[Any, ...]:
        count = {
            o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "not offered")
        }
        seconds = f"{sum(r.seconds for r in results):.2f}"
        return (
            capability,
            len(results),
            count["passed"],
            count["failed"],
            count["not offered"],
            seconds,
        )

    def __str__(self) -> str:
        seed = "random" if self.effort.seed is None else self.effort.seed
        lines = [self.table(), "", f"examples: {self.effort.examples}, seed: {seed}"]
        for found in self.results:
            if found.outcome == "failed":
                lines += ["", f"FAILED {found.name} ({found.capability})", _indent(found.detail)]
        lines += ["", "PASSED" if self.ok else f"{len(self.failed)} check(s) FAILED"]
        return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def _describe(exc: BaseException) -> str:
    """The error's message (with hypothesis' notes: the falsifying example) and the line that
    raised it."""
    message = "".join(traceback.format_exception_only(exc)).strip()
    # The kit's assertion helpers raise on behalf of the check that called them: name the
    # check's line (or the store's, when the store raised), not the helper's.
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve() != _HELPERS
    ]
    if not frames:
        return message
    where = frames[-1]
    return f"{message}\n(raised at {where.filename}:{where.lineno}: {where.line})"


def _suite_class(
    target: StoreTarget,
    capabilities: Capabilities | None,
    examples: int | None,
    seed: int | Literal["random"] | None,
    shrink: bool | None,
) -> type[StoreConformance]:
    """A `StoreConformance` subclass running against `target` with the given overrides."""
    overrides: dict[str, Any] = {"examples": examples, "seed": seed}
    if shrink is not None:
        overrides["shrink"] = shrink
    if capabilities is not None:
        overrides["capabilities"] = capabilities
    if isinstance(target, type) and issubclass(target, StoreConformance):
        base = target
        if examples is None:
            overrides["examples"] = target.examples
        if seed is None:
            overrides["seed"] = target.seed
    elif callable(target):
        factory = target

        async def make_store(self: StoreConformance) -> EventStore:
            made = factory()
            if inspect.isawaitable(made):
                return await cast(Awaitable[EventStore], made)
            return cast(EventStore, made)

        base = StoreConformance
        overrides["make_store"] = make_store
    else:
        raise TypeError(f"cannot run the conformance kit against {target!r}")
    return type(f"ConformanceOf{getattr(target, '__name__', 'Store')}", (base,), overrides)


def run_conformance(
    factory: StoreTarget,
    *,
    examples: int | None = None,
    seed: int | Literal["random"] | None = None,
    capabilities: Capabilities | None = None,
    checks: Iterable[str] | None = None,
    shrink: bool | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> ConformanceReport:
    """Run the conformance kit against the stores `factory` makes and report every check.

    Never raises for a failing check: inspect `report.ok`, `report.failed`, or print the report.

    Args:
        factory: A `StoreConformance` subclass, or a no-argument callable returning a fresh
            store or an awaitable of one (a store class such as `MemoryStore` will do).
        examples: Hypothesis examples per property; None: the class's, else
            `RUNFOLD_CONFORMANCE_EXAMPLES`, else 25.
        seed: The hypothesis seed, "random" for a fresh one; None: the class's, else
            `RUNFOLD_CONFORMANCE_SEED`, else 0.
        capabilities: What the store offers; a factory defaults to `Capabilities()`: everything
            but `reopen` and `corruption`, which need `StoreConformance` hooks.
        checks: Run only the checks with these names.
        shrink: False reports failing examples as found, unminimized (faster).
        on_result: Called with each check's result as it finishes.

    Raises:
        ValueError: A name in `checks` is no check's, or the effort is invalid.
    """
    chosen = list(CHECK_NAMES if checks is None else checks)
    by_name = {c.name: c for c in CHECKS}
    unknown = [name for name in chosen if name not in by_name]
    if unknown:
        raise ValueError(f"no conformance checks are called {unknown}")
    suite_class = _suite_class(factory, capabilities, examples, seed, shrink)
    effort = Effort.resolve(suite_class.examples, suite_class.seed, suite_class.shrink)
    results = []
    for name in chosen:
        check = by_name[name]
        started = time.perf_counter()
        outcome: Outcome = "passed"
        detail = ""
        try:
            suite_class().run_check(name)
        except pytest.skip.Exception as skipped:
            outcome, detail = "not offered", str(skipped.msg)
        except Exception as exc:
            outcome, detail = "failed", _describe(exc)
        result = CheckResult(
            name=name,
            capability=check.capability,
            outcome=outcome,
            seconds=time.perf_counter() - started,
            detail=detail,
        )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return ConformanceReport(results=tuple(results), effort=effort)


def load_factory(spec: str) -> StoreTarget:
    """The object `MODULE:NAME` names (NAME may be dotted), importing MODULE as `python -m` would.

    The current directory is added to `sys.path` first when it is not there.

    Raises:
        ValueError: `spec` is not `MODULE:NAME`, the module or the object cannot be found, or
            the object is not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"expected MODULE:FACTORY, not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no {attribute!r}") from None
    if not callable(found):
        raise ValueError(f"{spec!r} is not a store factory or a StoreConformance subclass")
    return cast(StoreTarget, found)


def _seed(text: str) -> int | Literal["random"]:
    try:
        return parse_seed(text)
    except ValueError as exc:  # argparse shows only this class's message
        raise argparse.ArgumentTypeError(str(exc)) from None


def _examples(text: str) -> int:
    try:
        examples = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if examples < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {examples}")
    return examples


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line naming it (not the usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _cannot_make_a_store(target: StoreTarget) -> str | None:
    """Why the factory `target` cannot make a store, or None when it made one (then closed).

    Every check would fail the same way, one after the other, so the kit stops at once.
    A `StoreConformance` subclass is not tried: its hooks may need the check's own set-up.
    """
    if isinstance(target, type) and issubclass(target, StoreConformance):
        return None

    async def attempt() -> str | None:
        try:
            made: object = target()
            store: Any = await made if inspect.isawaitable(made) else made
        except Exception as exc:  # the user's factory, whatever it raises: named
            return f"{type(exc).__name__}: {exc}"
        if not all(callable(getattr(store, name, None)) for name in _STORE_METHODS):
            return f"it made a {type(store).__name__}, not an EventStore"
        await store.close()
        return None

    return asyncio.run(attempt())


_STORE_METHODS = ("append_if_sequence", "read", "close")
"""What a made object must have to be tried as a store (the checks find what else is wrong)."""


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m runfold.conformance") -> int:
    """The command line: run the kit, print the table and any failures.

    `prog` is the name its help and its error lines show.

    Returns:
        The exit code: 0 when every offered check passed, 1 when one failed, 2 for a bad
            target (one that cannot be imported, or a factory that cannot make a store) or bad
            options.
    """
    parser = _Parser(
        prog=prog,
        description="Run runfold's store conformance kit against a store.",
    )
    parser.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="a no-argument callable returning a fresh store (or an awaitable of one), or a "
        "StoreConformance subclass",
    )
    parser.add_argument(
        "--examples", type=_examples, help="hypothesis examples per property check (at least 1)"
    )
    parser.add_argument("--seed", type=_seed, help="an integer, or 'random' (default: 0)")
    parser.add_argument(
        "--no-shrink",
        dest="shrink",
        action="store_false",
        default=None,
        help="report failing examples as found, without minimizing them",
    )
    parser.add_argument(
        "--check",
        action="append",
        choices=CHECK_NAMES,
        metavar="NAME",
        help="run only this check (repeatable)",
    )
    parser.add_argument(
        "--without",
        action="append",
        choices=CAPABILITIES,
        default=[],
        help="declare a capability the store does not offer (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        target = load_factory(args.target)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    why = _cannot_make_a_store(target)
    if why is not None:
        print(f"{parser.prog}: error: {args.target} cannot make a store: {why}", file=sys.stderr)
        return 2
    capabilities = None
    if args.without:
        base = (
            target.capabilities
            if isinstance(target, type) and issubclass(target, StoreConformance)
            else Capabilities()
        )
        capabilities = attrs.evolve(base, **dict.fromkeys(args.without, False))

    def progress(result: CheckResult) -> None:
        mark = {"passed": ".", "failed": "F", "not offered": "s"}[result.outcome]
        print(mark, end="", flush=True)

    report = run_conformance(
        target,
        examples=args.examples,
        seed=args.seed,
        capabilities=capabilities,
        checks=args.check,
        shrink=args.shrink,
        on_result=progress,
    )
    print()
    print(report)
    return 0 if report.ok else 1
