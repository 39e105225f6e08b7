"""Every public name has a docstring the API reference can render (issue #8).

Public names are those in the `__all__` of every runfold module that defines one, and, for
classes, their public methods and properties defined in runfold. Each needs a docstring whose
first line is a one-sentence summary: one line, ending with a period, at most 100 characters.
Constants and type aliases carry an attribute docstring (a string right after the assignment),
which is what mkdocstrings renders, so they are read from the source. An `Args:` section may only
name parameters the callable has (griffe warns otherwise and `mkdocs build --strict` fails), and
a `Returns:` description must indent its continuation lines (griffe splits it silently otherwise).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterator
from functools import cache, cached_property
from types import ModuleType
from typing import Any

import runfold

SUMMARY_LENGTH = 100
_SECOND_SENTENCE = re.compile(r"[.!?]\s+[A-Z]")
_ARG_NAME = re.compile(r"^\*{0,2}(\w+)")


def _modules() -> list[ModuleType]:
    """runfold and its submodules that define `__all__` (`__main__` modules would run)."""
    found = [runfold]
    for info in pkgutil.walk_packages(runfold.__path__, "runfold."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            found.append(importlib.import_module(info.name))
    return [module for module in found if hasattr(module, "__all__")]


@cache
def _tree(module_name: str) -> ast.Module:
    return ast.parse(inspect.getsource(importlib.import_module(module_name)))


def _assignment(module_name: str, name: str) -> tuple[str, str | None] | None:
    """Where an assignment binds a module-level name, and the string after it (as griffe reads).

    Imports are followed to the module that assigns the name; None when a `def` or `class`
    statement binds it instead (its `__doc__` is the docstring then).
    """
    body = list(_tree(module_name).body)
    for statement in list(body):  # names imported for type checkers only: `runfold` lazily
        if isinstance(statement, ast.If) and ast.unparse(statement.test) in (
            "TYPE_CHECKING",
            "_TYPE_CHECKING",
        ):
            body += statement.body
    star_sources = []
    for statement, following in zip(body, [*body[1:], None], strict=True):
        target = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        elif isinstance(statement, ast.AnnAssign):
            target = statement.target
        if isinstance(target, ast.Name) and target.id == name:
            doc = None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                doc = following.value.value
            return f"{module_name}.{name}", doc
        if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith("runfold"):
            for alias in statement.names:
                if alias.name == "*":
                    star_sources.append(str(statement.module))
                elif (alias.asname or alias.name) == name:
                    return _assignment(str(statement.module), alias.name)
    for source in star_sources:
        if (found := _assignment(source, name)) is not None:
            return found
    return None


def _summary_problem(doc: str | None) -> str | None:
    if not doc or not doc.strip():
        return "no docstring"
    lines = inspect.cleandoc(doc).splitlines()
    summary = lines[0]
    if len(lines) > 1 and lines[1].strip():
        return "summary runs over more than one line (a blank line must follow it)"
    if not summary.endswith("."):
        return "summary does not end with a period"
    if len(summary) > SUMMARY_LENGTH:
        return f"summary is {len(summary)} characters (at most {SUMMARY_LENGTH})"
    if _SECOND_SENTENCE.search(summary):
        return "summary is more than one sentence"
    return None


def _section_items(doc: str, headings: tuple[str, ...]) -> list[str]:
    """The item lines (those at the section's own indentation) of the named Google sections."""
    items: list[str] = []
    lines = inspect.cleandoc(doc).splitlines()
    for number, line in enumerate(lines):
        if line.rstrip() not in [f"{heading}:" for heading in headings]:
            continue
        indent = None
        for entry in lines[number + 1 :]:
            if not entry.strip():
                continue
            depth = len(entry) - len(entry.lstrip())
            if depth == 0:
                break
            indent = depth if indent is None else indent
            if depth == indent:
                items.append(entry.strip())
    return items


def _sections_problem(doc: str, function: Callable[..., Any] | None) -> str | None:
    """A `Returns:` section griffe would split, or an `Args:` item naming no parameter.

    A `Returns:` description whose continuation line is not indented becomes two items; an
    `Args:` item must name a parameter of `function` (or of the class's `__init__`).
    """
    returns = _section_items(doc, ("Returns", "Yields"))
    if len(returns) > 1:
        return "Returns: more than one item (indent a description's continuation lines)"
    documented = [
        match.group(1)
        for item in _section_items(doc, ("Args", "Arguments", "Parameters", "Params"))
        if (match := _ARG_NAME.match(item))
    ]
    if not documented or function is None:
        return None
    parameters = inspect.signature(function).parameters
    unknown = [name for name in documented if name not in parameters]
    return f"Args: names no such parameter: {', '.join(unknown)}" if unknown else None


def _routine(member: object) -> Callable[..., Any] | None:
    """The function behind a class member, or None when the member is not a method/property."""
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        return member.fget
    if isinstance(member, cached_property):
        return member.func
    return member if inspect.isfunction(member) else None


def _members(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Public methods and properties a class gets from runfold code, as (where, function)."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("runfold"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            function = _routine(member)
            if function is not None:
                where = f"{klass.__module__}.{klass.__qualname__}.{name}"
                yield where, function


def _problems() -> list[str]:
    problems: dict[str, str] = {}

    def judge(where: str, doc: str | None, function: Callable[..., Any] | None = None) -> None:
        problem = _summary_problem(doc)
        if problem is None and doc is not None:
            problem = _sections_problem(doc, function)
        if problem is not None:
            problems[where] = problem

    for module in _modules():
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value):
                judge(value.__name__, value.__doc__)
            elif (assigned := _assignment(module.__name__, name)) is not None:
                judge(*assigned)
            elif inspect.isclass(value):
                where = f"{value.__module__}.{value.__qualname__}"
                judge(where, value.__dict__.get("__doc__"), value)
                for where, function in _members(value):
                    judge(where, function.__doc__, function)
            else:
                judge(f"{value.__module__}.{value.__qualname__}", value.__doc__, value)
    return [f"{where}: {problem}" for where, problem in sorted(problems.items())]


def test_the_walk_sees_the_public_surface() -> None:
    modules = {module.__name__ for module in _modules()}
    assert {"runfold.kernel.errors", "runfold.engine.errors", "runfold.stores.protocol"} <= modules
    where = _assignment("runfold.kernel", "SPEC_VERSION")
    assert where is not None
    assert where[0] == "runfold.kernel.limits.SPEC_VERSION"
    assert _assignment("runfold", "Snapshot") is None  # a class statement: its __doc__ counts


def test_every_public_name_has_a_docstring_with_a_one_sentence_summary() -> None:
    problems = _problems()
    assert not problems, f"{len(problems)} public names need docstring work:\n" + "\n".join(
        problems
    )
