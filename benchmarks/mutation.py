"""The conformance kit's mutation score: how many small faults in `MemoryStore` it notices.

    python -m benchmarks.mutation [--jobs 2] [--examples 25] [--only SUBSTRING] [--list]

Each mutant is `runfold/stores/memory.py` with one small change (a comparison flipped, a bound
moved by one, a condition negated, a boolean or an `and` swapped, a statement dropped). A mutant
is loaded as a module of its own, beside the real `MemoryStore`, which stays the state
machine's oracle, and the kit runs against it check by check until one fails (killed) or all
pass (survived). A survivor is either listed in `mutation_equivalent.txt` with the reason it
cannot change an answer of the store, or it is a gap in the kit: the run exits non-zero when a
survivor is not listed there.

Hand-written rather than mutmut: mutmut rewrites the package in place and runs one pytest
command per mutant, which would swap the oracle for the mutant too and runs the whole suite;
this needs the mutant beside the original and the kit alone, check by check.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "runfold" / "stores" / "memory.py"
EQUIVALENT = Path(__file__).resolve().parent / "mutation_equivalent.txt"
"""Survivors shown equivalent: one `key  # why` line each (see `Mutant.key`)."""
MUTANT_TIMEOUT = 600.0
"""Seconds one mutant's kit run may take; a mutant that hangs the kit is counted as killed."""

_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BINARY_SWAPS: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}


