"""The odds of alternatives: weighted choices that shrink towards the first (simplest) option.

The strategies draw most of their alternatives through these: `weighted` between strategies,
`choose` between names inside a composite strategy, `optional` for a value or None. The weights
are drawn as indices, so the reports hypothesis prints stay small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from hypothesis import strategies as st

__all__ = ["choose", "optional", "weighted"]

T = TypeVar("T")


def weighted(*options: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """Draw from one of `options` with the given integer weights (shrinks towards the first)."""
    # Sampling indices, not the strategies themselves: a table of repeated strategies would
    # repeat their reprs too, and nested weights made reports of hundreds of kB.
    strategies = [strategy for _, strategy in options]
    table = [n for n, (weight, _) in enumerate(options) for _ in range(weight)]
    return st.sampled_from(table).flatmap(strategies.__getitem__)


def choose(draw: st.DrawFn, options: Sequence[tuple[int, str]]) -> str:
    """Pick one name from `(weight, name)` pairs (shrinks towards the first)."""
    total = sum(weight for weight, _ in options)
    index = draw(st.integers(0, total - 1))
    for weight, name in options:
        if index < weight:
            return name
        index -= weight
    raise AssertionError("unreachable")


def optional(strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    """None one time in three, else a value of `strategy`."""
    return weighted((1, st.none()), (2, strategy))
