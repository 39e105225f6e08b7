"""The package as users install it: what importing loads, what is missing without an extra, and
the metadata a package index shows. Imports run in fresh subprocesses; a missing extra is made
by putting a package that cannot be imported first on the path."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tomllib
from importlib.metadata import metadata
from pathlib import Path

import pytest

from tests.support.cli_support import ROOT, one_line_error

DRIVERS = ("sqlite3", "_sqlite3", "aiosqlite", "psycopg", "psycopg_pool")


def python(
    *args: str, missing: tuple[str, ...] = (), tmp_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` with the repository on the path and the packages `missing` not importable."""
    path = [str(ROOT)]
    if missing:
        assert tmp_path is not None
        for name in missing:
            shadow = tmp_path / "shadow" / name
            shadow.mkdir(parents=True, exist_ok=True)
            (shadow / "__init__.py").write_text(
                f'raise ModuleNotFoundError("No module named {name}", name={name!r})\n'
            )
        path.insert(0, str(tmp_path / "shadow"))
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("module", ["runfold.kernel", "runfold", "runfold.handler"])
def test_importing_loads_no_store_driver(module: str) -> None:
    done = python(
        "-c",
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted(set(sys.modules) & set({list(DRIVERS)!r}))))",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_sqlite_store_is_there_on_first_use() -> None:
    done = python(
        "-c", "import runfold.stores as s, sys; s.SQLiteStore; print('aiosqlite' in sys.modules)"
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_the_kit_without_its_extra_says_so_in_one_line(tmp_path: Path) -> None:
    done = python("-m", "runfold.conformance", "x:y", missing=("hypothesis",), tmp_path=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "runfold.conformance: error: runfold.conformance needs its extra: pip install "
        "'runfold[conformance]' (hypothesis is missing)"
    ]
    via_cli = python(
        "-m", "runfold", "conformance", "x:y", missing=("hypothesis",), tmp_path=tmp_path
    )
    assert "pip install 'runfold[conformance]'" in one_line_error(via_cli, 2)


def test_a_postgresql_store_without_the_driver_names_the_extra(tmp_path: Path) -> None:
    done = python(
        "-m",
        "runfold",
        "--store",
        "postgresql://app:pw-not-shown@127.0.0.1/app",
        "runs",
        missing=("psycopg",),
        tmp_path=tmp_path,
    )
    line = one_line_error(done, 4)
    assert "pip install 'runfold[postgres]'" in line and "runfold[postgres-binary]" in line
    assert "pw-not-shown" not in done.stdout + done.stderr


def test_the_metadata_a_package_index_shows() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert set(extras) == {"postgres", "postgres-binary", "conformance", "otel", "ui"}  # no dev
    assert not any("[binary]" in requirement for requirement in extras["postgres"])
    assert any(r.startswith("psycopg[binary]") for r in extras["postgres-binary"])
    assert {"test", "lint", "docs", "bench", "dev"} <= set(project["dependency-groups"])
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    installed = metadata("runfold")
    assert installed["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in installed.get_all("Classifier", [])
    urls = dict(url.split(", ", 1) for url in installed.get_all("Project-URL", []))
    assert {"Repository", "Documentation", "Changelog"} <= set(urls)
    assert "event-sourcing" in (installed["Keywords"] or "")


def test_the_sdist_ships_the_package_and_no_tests(tmp_path: Path) -> None:
    """Tests need the whole repository (conftest.py, helpers, docs/, a PostgreSQL server): an
    sdist that shipped some of them would ship tests that cannot run."""
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=source,
        capture_output=True,
        check=True,
        timeout=300,
    )
    [sdist] = tmp_path.glob("runfold-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    assert {"README.md", "LICENSE", "runfold/__init__.py", "runfold/ui/templates/run.html"} <= names
    assert not [name for name in names if name.startswith(("tests/", "docs/", "benchmarks/"))]
