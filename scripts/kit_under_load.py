"""Run the whole conformance kit on every bundled store, again and again, while CPU-bound
processes hog the cores: a kit check that assumes something about timing fails here.

    python scripts/kit_under_load.py [--rounds 10] [--hogs 2] [--limit 3600]

Each hog is a busy loop that ends by itself after `--limit` seconds and is killed when the run
ends, however it ends. Prints one line per round and exits non-zero if any round failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = [
    "tests/stores/test_conformance.py::TestMemoryStore",
    "tests/stores/test_conformance.py::TestSQLiteFile",
    "tests/stores/test_conformance.py::TestSQLiteInMemory",
    "tests/stores/test_conformance.py::TestPostgresStore",
]
"""The kit on each bundled store (and nothing else of the test module)."""

HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds a hog lives at most")
    args = parser.parse_args()
    hogs = [
        subprocess.Popen([sys.executable, "-c", HOG.format(limit=args.limit)])
        for _ in range(args.hogs)
    ]
    failed = 0
    try:
        for number in range(1, args.rounds + 1):
            started = time.monotonic()
            finished = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-o",
                    "addopts=-p no:cacheprovider",
                    "-q",
                    *SUITES,
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "CI": "true"},  # no PostgreSQL server is a failure here
            )
            lines = finished.stdout.strip().splitlines()
            summary = lines[-1] if lines else finished.stderr.strip()[-200:]
            print(f"round {number}: {time.monotonic() - started:.0f} s: {summary}", flush=True)
            if finished.returncode != 0:
                failed += 1
                print(finished.stdout[-5000:], flush=True)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    print(f"{failed} of {args.rounds} rounds failed with {args.hogs} hogs", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
