"""Every Python example in the README and docs/ runs, and the error reference is complete."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from runfold.engine import errors as engine_errors
from runfold.kernel import errors

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _examples() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        for number, match in enumerate(_BLOCK.finditer(document.read_text()), start=1):
            found.append((f"{document.relative_to(ROOT)}#{number}", match.group(1)))
    return found


EXAMPLES = _examples()


def test_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize(("where", "source"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_runs(where: str, source: str) -> None:
    exec(compile(source, where, "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("module", [errors, engine_errors], ids=["kernel", "engine"])
def test_error_reference_lists_every_error_class(module: ModuleType) -> None:
    reference = (ROOT / "docs" / "errors.md").read_text()
    for name in module.__all__:
        cls = getattr(module, name)
        row = re.search(rf"^\| `{name}` \| `(\w+)` \| `(\w+)` \| (\d+) \|", reference, re.M)
        assert row is not None, f"{name} is missing from docs/errors.md"
        assert row.group(1) == cls.__mro__[1].__name__, name
        assert row.group(2) == cls.code, name
        assert int(row.group(3)) == cls.status, name


# Scripts only: library modules live in subfolders (docs/examples/thirdparty/ holds a store that
# tests/test_conformance.py imports).
SCRIPTS = sorted((ROOT / "docs" / "examples").glob("*.py"))


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