@attrs.frozen
class Mutant:
    """One change to the module: where (the enclosing function), what it was and what it is."""

    function: str
    before: str
    after: str
    occurrence: int
    line: int
    source: str

    @property
    def key(self) -> str:
        """Stable across edits elsewhere in the file: function, change, and which occurrence of
        that same change in that function."""
        return f"{self.function}: {self.before} -> {self.after} #{self.occurrence}"


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _changes(node: ast.AST) -> Iterator[ast.AST]:
    """The mutated copies of `node` itself (its children are visited on their own)."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            swap = _COMPARE_SWAPS.get(type(op))
            if swap is not None:
                changed = copy.deepcopy(node)
                changed.ops[index] = swap()
                yield changed
    elif isinstance(node, ast.BoolOp):
        either = copy.deepcopy(node)
        either.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield either
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield copy.deepcopy(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY_SWAPS:
        arithmetic = copy.deepcopy(node)
        arithmetic.op = _BINARY_SWAPS[type(node.op)]()
        yield arithmetic
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield ast.Constant(value=not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield ast.Constant(value=node.value + 1)
        if node.value:
            yield ast.Constant(value=node.value - 1)
    elif isinstance(node, ast.If):
        negated = copy.deepcopy(node)
        negated.test = ast.UnaryOp(op=ast.Not(), operand=negated.test)
        yield negated


def _replace(tree: ast.Module, target: ast.AST, replacement: ast.AST) -> ast.Module:
    """A copy of `tree` with the node `target` (found by identity) replaced."""

    class Swap(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            if node is target:
                return replacement
            return super().generic_visit(node)

    swapped: ast.Module = Swap().visit(copy.deepcopy(tree, {id(target): target}))
    return ast.fix_missing_locations(swapped)


def mutants(path: Path = TARGET) -> list[Mutant]:
    """Every mutant of the module at `path`, in source order."""
    text = path.read_text()
    tree = ast.parse(text)
    found: list[Mutant] = []
    seen: dict[tuple[str, str, str], int] = {}
    for name, function in _functions(tree):
        body = [s for s in function.body if not _is_docstring(s)]
        nodes: list[ast.AST] = [n for s in body for n in ast.walk(s)]
        for node in nodes:
            if isinstance(node, ast.stmt) and not isinstance(node, ast.If):
                replacements: list[ast.AST] = [ast.Pass()]
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Return):
                    replacements = []  # dropping a return changes the type, not a behaviour
            else:
                replacements = []
            for replacement in [*_changes(node), *replacements]:
                before = ast.unparse(node).splitlines()[0]
                after = ast.unparse(replacement).splitlines()[0] if replacement else ""
                if before == after:
                    continue
                changed = _replace(tree, node, replacement)
                counter = (name, before, after)
                seen[counter] = seen.get(counter, 0) + 1
                found.append(
                    Mutant(
                        function=name,
                        before=before,
                        after=after,
                        occurrence=seen[counter],
                        line=getattr(node, "lineno", 0),
                        source=ast.unparse(changed),
                    )
                )
    return found


# --- one mutant, in a process of its own ----------------------------------------------------------


def run_one(source: str, examples: int) -> dict[str, Any]:
    """The kit against the `MemoryStore` of `source`, check by check until one fails."""
    from runfold.conformance import CHECK_NAMES, Capabilities, StoreConformance, run_conformance
    from runfold.stores.protocol import EventStore

    module = types.ModuleType("runfold.stores.memory_mutant")
    module.__file__ = str(TARGET)
    sys.modules[module.__name__] = module
    exec(compile(source, str(TARGET), "exec"), module.__dict__)
    store_class = module.MemoryStore

    class Mutated(StoreConformance):
        capabilities = Capabilities(corruption=True, rewrite_index=True)
        check_timeout = 60.0

        async def make_store(self) -> EventStore:
            made: EventStore = store_class()
            return made

        async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> None:
            rows: Any = store._rows  # type: ignore[attr-defined]
            feed: Any = store._feed  # type: ignore[attr-defined]
            row = rows[run_id][sequence - 1]
            damaged = attrs.evolve(row, payload=b"\xff\x00")
            rows[run_id][sequence - 1] = damaged
            feed[feed.index(row)] = damaged

    # The slow property checks last, so most mutants die in the quick ones.
    slow = ("test_state_machine", "test_index_agrees_with_kernel", "test_round_trip_generated")
    order = sorted(CHECK_NAMES, key=lambda name: name.startswith(slow))
    for name in order:
        report = run_conformance(Mutated, checks=[name], examples=examples, shrink=False)
        if not report.ok:
            return {"killed_by": name, "detail": report.result(name).detail.splitlines()[0]}
    return {"killed_by": None, "detail": ""}


def _spawn(mutant: Mutant, examples: int) -> dict[str, Any]:
    started = time.monotonic()
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "benchmarks.mutation", "--worker", "--examples", str(examples)],
            input=mutant.source,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=MUTANT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"killed_by": "timeout", "detail": "", "seconds": MUTANT_TIMEOUT}
    lines = finished.stdout.strip().splitlines()
    if finished.returncode != 0 or not lines:
        # The mutant broke the module itself (it does not import): any test would notice.
        outcome: dict[str, Any] = {"killed_by": "import", "detail": finished.stderr[-200:]}
    else:
        outcome = json.loads(lines[-1])
    outcome["seconds"] = time.monotonic() - started
    return outcome


def equivalent_keys(path: Path = EQUIVALENT) -> dict[str, str]:
    """The survivors shown equivalent: key → why."""
    found = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            key, _, why = line.partition("  # ")
            found[key.strip()] = why.strip()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mutation", description=__doc__)
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--examples", type=int, default=25, help="hypothesis examples per check")
    parser.add_argument("--only", help="only mutants whose key contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_one(sys.stdin.read(), args.examples)))
        return 0
    chosen = [m for m in mutants() if args.only is None or args.only in m.key]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.line:4d}  {mutant.key}")
        print(f"{len(chosen)} mutants")
        return 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda m: _spawn(m, args.examples), chosen))
    known = equivalent_keys()
    survivors = [m for m, o in zip(chosen, outcomes, strict=True) if o["killed_by"] is None]
    unexplained = [m for m in survivors if m.key not in known]
    killed = len(chosen) - len(survivors)
    by_check: dict[str, int] = {}
    for outcome in outcomes:
        if outcome["killed_by"] is not None:
            by_check[outcome["killed_by"]] = by_check.get(outcome["killed_by"], 0) + 1
    print(f"mutants of {TARGET.relative_to(ROOT)}: {len(chosen)}")
    print(
        f"killed: {killed}   survived: {len(survivors)}   ({len(survivors) - len(unexplained)}"
        f" shown equivalent, {len(unexplained)} unexplained)"
    )
    score = killed / max(len(chosen) - (len(survivors) - len(unexplained)), 1)
    print(f"score over non-equivalent mutants: {score:.1%}")
    print(
        f"seconds: {time.monotonic() - started:.0f} with {args.jobs} jobs, {args.examples} examples"
    )
    print("\nkilled by:")
    for name, count in sorted(by_check.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {count:4d}  {name}")
    for mutant in survivors:
        why = known.get(mutant.key)
        mark = "equivalent" if why else "SURVIVED"
        print(f"\n{mark}: line {mutant.line}: {mutant.key}" + (f"\n  {why}" if why else ""))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
