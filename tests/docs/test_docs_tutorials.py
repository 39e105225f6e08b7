"""The tutorials (docs/tutorials/) work as written.

Every Python block runs on its own (here, not in tests/docs/test_docs.py) and prints exactly the
output the page shows after it (a text block marked `<!-- output -->`). The store a reader
writes in certify-a-store.md is extracted from the page and certified for real, with the two
commands the page shows, and their results are the ones the page prints.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from runfold.conformance import CHECK_NAMES, CHECKS

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
PAGES = (
    "durable-functions.md",
    "runtime-on-engine.md",
    "bare-kernel.md",
    "certify-a-store.md",
    "property-testing.md",
)

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_OUTPUT_MARK = "<!-- output -->"


def _blocks(page: str) -> list[tuple[str, str, bool]]:
    """The page's fenced blocks in order: (language, text, marked as the output of the block
    before it)."""
    text = (TUTORIALS / page).read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].strip() == _OUTPUT_MARK
        found.append((match.group(1), match.group(2), marked))
    return found


def _examples() -> list[tuple[str, str, str | None]]:
    """Every Python block of the tutorials with the output the page shows for it (or None)."""
    examples = []
    for page in PAGES:
        blocks = _blocks(page)
        number = 0
        for i, (language, source, _) in enumerate(blocks):
            if language != "python":
                continue
            number += 1
            follows = blocks[i + 1] if i + 1 < len(blocks) else None
            shown = follows[1] if follows is not None and follows[2] else None
            examples.append((f"{page}#{number}", source, shown))
    return examples


EXAMPLES = _examples()


def test_every_tutorial_has_examples_and_outputs() -> None:
    for page in PAGES:
        assert (TUTORIALS / page).is_file(), page
        ours = [e for e in EXAMPLES if e[0].startswith(f"{page}#")]
        assert ours, f"{page} has no Python example"
    assert sum(shown is not None for _, _, shown in EXAMPLES) >= 4
    for page in PAGES:  # a marked output always follows a program or a command
        blocks = _blocks(page)
        for i, (language, _, marked) in enumerate(blocks):
            if marked:
                assert language == "text" and i > 0, page
                assert blocks[i - 1][0] in ("python", "console"), page


def test_every_durable_functions_section_shows_dbos_beside_runfold() -> None:
    # Each section of the durable-functions tutorial runs runfold's version and shows DBOS's.
    text = (TUTORIALS / "durable-functions.md").read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    assert len(sections) >= 12
    for section in sections:
        title = section.splitlines()[0]
        fences = re.findall(r"^```(\w*)\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
        dbos = [code for language, code in fences if language == "py" and "DBOS" in code]
        if title == "The rules":  # no example: the rules, then DBOS's in a sentence
            assert "DBOS asks the same" in section
        elif title == "runfold and DBOS, side by side":
            assert "| DBOS |" in section
        else:
            assert dbos, f"section {title!r} shows no DBOS version"
            assert any(language == "python" for language, _ in fences), title


@pytest.mark.parametrize(("where", "source", "shown"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_prints_what_the_page_shows(
    where: str, source: str, shown: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = ModuleType("__docs__")  # as tests/docs/test_docs.py runs it
    monkeypatch.setitem(sys.modules, module.__name__, module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, where, "exec"), module.__dict__)
    if shown is not None:
        assert printed.getvalue() == shown, f"{where} no longer prints what the page shows"


# --- certify-a-store.md: the reader's store, certified the two ways the page shows ---------------

STORE_MODULE = "dict_store"


def _store_source() -> str:
    sources = [s for lang, s, _ in _blocks("certify-a-store.md") if "class DictStore" in s]
    assert len(sources) == 1, "certify-a-store.md shows the store in exactly one block"
    return sources[0]


def _shown_after(page: str, command: str) -> str:
    """The output the page shows for `command`: the marked text block after the console block
    holding it."""
    blocks = _blocks(page)
    for i, (language, text, _) in enumerate(blocks):
        if language == "console" and command in text and i + 1 < len(blocks):
            assert blocks[i + 1][2], f"no output shown for {command!r}"
            return blocks[i + 1][1]
    raise AssertionError(f"{page} does not show {command!r}")


def _run(tmp_path: Path, *argv: str) -> str:
    (tmp_path / f"{STORE_MODULE}.py").write_text(_store_source())
    finished = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished.stdout


def _table(text: str) -> list[list[str]]:
    """The capability table of a conformance report, without the timing column."""
    rows = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 6 and cells[1].isdigit():
            rows.append(cells[:5])
    return rows


def test_the_store_passes_the_command_line_kit(tmp_path: Path) -> None:
    command = f"python -m runfold.conformance {STORE_MODULE}:TestDictStore"
    printed = _run(tmp_path, *command.split()[1:])
    shown = _shown_after("certify-a-store.md", command)
    assert _table(printed) == _table(shown) != []
    assert printed.rstrip().endswith("PASSED") and shown.rstrip().endswith("PASSED")


def test_the_store_passes_the_kit_under_pytest(tmp_path: Path) -> None:
    command = f"pytest {STORE_MODULE}.py"
    printed = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{STORE_MODULE}.py")
    shown = _shown_after("certify-a-store.md", command)
    summary = re.search(r"^(\d+ passed, \d+ skipped)", shown, re.MULTILINE)
    assert summary is not None, shown
    assert summary.group(1) in printed, printed


def test_what_without_retention_takes_away() -> None:
    """The page says which checks `--without retention` reports as not offered."""
    page = (TUTORIALS / "certify-a-store.md").read_text()
    assert "--without retention" in page
    assert "The five retention checks" in page and "`test_feed_never_reuses_a_position`" in page
    needing = {c.name for c in CHECKS if "retention" in c.requires}
    in_group = {c.name for c in CHECKS if c.capability == "retention"}
    assert len(in_group) == 5 and in_group <= needing
    assert needing - in_group == {"test_feed_never_reuses_a_position"}


def test_the_page_counts_the_checks_right() -> None:
    words = " ".join((TUTORIALS / "certify-a-store.md").read_text().split())
    assert f"runs the same {len(CHECK_NAMES)} checks" in words
