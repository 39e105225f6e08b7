"""`runfold worker` stopped while it starts: SIGTERM or Ctrl-C before it serves is a graceful
stop (exit 0, nothing claimed), as it is once it serves; a supervisor that stops a worker a
moment after starting it sees no failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_RUNFOLD = Path(sys.executable).with_name("runfold")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_the_app_imports_exits_0(tmp_path: Path, signum: signal.Signals) -> None:
    mark = tmp_path / "importing"
    env = {**os.environ, "RUNFOLD_SLOW_START_MARK": str(mark), "RUNFOLD_SLOW_START_SECONDS": "2"}
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    command = [str(_RUNFOLD), "worker", "--app", "tests.support.slow_start_app", "--store", store]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():  # the worker is importing the application
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() < deadline, "the worker never imported the application"
            time.sleep(0.02)
        process.send_signal(signum)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill() if process.poll() is None else None
    text = output.decode()
    assert process.returncode == 0, text
    assert "Traceback" not in text, text
    assert "stopped: WorkerCounts(drives=0," in text, text  # it claimed nothing
