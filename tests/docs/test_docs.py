"""The documentation is true: every Python example in the README, the changelog and docs/ runs,
and the hand-written references (errors, events and commands, the command line, the API pages)
list everything the code has."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import cast

import attrs
import pytest
from attrs import AttrsInstance

import runfold
import runfold.cli
import runfold.cli.app
import runfold.cli.verify
import runfold.conformance
import runfold.conformance.strategies
import runfold.engine
import runfold.flow
import runfold.kernel
import runfold.kernel.snapshot
import runfold.otel
import runfold.stores
import runfold.testing
import runfold.ui
from runfold.cli import main as cli_main
from runfold.engine import errors as engine_errors
from runfold.flow import errors as flow_errors
from runfold.kernel import Command, Event, errors

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
# The tutorials' examples run in tests/docs/test_docs_tutorials.py, which also checks what they
# print.
DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted(p for p in DOCS.rglob("*.md") if p.parent.name != "tutorials"),
]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _examples() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        for number, match in enumerate(_BLOCK.finditer(document.read_text()), start=1):
            found.append((f"{document.relative_to(ROOT)}#{number}", match.group(1)))
    return found


EXAMPLES = _examples()


def test_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 25
    pages_with_examples = {where.split("#")[0] for where, _ in EXAMPLES}
    for page in (
        "docs/index.md",
        "docs/concepts.md",
        "docs/how-to/choose-and-open-a-store.md",
        "docs/how-to/migrate.md",
        "docs/how-to/tail-the-global-feed.md",
        "docs/how-to/retention.md",
        "docs/how-to/verify-and-rebuild-indexes.md",
        "docs/reference/events-and-commands.md",
        "docs/reference/store-contract.md",
        "docs/reference/cli.md",
    ):
        assert page in pages_with_examples, f"{page} lost its runnable example"


@pytest.mark.parametrize(("where", "source"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_runs(where: str, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real module, so that classes an example defines resolve their annotations.
    module = ModuleType("__docs__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, where, "exec"), module.__dict__)


# --- the site ------------------------------------------------------------------------------------


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", config, re.MULTILINE))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert pages == nav, f"not in the nav: {pages - nav}; missing files: {nav - pages}"


def test_changelog_page_includes_the_changelog() -> None:
    assert '--8<-- "CHANGELOG.md"' in (DOCS / "changelog.md").read_text()
    assert "## [0.1.0]" in (ROOT / "CHANGELOG.md").read_text()


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module", [errors, engine_errors, flow_errors], ids=["kernel", "engine", "flow"]
)
def test_error_reference_lists_every_error_class(module: ModuleType) -> None:
    reference = (REFERENCE / "errors.md").read_text()
    for name in module.__all__:
        cls = getattr(module, name)
        row = re.search(rf"^\| `{name}` \| `(\w+)` \| `(\w+)` \| (\d+) \|", reference, re.M)
        assert row is not None, f"{name} is missing from docs/reference/errors.md"
        assert row.group(1) == cls.__mro__[1].__name__, name
        assert row.group(2) == cls.code, name
        assert int(row.group(3)) == cls.status, name


# --- events and commands -------------------------------------------------------------------------

EVENTS_AND_COMMANDS = (REFERENCE / "events-and-commands.md").read_text()


def _kernel_classes(base: type) -> list[type]:
    found = []
    for name in runfold.kernel.__all__:
        obj = getattr(runfold.kernel, name)
        if isinstance(obj, type) and issubclass(obj, base) and obj is not base:
            found.append(obj)
    return found


def _field_names(cls: type) -> list[str]:
    return [field.name for field in attrs.fields(cast("type[AttrsInstance]", cls))]


EVENT_CLASSES = _kernel_classes(Event)
COMMAND_CLASSES = _kernel_classes(Command)


def test_every_event_and_command_class_is_found() -> None:
    assert len(EVENT_CLASSES) == len(runfold.kernel.EVENT_TYPES) >= 20
    assert len(COMMAND_CLASSES) >= 20


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=[c.__name__ for c in EVENT_CLASSES])
def test_event_reference_row(cls: type[Event]) -> None:
    row = re.search(
        rf"^\| `{cls.__name__}` \| `{cls.event_type}` \| (.*) \| (.+) \|$",
        EVENTS_AND_COMMANDS,
        re.MULTILINE,
    )
    assert row is not None, f"no row for {cls.__name__} ({cls.event_type}) on the events page"
    fields = _field_names(cls)
    for field in fields:
        assert f"`{field}`" in row.group(1), f"{cls.__name__}.{field} is not listed"
    if not fields:
        assert row.group(1).strip() == "—"


@pytest.mark.parametrize("cls", COMMAND_CLASSES, ids=[c.__name__ for c in COMMAND_CLASSES])
def test_command_reference_section(cls: type[Command]) -> None:
    section = re.search(
        rf"^### `{cls.__name__}`\n(.*?)(?=^#)", EVENTS_AND_COMMANDS + "\n#", re.DOTALL | re.M
    )
    assert section is not None, f"no section for {cls.__name__} on the commands page"
    body = section.group(1)
    assert "| when | result |" in body, f"{cls.__name__} has no rule table"
    fields = re.search(r"^Fields: (.*?)(?:\.\s|\.$)", body, re.DOTALL | re.M)
    assert fields is not None, f"{cls.__name__} does not list its fields"
    for name in _field_names(cls):
        assert f"`{name}`" in fields.group(1), f"{cls.__name__}.{name} is not listed"


# --- the API pages -------------------------------------------------------------------------------

PUBLIC_PACKAGES = [
    runfold,
    runfold.kernel,
    runfold.kernel.snapshot,  # its page lists its members by hand, in reading order
    runfold.stores,
    runfold.engine,
    runfold.otel,
    runfold.ui,
    runfold.flow,
    runfold.testing,
    runfold.conformance,
    runfold.conformance.strategies,  # its page lists its members by hand, in reading order
    runfold.cli,
    runfold.cli.app,  # likewise
    runfold.cli.verify,
]
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?:    .*\n)*)", re.MULTILINE)


def _documented_names() -> set[str]:
    """The names the reference pages' `:::` blocks render (mkdocstrings renders a module's
    `__all__`, or the `members` its options list)."""
    names: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        for target, options in _DIRECTIVE.findall(page.read_text() + "\n"):
            names.add(target.rpartition(".")[2])
            try:
                module = importlib.import_module(target)
            except ImportError:
                continue  # an object, not a module: its own name is documented
            members = re.search(r"^\s+members: (.*)$", options, re.MULTILINE)
            if members is None:
                names.update(module.__all__)
            elif members.group(1).startswith("["):
                names.update(n.strip() for n in members.group(1).strip("[]").split(","))
    return names


@pytest.mark.parametrize("package", PUBLIC_PACKAGES, ids=[p.__name__ for p in PUBLIC_PACKAGES])
def test_reference_documents_every_public_name(package: ModuleType) -> None:
    documented = _documented_names()
    for name in package.__all__:
        if name.startswith("__"):
            assert f"`{name}`" in (REFERENCE / "runfold.md").read_text(), name
            continue
        assert name in documented, f"{package.__name__}.{name} is on no reference page"


# --- the command line ----------------------------------------------------------------------------

CLI_PAGE = (REFERENCE / "cli.md").read_text()


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli_main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_cli_page_documents_every_command_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys)
    commands_part = text.split("Commands:")[1].split("exit codes:")[0]
    commands = re.findall(r"^ {2}([a-z][a-z-]*)", commands_part, re.MULTILINE)
    assert len(commands) >= 10, text
    for command in commands:
        assert re.search(rf"^### `runfold {command}\b", CLI_PAGE, re.M), f"{command} undocumented"
        options = set(re.findall(r"--[a-z][a-z-]*", _help(capsys, command))) - {"--help"}
        if command == "conformance":  # its --help is the kit's
            options = {"--examples", "--seed", "--check", "--without", "--no-shrink"}
        for option in options:
            assert f"`{option}" in CLI_PAGE, f"runfold {command} {option} is undocumented"
    codes = re.findall(r"^ +(\d+) ", text.split("exit codes:")[1], re.MULTILINE)
    assert len(codes) >= 7, text
    for code in codes:
        assert re.search(rf"^\| {code} \|", CLI_PAGE, re.M), f"exit code {code} is undocumented"
    assert "`--store`" in CLI_PAGE and "`RUNFOLD_STORE`" in CLI_PAGE


# --- example scripts -----------------------------------------------------------------------------

# Scripts only: library modules live in subfolders (docs/examples/thirdparty/ holds a store that
# tests/stores/test_conformance.py imports).
SCRIPTS = sorted((DOCS / "examples").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_script_runs_twice_on_one_file(script: Path, tmp_path: Path) -> None:
    database = tmp_path / "example.db"
    for _ in range(2):
        finished = subprocess.run(
            [sys.executable, str(script), str(database)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert finished.returncode == 0, finished.stderr
    assert "2 run(s)" in finished.stdout


# --- nothing outside the repository --------------------------------------------------------------

OUTSIDE = re.compile(r"\b(?:EVENTS|RULES|STORES|ARCHITECTURE)\.md\b|\.\./shared|shared/design")


def test_no_page_or_docstring_cites_a_file_outside_the_repository() -> None:
    sources = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml"]
    sources += sorted(DOCS.rglob("*.md")) + sorted((ROOT / "runfold").rglob("*.py"))
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == []
