"""What reaches an operator's terminal: the real `runfold` in a subprocess on a pseudo-terminal
(python's `pty`), against a store whose every printed field holds escape sequences, every C0
and C1 control character and rich markup. The bytes the terminal receives carry no control
but rich's own colours and line ends, no markup is acted on, and nothing crashes; deep and huge
payloads are summarised in text and JSON alike.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import shlex
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import (
    CancelRun,
    CompleteStep,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    FailRun,
    ReceiveHook,
    RecordProgress,
    RequestCancel,
    RetryStep,
    StartRun,
    StartStep,
)
from runfold.stores import SQLiteStore
from tests.support.cli_support import ROOT, ok, runfold_cli

CONTROLS = "".join(chr(c) for c in [*range(1, 32), 127, *range(0x80, 0xA0)])
"""Every C0 and C1 control character (NUL aside: SQLite text cannot hold it)."""
SEQUENCES = "\x1b]0;PWNED-TITLE\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[31m\x9b2J\u202e"
"""Set the window title, write the clipboard (OSC 52), clear the screen (CSI and C1 CSI),
turn text red, reverse the text's direction."""
MARKUP = "[/][link=https://evil.example]click[/link][bold red]loud"
"""Rich markup: a closing tag with nothing to close (a crash), a hidden hyperlink, a style."""
FREE = "x" + CONTROLS + SEQUENCES + MARKUP
"""For free text (payloads, attribute values, messages, reasons, errors)."""
ID = "id" + MARKUP
"""For ids and names: the kernel refuses control characters in them, not markup."""
RUN = "run" + ID
DEEP = ("[" * 5000 + "]" * 5000).encode()
HUGE = json.dumps({"blob": "y" * 1_500_000}).encode()


async def _hostile_store(path: Path) -> None:
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store)
    evil = FREE.encode()
    try:
        create = CreateRun(workflow_name="wf" + ID, input=evil, attributes={"k" + ID: "v" + FREE})
        await handler.execute(RUN, StartRun(create=create))
        for step in ("step" + ID, "retried" + ID):
            await handler.execute(RUN, CreateStep(step_id=step, step_name="n" + ID, input=evil))
            await handler.execute(RUN, StartStep(step_id=step))
        await handler.execute(RUN, CompleteStep(step_id="step" + ID, output=evil))
        later = datetime.now(UTC) + timedelta(days=1)
        await handler.execute(RUN, RetryStep(step_id="retried" + ID, error=evil, retry_after=later))
        await handler.execute(RUN, RecordProgress(progress_id="p" + ID, completed=1, message=FREE))
        await handler.execute(RUN, CreateHook(hook_id="hook" + ID, token="token-" + ID))
        await handler.execute(RUN, ReceiveHook(hook_id="hook" + ID, payload=evil))
        await handler.execute(RUN, CreateWait(wait_id="wait" + ID, resume_at=later))
        await handler.execute(RUN, RequestCancel(reason="asked" + FREE))
        await handler.execute(RUN, CancelRun(reason="done" + FREE))
        await handler.execute("deep", StartRun(create=CreateRun(workflow_name="wf", input=DEEP)))
        await handler.execute("deep", FailRun(error=evil, error_code="code" + ID))
        await handler.execute("huge", StartRun(create=CreateRun(workflow_name="wf", input=HUGE)))
        await handler.execute("live", StartRun(create=CreateRun(workflow_name="wf", input=b"{}")))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hostile") / "runs.db"
    asyncio.run(_hostile_store(path))
    with sqlite3.connect(path) as db:  # an index row written past the kernel: verify says so
        db.execute("UPDATE runs SET workflow_name = ? WHERE run_id = 'deep'", ("w" + FREE,))
    return f"sqlite:///{path}"


RUNFOLD = Path(sys.executable).with_name("runfold")


def on_a_terminal(*args: str, columns: int = 2000) -> tuple[int, bytes]:
    """Run the installed `runfold ARGS` with stdout and stderr on a pseudo-terminal `columns`
    wide, colour on; its exit code and every byte the terminal received."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environment = {k: v for k, v in os.environ.items() if k not in ("RUNFOLD_STORE", "NO_COLOR")}
    environment.update({"TERM": "xterm-256color", "PYTHONPATH": str(ROOT)})
    environment.pop("COLUMNS", None)
    with subprocess.Popen(
        [str(RUNFOLD), *args], stdin=slave, stdout=slave, stderr=slave, env=environment, cwd=ROOT
    ) as process:
        os.close(slave)
        received = bytearray()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            received += chunk
        os.close(master)
        code = process.wait(timeout=30)
    return code, bytes(received)


_RICH_OWN = re.compile(rb"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\x1b\[2K|\x1b\[[0-9]*A")
"""What rich itself sends: SGR colours and styles, and for the progress bar, hiding and showing
the cursor, erasing its line and moving up to redraw it. Never a title, a clipboard write, a
hyperlink, a screen clear."""


def inert_bytes(received: bytes) -> str:
    """The text the terminal shows, after checking that the only control bytes are line ends
    and rich's own codes (`_RICH_OWN`), which are taken out."""
    plain = _RICH_OWN.sub(b"", received)
    controls = sorted({chr(b) for b in plain if b < 32 or b == 127} - {"\r", "\n"})
    assert not controls, f"control bytes reached the terminal: {controls!r}"
    text = plain.decode()  # must be UTF-8: no lone surrogate made it out
    unsafe = sorted({c for c in text if 0x80 <= ord(c) < 0xA0 or c in "\u202e\u2028\u2029"})
    assert not unsafe, f"C1 controls or bidi overrides reached the terminal: {unsafe!r}"
    assert "Traceback" not in text, text
    return text.replace("\r\n", "\n")


