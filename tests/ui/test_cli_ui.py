"""`runfold ui`: the web inspector from the command line, in real subprocesses."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from tests.support.cli_support import ok, one_line_error, run_ids, runfold_cli
from tests.support.ui_support import free_port, get


def test_runfold_ui_serves_the_store_it_is_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    ok(runfold_cli("demo", "--store", url))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runfold", "ui", "--store", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body, _ = get(base + "/")
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None and time.monotonic() < deadline, "it did not start"
                time.sleep(0.05)
        assert status == 200
        assert "order-fulfilment" in body and "completed" in body
        [run_id] = run_ids(url)
        status, page, _ = get(f"{base}/runs/{run_id}")
        assert status == 200
        assert f'data-details="/runs/{run_id}/details"' in page
        status, page, _ = get(f"{base}/runs/{run_id}/details")  # what the page then fetches
        assert status == 200
        timeline = page[
            page.index('<svg id="timeline"') : page.index("</svg>", page.index('id="timeline"'))
        ]
        assert "reserve-stock" in timeline and "charge-card" in timeline  # a row per step
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}/" in out.decode()


def test_runfold_ui_on_a_missing_file_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    line = one_line_error(runfold_cli("ui", "--store", f"sqlite:///{missing}"), 4)
    assert "cannot open" in line
    assert not missing.exists()
