"""runfold's imports keep their shape: no module reaches itself through others (no circle), the
packages import one way (cli and ui, flow, engine, handler, stores, kernel: the import-linter
contracts in pyproject.toml), and no private module is imported from outside its package.

The graph is grimp's (import-linter's own), built from the source: every import statement,
those inside functions included.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

import runfold

ROOT = Path(runfold.__file__).parent.parent


def _circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    work: list[tuple[str, Iterable[str]]] = []  # the depth-first path, each with what is left

    def enter(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

    for start in sorted(graph.modules):
        if start in index:
            continue
        enter(start)
        while work:
            module, targets = work[-1]
            for target in targets:
                if target not in index:
                    enter(target)
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_no_module_imports_itself_round_about() -> None:
    graph = grimp.build_graph("runfold", cache_dir=None, exclude_type_checking_imports=True)
    assert _circles(graph) == []


def test_no_import_for_the_type_checker_closes_a_circle_either() -> None:
    """Annotations included: a module's handlers type what they are handed by a protocol
    (`runfold.flow.interpreting`), never by importing the module that calls them."""
    graph = grimp.build_graph("runfold", cache_dir=None)
    assert _circles(graph) == []


def test_the_search_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.d")
    graph.add_import(importer="a.d", imported="a.b")
    graph.add_import(importer="a", imported="a.b")
    assert _circles(graph) == [{"a.b", "a.c", "a.d"}]


def test_the_packages_import_one_way() -> None:
    # In a process of its own: import-linter configures logging as it starts, which would
    # take the log records later tests of this process read from `caplog`.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _private_imports(root: Path) -> Iterable[tuple[str, str]]:
    """(importer, private module) for each import of a module of runfold whose name (or a
    package's on its path) starts with an underscore, from outside the package that holds it."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                names = target.split(".")
                if names[0] != "runfold":
                    continue
                for depth, name in enumerate(names[1:], start=1):
                    if name.startswith("_") and not name.startswith("__"):
                        private = ".".join(names[: depth + 1])
                        owner = ".".join(names[:depth])
                        module = ROOT / Path(*names[: depth + 1])
                        is_module = module.is_dir() or module.with_suffix(".py").exists()
                        inside = importer == owner or importer.startswith(owner + ".")
                        if is_module and not inside:
                            yield importer, private
                        break


def test_no_private_module_is_imported_from_another_package() -> None:
    assert sorted(set(_private_imports(ROOT / "runfold"))) == []


@pytest.mark.parametrize(
    ("module", "imports", "crosses"),
    [
        ("runfold/cli/x.py", "from runfold.stores._hidden import y", True),
        ("runfold/stores/sqlite/x.py", "from runfold.stores._hidden import y", False),
        ("runfold/cli/x.py", "from runfold.stores import _hidden", True),
        ("runfold/cli/x.py", "from runfold.stores.memory import _Row", False),  # a name
    ],
)
def test_the_walk_tells_a_crossing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, imports: str, crosses: bool
) -> None:
    (tmp_path / "runfold" / "stores").mkdir(parents=True)
    (tmp_path / "runfold" / "stores" / "_hidden.py").write_text("")
    (tmp_path / "runfold" / "stores" / "memory.py").write_text("")
    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(imports + "\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert bool(list(_private_imports(tmp_path / "runfold"))) is crosses
