"""Refresh the web inspector's screenshots in docs/assets/ui/ from a fresh demo store.

Usage: .venv/bin/python scripts/ui-screenshots.py  (needs the dev extras and /usr/bin/chromium;
`bash scripts/ensure-chromium.sh` installs it). Runs `runfold demo` twice on a temporary file,
serves it with `python -m runfold.ui` and photographs the runs page and the newest run's page.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.ui_support import CHROMIUM, serve

OUT = Path(__file__).resolve().parent.parent / "docs" / "assets" / "ui"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/runfold.db"
        for _ in range(3):
            subprocess.run(
                [sys.executable, "-m", "runfold", "--store", url, "demo"],
                check=True,
                capture_output=True,
            )
        for base in serve(url):
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1200, "height": 330})
                page.goto(base + "/")
                page.screenshot(path=str(OUT / "runs.png"))
                page.locator("table.runs td.id > a").first.click()
                page.wait_for_selector("svg#timeline")
                page.set_viewport_size({"width": 1200, "height": 1000})
                page.screenshot(path=str(OUT / "run.png"))
                browser.close()


if __name__ == "__main__":
    main()
