"""Shell completion of run ids and workflow names, asked of the real `runfold` through click's
completion protocol (the environment variables bash's completion script sets), in a subprocess
over a SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import CreateRun, StartRun
from runfold.stores import SQLiteStore
from tests.support.cli_support import runfold_cli


async def _populate(path: Path) -> None:
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        for run_id, workflow in (
            ("order-1", "shop"),
            ("order-2", "shop"),
            ("refund-1", "refunds"),
        ):
            create = CreateRun(workflow_name=workflow, input=b"{}")
            await handler.execute(run_id, StartRun(create=create))


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("completion") / "runs.db"
    asyncio.run(_populate(path))
    return f"sqlite:///{path}"


def _complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash would be offered for the last word of `words` (its `bash_complete` protocol:
    one `type,value` line per candidate)."""
    parts = words.split(" ")
    done = runfold_cli(
        env={
            "_RUNFOLD_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(parts) - 1),
            **(env or {}),
        }
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return [line.partition(",")[2] for line in done.stdout.splitlines() if line]


def test_run_ids_complete_from_the_store(store_url: str) -> None:
    assert _complete(f"runfold show --store {store_url} ord") == ["order-2", "order-1"]
    assert _complete(f"runfold --store {store_url} history ref") == ["refund-1"]
    assert _complete("runfold cancel o", env={"RUNFOLD_STORE": store_url}) == [
        "order-2",
        "order-1",
    ]
    assert _complete(f"runfold send --store {store_url} x") == []


def test_workflow_names_complete_from_the_store(store_url: str) -> None:
    assert _complete(f"runfold runs --store {store_url} --workflow ") == ["refunds", "shop"]
    assert _complete(f"runfold runs --store {store_url} --workflow s") == ["shop"]


def test_a_store_that_cannot_be_read_offers_nothing(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert _complete(f"runfold show --store {missing} o") == []
    assert not (tmp_path / "none.db").exists()
    assert _complete("runfold show --store postgresql://nobody@127.0.0.1:1/x o") == []


def test_command_names_complete() -> None:
    assert _complete("runfold se") == ["send"]
