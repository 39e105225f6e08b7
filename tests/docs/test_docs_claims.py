"""What the docs say runfold has is what the code has: every public package is on the reference
index, the versioning page and in the README; every extra is in both install lists; the counts
the pages give are the code's; and statements that stopped being true stay gone."""

from __future__ import annotations

import importlib
import pkgutil
import re
import tomllib
from pathlib import Path

import pytest

import runfold
from runfold.conformance import CHECK_NAMES
from runfold.kernel import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _public_modules() -> list[str]:
    """Every `runfold.X` a user may import: not underscored, not a `__main__`."""
    return sorted(
        f"runfold.{found.name}"
        for found in pkgutil.iter_modules(runfold.__path__)
        if not found.name.startswith("_")
    )


PUBLIC = _public_modules()
EXTRAS = sorted(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)


def _reexported(module: str) -> bool:
    """A module whose every public name `runfold` re-exports (`runfold.handler`)."""
    names = set(getattr(importlib.import_module(module), "__all__", ()))
    return bool(names) and names <= set(runfold.__all__)


def test_the_public_modules_are_found() -> None:
    assert {"runfold.kernel", "runfold.flow", "runfold.ui", "runfold.otel"} <= set(PUBLIC)
    assert {"ui", "otel", "conformance", "postgres"} <= set(EXTRAS)


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_package_is_on_the_reference_index(module: str) -> None:
    index = (DOCS / "reference" / "index.md").read_text()
    page = module.partition(".")[2]
    on_a_page = f"]({page}.md)" in index
    assert f"`{module}`" in index or on_a_page, f"{module} is missing from reference/index.md"
    if not _reexported(module):
        packages = index.split("## Public packages")[1]
        assert f"| `{module}` |" in packages, f"{module} is not in the public packages table"


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_package_is_on_the_versioning_page_and_in_the_readme(module: str) -> None:
    if _reexported(module):
        return  # public as `runfold`'s names
    assert f"`{module}`" in (DOCS / "versioning.md").read_text(), module
    assert f"`{module}`" in (ROOT / "README.md").read_text(), module


@pytest.mark.parametrize("extra", EXTRAS)
def test_every_extra_is_in_both_install_lists(extra: str) -> None:
    for page in (ROOT / "README.md", DOCS / "index.md"):
        assert re.search(rf"pip install ['\"]runfold\[{extra}\]['\"]", page.read_text()), (
            f"{page.name} does not show how to install the {extra} extra"
        )
    assert f"`{extra}`" in (DOCS / "versioning.md").read_text()


def test_every_tutorial_and_how_to_is_linked_from_the_home_page() -> None:
    home = (DOCS / "index.md").read_text()
    for page in sorted([*DOCS.glob("tutorials/*.md"), *DOCS.glob("how-to/*.md")]):
        assert f"({page.relative_to(DOCS)})" in home, f"docs/index.md does not link {page.name}"


def _words(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_the_counts_the_pages_give_are_the_codes() -> None:
    comparison = _words(DOCS / "comparison.md")
    assert f"({len(CHECK_NAMES)} named checks," in comparison
    assert f"({len(EVENT_TYPES)} event types)" in comparison
    counts = re.findall(r"(\d+) named checks", " ".join(_words(p) for p in DOCS.rglob("*.md")))
    assert set(counts) == {str(len(CHECK_NAMES))}, counts


@pytest.mark.parametrize(
    "stale",
    [
        "no UI",
        "No UI.",
        "no workflow language",
        "No workflow language",
        "leaves running the code to you",
        "has no read-only mode",
        "no worker fleet",
        "No scheduler or worker fleet",
    ],
)
def test_statements_that_stopped_being_true_stay_gone(stale: str) -> None:
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        assert stale not in _words(page), f"{page.relative_to(ROOT)} still says {stale!r}"
