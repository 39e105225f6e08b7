"""Timing and the result model every benchmark shares: contenders take turns, each timed run
gives one sample, and a row reports the median, the spread and its ratios to named anchors."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

import attrs

from runfold import EventStore

__all__ = [
    "Comparison",
    "Measurement",
    "Remark",
    "Result",
    "Rows",
    "StepClock",
    "Target",
    "Trial",
    "compare",
    "cpu_model",
    "event_loop",
    "interleaved",
    "measure",
    "opened",
    "percentiles",
    "timed_rounds",
]


@attrs.frozen(kw_only=True)
class Measurement:
    """Median and spread (min, max) of a quantity over `repeats` timed runs."""

    median: float
    low: float
    high: float
    repeats: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Measurement:
        return cls(
            median=statistics.median(samples),
            low=min(samples),
            high=max(samples),
            repeats=len(samples),
        )

    def spread_percent(self) -> float:
        """Half the range, as a percentage of the median: the "±" of the tables."""
        return 50.0 * (self.high - self.low) / self.median if self.median else 0.0


@attrs.frozen(kw_only=True)
class Target:
    """A goal from issue #7: a ratio that must be at least (or at most) `bound`."""

    goal: str
    bound: float
    at_most: bool = False

    def met(self, ratio: float) -> bool:
        return ratio <= self.bound if self.at_most else ratio >= self.bound

    def worst(self, ratios: Sequence[float]) -> float:
        return max(ratios) if self.at_most else min(ratios)


@attrs.frozen(kw_only=True)
class Comparison:
    """A row's median divided by its anchor's median (measured in the same run)."""

    anchor: str
    ratio: float
    target: Target | None = None


def compare(
    value: Measurement, anchor: str, reference: Measurement | None, target: Target | None = None
) -> tuple[Comparison, ...]:
    """One comparison, or none when the anchor was not measured (a peer not installed)."""
    if reference is None or not reference.median:
        return ()
    return (Comparison(anchor=anchor, ratio=value.median / reference.median, target=target),)


@attrs.frozen(kw_only=True)
class Result:
    """One table row: what was measured (`case`), on what (`on`), and how it compares."""

    group: str
    case: str
    on: str
    unit: str
    value: Measurement
    comparisons: tuple[Comparison, ...] = ()
    note: str = ""
    lower_is_better: bool = False


@attrs.frozen
class Rows:
    """The rows of one group measured on one thing: `Result`s sharing `group` and `on`."""

    group: str
    on: str

    def __call__(
        self,
        case: str,
        unit: str,
        value: Measurement,
        comparisons: tuple[Comparison, ...] = (),
        *,
        lower_is_better: bool = False,
    ) -> Result:
        """The row of `case`: `value` in `unit`, with its `comparisons`."""
        return Result(
            group=self.group,
            case=case,
            on=self.on,
            unit=unit,
            value=value,
            comparisons=comparisons,
            lower_is_better=lower_is_better,
        )


@attrs.frozen(kw_only=True)
class Remark:
    """A sentence printed under a group's table: what was not measured, and why."""

    group: str
    text: str


@attrs.frozen(kw_only=True)
class Trial:
    """A contender: `prepare` runs untimed before each timed `run` (fresh runs, warm caches)."""

    run: Callable[[], object]
    prepare: Callable[[], object] = attrs.field(default=lambda: None)


def timed_rounds(
    contenders: Mapping[str, Trial], *, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds of each contender's timed runs. Contenders take turns, one run each per round,
    so that a machine busy with other work slows them alike; warm-up rounds are not kept."""
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for round_number in range(warmup + repeats):
        for name, trial in contenders.items():
            trial.prepare()
            start = time.perf_counter()
            trial.run()
            elapsed = time.perf_counter() - start
            if round_number >= warmup:
                seconds[name].append(elapsed)
    return seconds


def interleaved(
    contenders: Mapping[str, Trial | Callable[[], object]],
    *,
    units: float,
    repeats: int,
    warmup: int = 1,
) -> dict[str, Measurement]:
    """Rates (`units` per second) of contenders timed in turns (see `timed_rounds`)."""
    trials = {
        name: work if isinstance(work, Trial) else Trial(run=work)
        for name, work in contenders.items()
    }
    found = timed_rounds(trials, repeats=repeats, warmup=warmup)
    return {name: Measurement.of([units / s for s in seconds]) for name, seconds in found.items()}


def measure(
    work: Trial | Callable[[], object], *, units: float, repeats: int, warmup: int = 1
) -> Measurement:
    """The rate of one contender: `units` per second of each timed run."""
    return interleaved({"": work}, units=units, repeats=repeats, warmup=warmup)[""]


def percentiles(samples: Sequence[float], wanted: Sequence[int]) -> dict[int, float]:
    """The `wanted` percentiles of `samples` (at least two), e.g. {50: …, 95: …, 99: …}."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {p: cuts[p - 1] for p in wanted}


class StepClock:
    """Stamps taken inside step bodies, so one definition of step latency serves every engine:
    the time from a step body's entry to the next one's (or to the workflow's return), i.e.
    running the body plus making its outcome durable and scheduling what follows."""

    def __init__(self) -> None:
        self._stamps: list[float] = []
        self.rounds: list[list[float]] = []
        """The step latencies of each round, in seconds."""

    def new_round(self) -> None:
        self.rounds.append([])

    def begin(self) -> None:
        """A workflow is about to start."""
        self._stamps = []

    def step(self) -> None:
        """A step body was entered."""
        self._stamps.append(time.perf_counter())

    def end(self) -> None:
        """The workflow returned: its step latencies join the round's."""
        stamps = [*self._stamps, time.perf_counter()]
        self.rounds[-1] += [later - earlier for earlier, later in itertools.pairwise(stamps)]


@contextlib.contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop for a benchmark's async work, closed afterwards."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


@contextlib.contextmanager
def opened(loop: asyncio.AbstractEventLoop, opening: Awaitable[EventStore]) -> Iterator[EventStore]:
    """The store `opening` gives, closed afterwards."""
    store = loop.run_until_complete(opening)
    try:
        yield store
    finally:
        loop.run_until_complete(store.close())


def cpu_model() -> str:
    """The CPU's model name and core count."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores"