@pytest.mark.parametrize(
    ("args", "shows"),
    [
        (["runs"], [RUN, "wf" + ID, "w" + "x\\x01"]),
        (["show", RUN], [RUN, "step" + ID, "wait" + ID, "hook" + ID, "p" + ID, "k" + ID, "\\x1b"]),
        (["history", RUN], [RUN and "step" + ID, "\\x1b]0;PWNED-TITLE\\x07", "\\x9b2J"]),
        (["show", "deep"], ["code" + ID, "\\x1b]0;PWNED-TIT"]),
        (["history", "deep"], ["code" + ID]),
        (["verify"], ["deep", "summary differs in workflow_name"]),
        (["show", "huge"], ["huge"]),
    ],
)
def test_stored_text_reaches_a_terminal_inert(
    hostile: str, args: list[str], shows: list[str]
) -> None:
    code, received = on_a_terminal("--store", hostile, *args)
    text = inert_bytes(received)
    assert code in (0, 1), text  # verify finds the damaged row: 1
    for expected in shows:
        assert expected in text, (expected, text[:2000])
    assert len(text) < 200_000  # the huge payload is previewed, not printed


@pytest.mark.parametrize(
    "args",
    [
        ["show", "\x1b]0;PWNED\x07" + MARKUP],
        ["history", "\x9b2J" + MARKUP],
        ["runs", "--cursor", "\x1b]52;c;eA==\x07" + MARKUP],
        ["runs", "--status", "\x1b[2J"],
        ["cancel", "live", "--reason", "\x1b]0;PWNED\x07" + MARKUP],
        ["--store", "sqlite:///\x1b]0;PWNED\x07.db", "runs"],
    ],
)
def test_errors_and_echoed_arguments_reach_a_terminal_inert(hostile: str, args: list[str]) -> None:
    code, received = on_a_terminal("--store", hostile, *args)
    inert_bytes(received)
    assert code in (0, 2, 3, 4)


@pytest.mark.parametrize("command", ["show", "history"])
def test_deep_and_huge_payloads_are_json_too(hostile: str, command: str) -> None:
    deep = json.loads(ok(runfold_cli("--store", hostile, command, "deep", "--json")))
    huge = json.loads(ok(runfold_cli("--store", hostile, command, "huge", "--json")))
    if command == "history":
        deep, huge = deep[0]["event"], huge[0]["event"]
    assert deep["input"] == {"text": DEEP.decode()}  # too deep to nest: given as its text
    assert huge["input"]["json"]["blob"] == "y" * 1_500_000  # large, but whole and nested


def test_json_output_holds_the_stored_text_escaped(hostile: str) -> None:
    out = ok(runfold_cli("--store", hostile, "show", RUN, "--json"))
    assert not re.search("[\x00-\x1f\x7f-\x9f\u202e]", out.replace("\n", ""))
    shown = json.loads(out)
    assert shown["run_id"] == RUN
    assert shown["attributes"] == {"k" + ID: "v" + FREE}  # the same value, decoded
    assert shown["progress"]["p" + ID]["message"] == FREE


LONG_IDS = [f"order_{n}_" + "0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a" for n in range(3)]


async def _long_ids(path: Path) -> None:
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store)
    try:
        for run_id in LONG_IDS:
            create = CreateRun(workflow_name="order-fulfilment", input=b"")
            await handler.execute(run_id, StartRun(create=create))
            await handler.execute(run_id, CreateStep(step_id=run_id, step_name="n", input=b""))
    finally:
        await store.close()


@pytest.mark.parametrize("columns", [80, 40])
def test_ids_are_never_cut_on_a_narrow_terminal(tmp_path: Path, columns: int) -> None:
    path = tmp_path / "runs.db"
    asyncio.run(_long_ids(path))
    url = f"sqlite:///{path}"
    code, received = on_a_terminal("--store", url, "runs", columns=columns)
    listed = inert_bytes(received)
    assert code == 0
    for run_id in LONG_IDS:
        assert run_id in listed, listed
    assert "…" not in listed and "order-fulfilment" in listed and "running" in listed
    code, received = on_a_terminal("--store", url, "show", LONG_IDS[0], columns=columns)
    assert code == 0 and f"\n  n #{LONG_IDS[0]}  " in inert_bytes(received)  # the step's row


def test_the_next_page_command_keeps_the_store(hostile: str) -> None:
    for args in (["--store", hostile, "runs"], ["runs", "--store", hostile]):
        first = ok(runfold_cli(*args, "--limit", "1")).splitlines()
        [hint] = [line for line in first if line.startswith("more: ")]
        again = shlex.split(hint.removeprefix("more: "))
        assert again[:2] == ["runfold", "runs"] and "--store" in again
        second = ok(runfold_cli(*again[1:])).splitlines()
        assert second[1] != first[1]  # the next run, from the same store
    from_environment = ok(runfold_cli("runs", "--limit", "1", env={"RUNFOLD_STORE": hostile}))
    assert "--store" not in from_environment  # the next command has the variable too
