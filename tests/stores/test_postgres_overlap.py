"""`OverlapChooser` keeps the group-commit size that writes more appends per busy second, and
measures the other one again now and then."""

from __future__ import annotations

from runfold.stores.postgres.overlap import OverlapChooser


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_epoch(chooser: OverlapChooser, clock: Clock, rates: dict[int, float]) -> int:
    """One busy epoch (0.1 s: the choosers here are made so) of writes of ten appends each, at
    the rate `rates` gives the candidate in use; the candidate the epoch measured."""
    measured = chooser.overlap
    writes = round(0.1 * rates[measured] / 10)  # whole: the rates here are multiples of 100
    chooser.busy()
    for _ in range(writes):
        clock.now += 10 / rates[measured]
        chooser.written(10)
    chooser.idle()
    return measured


def test_each_candidate_is_measured_then_the_faster_kept() -> None:
    clock = Clock()
    chooser = OverlapChooser((4, 16), epoch=0.0999, kept=3, clock=clock)
    rates = {4: 1_000.0, 16: 2_000.0}
    assert [run_epoch(chooser, clock, rates) for _ in range(2)] == [4, 16]
    assert chooser.overlap == 16
    # Kept for three epochs in all, then the slower one is measured again, and left again.
    assert [run_epoch(chooser, clock, rates) for _ in range(8)] == [16, 16, 4, 16, 16, 16, 4, 16]


def test_the_other_candidate_wins_once_it_becomes_faster() -> None:
    clock = Clock()
    chooser = OverlapChooser((4, 16), epoch=0.0999, kept=2, clock=clock)
    rates = {4: 3_000.0, 16: 2_000.0}
    assert [run_epoch(chooser, clock, rates) for _ in range(4)] == [4, 16, 4, 4]
    rates[16] = 5_000.0  # the machine changed: flushes got slow, say
    assert [run_epoch(chooser, clock, rates) for _ in range(5)] == [16, 16, 4, 16, 16]


def test_idle_time_does_not_count_against_the_candidate_in_use() -> None:
    clock = Clock()
    chooser = OverlapChooser((4, 16), epoch=0.0999, kept=8, clock=clock)
    chooser.busy()
    clock.now += 0.05
    chooser.written(100)  # 2,000 appends per busy second so far
    chooser.idle()
    clock.now += 60.0  # a quiet minute
    chooser.busy()
    clock.now += 0.05
    chooser.written(100)
    assert chooser.overlap == 16  # the epoch ended after 0.1 busy seconds
    chooser.idle()
    run_epoch(chooser, clock, {16: 1_000.0})
    assert chooser.overlap == 4  # 2,000 per busy second beat 1,000: the quiet minute aside


def test_a_single_candidate_is_kept() -> None:
    clock = Clock()
    chooser = OverlapChooser((8,), epoch=0.0999, kept=2, clock=clock)
    assert [run_epoch(chooser, clock, {8: 1_000.0}) for _ in range(5)] == [8] * 5
