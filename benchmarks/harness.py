"""Timing and reporting shared by every benchmark: repeat, take the median and the spread."""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["Measurement", "Result", "machine_lines", "measure"]


@attrs.frozen(kw_only=True)
class Measurement:
    """Median and spread (min, max) of a rate, over `repeats` runs."""

    median: float
    low: float
    high: float
    repeats: int

    def spread_percent(self) -> float:
        return 100.0 * (self.high - self.low) / self.median if self.median else 0.0


@attrs.frozen(kw_only=True)
class Result:
    """One table row: what was measured, on what, the rate, and its ratio to the anchor."""

    benchmark: str
    case: str
    unit: str
    value: Measurement
    anchor: str | None = None
    ratio: float | None = None
    note: str = ""


def measure(work: Callable[[], Any], *, units: float, repeats: int, warmup: int = 1) -> Measurement:
    """Run `work` `warmup + repeats` times; rates are `units / seconds` of each timed run."""
    for _ in range(warmup):
        work()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        elapsed = time.perf_counter() - start
        rates.append(units / elapsed)
    return Measurement(
        median=statistics.median(rates), low=min(rates), high=max(rates), repeats=repeats
    )


def machine_lines() -> list[str]:
    """The machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores",
        f"- Python {sys.version.split()[0]} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- SQLite {sqlite3.sqlite_version}",
    ]
