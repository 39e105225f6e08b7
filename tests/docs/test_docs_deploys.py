"""docs/how-to/deploy-new-workflow-code.md works as written: its application is written to a
folder beside a SQLite store holding runs recorded on version 1, every `$ runfold …` command of
its console blocks runs there in order and prints what the page shows, and its CI test passes
on the export those commands wrote. (Its Python programs run in tests/docs/test_docs.py.)"""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runfold.flow import Flow, Workflow, definition
from runfold.stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "how-to" / "deploy-new-workflow-code.md").read_text()
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PATCH_LINE = '    if await patched("fraud-check"):\n        done.append'


def _blocks(language: str) -> list[str]:
    return [text for lang, text in _FENCE.findall(PAGE) if lang == language]


def _application() -> str:
    found = [b for b in _blocks("python") if b.startswith("# shop.py")]
    assert len(found) == 1, "the page shows shop.py in one block"
    assert PATCH_LINE in found[0]
    return found[0]


def _commands() -> list[tuple[str, str]]:
    """Each `$ ` command of the console blocks with the lines the page shows after it."""
    found: list[tuple[str, list[str]]] = []
    for block in _blocks("console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                found[-1][1].append(line)
    return [(command, "".join(f"{line}\n" for line in shown)) for command, shown in found]


def _workflow(source: str) -> Workflow:
    namespace: dict[str, Any] = {"__name__": "shop"}  # one origin, as the module would have
    exec(compile(source, "shop", "exec"), namespace)
    found: Workflow = namespace["order"]
    return found


async def _record_version_1(folder: Path) -> None:
    version_1 = _workflow(_application().replace(PATCH_LINE, "    if False:\n        done.append"))
    store = await SQLiteStore.open(folder / "shop.db")
    try:
        earlier = datetime.now(UTC) - timedelta(hours=2)
        flow = Flow(store, [version_1], clock=lambda: earlier, version="1")
        for n in (1, 2, 3):
            await flow.start(version_1, f"A-{n}", run_id=f"order-{n}")
            earlier += timedelta(seconds=1)
        await Flow(store, [version_1]).run_until_idle()
    finally:
        await store.close()


def test_the_how_to_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its `shop-order` is registered here from the folder's shop.py; tests/docs/test_docs.py runs
    # the page's block of it as another module, which may have registered the name first:
    # this test works on a registry without it, and the registry is restored afterwards.
    others = {k: v for k, v in definition._REGISTRY.items() if k != "shop-order"}
    monkeypatch.setattr(definition, "_REGISTRY", others)
    (tmp_path / "shop.py").write_text(_application())
    (tmp_path / "shop_unpatched.py").write_text(
        _application().replace(PATCH_LINE, "    done.append")
    )
    asyncio.run(_record_version_1(tmp_path))
    commands = _commands()
    assert len(commands) >= 6
    for command, shown in commands:
        argv = shlex.split(command)
        assert argv[0] == "runfold"
        done = subprocess.run(
            [sys.executable, "-m", "runfold", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tmp_path,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        diverges = "shop_unpatched" in command
        assert done.returncode == (1 if diverges else 0), (command, done.stderr)
        assert done.stdout == shown, command

    # The drain: the workers serve until SIGTERM and exit 0, the listings answer.
    for line in "".join(_blocks("sh")).splitlines():
        argv = shlex.split(line, comments=True)
        if not argv or argv[0] != "runfold":
            continue
        program = [sys.executable, "-m", "runfold", *argv[1:]]
        environment = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
        if argv[1] == "worker":
            with subprocess.Popen(
                program,
                cwd=tmp_path,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ) as process:
                assert process.stdout is not None and process.stderr is not None
                assert process.stdout.readline().startswith("serving shop-order, runs of version")
                while "serving [" not in process.stderr.readline():  # its lease taken: serving
                    pass
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=60) == 0, line
        else:
            listed = subprocess.run(
                program, cwd=tmp_path, env=environment, capture_output=True, check=False
            )
            assert listed.returncode == 0, (line, listed.stderr)

    # The CI test the page shows, on the export the commands wrote.
    (ci,) = [b for b in _blocks("python") if "def test_the_deploy" in b]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "shop", None)
    monkeypatch.delitem(sys.modules, "shop")  # restored (absent) afterwards
    namespace: dict[str, Any] = {"__name__": "ci"}
    exec(compile(ci, "ci", "exec"), namespace)
    namespace["test_the_deploy_replays_every_recorded_run"]()
    assert len((tmp_path / "histories.jsonl").read_text().splitlines()) == 3
    assert len((tmp_path / "two.jsonl").read_text().splitlines()) == 2
