"""One PNG per benchmark group: horizontal bars of the medians, the spread (min to max) as
error bars, each bar labelled with its value and its first ratio. matplotlib is a
benchmark-only dependency; the Agg backend draws without a display."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported: draw without a display

import matplotlib.pyplot as plt
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from benchmarks.harness import Result
from benchmarks.report import format_value

__all__ = ["draw_group"]

# Drawn 8 inches wide at 150 dpi (1200 px) and shown about 800 px wide on a documentation page:
# these sizes in points come out at 12 to 17 px there, readable without zooming.
WIDTH_INCHES = 8
DPI = 150
TEXT_POINTS = 10
TITLE_POINTS = 13
WRAP_CHARACTERS = 44

COLOURS = {
    "runfold": "#2f6db5",
    "raw driver": "#9a9a9a",
    "eventsourcing": "#e08a2c",
    "DBOS": "#3f9b57",
}


def _contender(case: str) -> str:
    if "eventsourcing" in case:
        return "eventsourcing"
    if "DBOS" in case:
        return "DBOS"
    if case.startswith("raw"):
        return "raw driver"
    return "runfold"


def _label(result: Result, several_places: bool) -> str:
    text = result.case
    if several_places:  # say where, briefly: the store or server, not its settings
        text += f" — {result.on.split(',')[0]}"
    return "\n".join(textwrap.wrap(text, WRAP_CHARACTERS))


def draw_group(title: str, results: Sequence[Result], path: Path) -> None:
    """Draw `results` (one group) into `path`: one panel per unit."""
    units = list(dict.fromkeys(r.unit for r in results))
    several_places = len({r.on for r in results}) > 1
    panels = [[r for r in results if r.unit == unit] for unit in units]
    heights = [
        0.3 + 0.5 * sum(_label(r, several_places).count("\n") + 1 for r in p) for p in panels
    ]
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(WIDTH_INCHES, 1.1 + sum(heights)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for axis, unit, panel in zip(axes[:, 0], units, panels, strict=True):
        positions = range(len(panel))
        medians = [r.value.median for r in panel]
        axis.barh(
            positions,
            medians,
            xerr=[
                [r.value.median - r.value.low for r in panel],
                [r.value.high - r.value.median for r in panel],
            ],
            color=[COLOURS[_contender(r.case)] for r in panel],
            error_kw={"elinewidth": 1, "capsize": 3, "ecolor": "#333333"},
        )
        axis.set_yticks(
            list(positions), [_label(r, several_places) for r in panel], fontsize=TEXT_POINTS
        )
        axis.invert_yaxis()  # first row on top, as in the table
        worse = "lower is better" if panel[0].lower_is_better else "higher is better"
        axis.set_xlabel(f"{unit} (median; bars: min–max; {worse})", fontsize=TEXT_POINTS)
        axis.tick_params(axis="x", labelsize=TEXT_POINTS)
        axis.xaxis.set_major_formatter(
            FuncFormatter(lambda x, _: f"{x:,g}" if x < 100 else f"{x:,.0f}")
        )
        axis.set_xlim(0, max(r.value.high for r in panel) * 1.8)
        for position, result in zip(positions, panel, strict=True):
            text = format_value(result.value.median, result.unit)
            if result.comparisons:
                first = result.comparisons[0]
                text += f"  ({first.ratio:.2f}× {first.anchor})"
            axis.text(
                result.value.high,
                position,
                "  " + text,
                va="center",
                fontsize=TEXT_POINTS,
                clip_on=False,
            )
        axis.grid(axis="x", color="#dddddd", linewidth=0.6)
        axis.set_axisbelow(True)
    used = list(dict.fromkeys(_contender(r.case) for r in results))
    figure.legend(
        handles=[Patch(color=COLOURS[kind], label=kind) for kind in used],
        loc="upper right",
        fontsize=TEXT_POINTS,
        ncols=len(used),
    )
    figure.suptitle(title, x=0.01, ha="left", fontsize=TITLE_POINTS)
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
