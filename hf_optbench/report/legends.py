"""The figures the report's legends state, written from the variables its numbers were computed with.

Why: a legend typed by hand drifts from the code: it can say an interval is "at the level Holm's
procedure gave the cell" while every interval is at half of it (each cell's two tests, the largest point's and the
trend's, share the cell's level), or state a margin other than the one the column is judged at.
Here every figure a legend states is read from where the computation keeps it: the margins from each metric's
:class:`~hf_optbench.measure.verdict.MetricSpec`, the intervals' confidence from each point's own level
(``SizeComparison.level``, the level its interval was computed at), Holm's levels from the verdicts, the power from
:data:`~hf_optbench.measure.intervals.POWER`; tests/report/test_legends.py fails where a legend's figure differs
from the one its numbers used. Each legend is written by its section's module from these pieces (the verdict's
three in :mod:`hf_optbench.report.sections.verdict`, the ratio table's in :mod:`hf_optbench.report.sections.ratios`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from hf_optbench.measure.verdict import (
    ALPHA,
    METRICS,
    NOT_MEASURABLE,
    MetricSpec,
    confidence_text,
)


# ------------------------------------------------------------------------------------------------ figures
def margin_text(spec: MetricSpec) -> str:
    """The margin a metric is judged with, as a reader reads its figures: "3 %" for a ratio (the log margin back on
    the ratio scale), "0.01 nats" or "1" for a difference."""
    if spec.mode == "ratio":
        return f"{100 * math.expm1(spec.margin):.3g} %"
    return f"{spec.margin:g}" + (f" {spec.unit}" if spec.unit else "")


def margins_text(specs: Iterable[MetricSpec]) -> str:
    """"0.01 nats for final eval loss; 3 % for speedup (...); 2 % for optimizer state, peak memory": the margins
    of ``specs``, those that share one named together."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        groups.setdefault(margin_text(spec), []).append(spec.label)
    return "; ".join(f"{margin} for {', '.join(labels)}" for margin, labels in groups.items())


def confidence_range(points: Iterable[Any]) -> str:
    """The confidence of the intervals of ``points`` (SizeComparison), from the level each was computed at:
    "99.84 %", or "99.55 % to 99.91 %" where they differ; "" for none."""
    levels = [p.level for p in points if p is not None]
    if not levels:
        return ""
    low, high = confidence_text(max(levels)), confidence_text(min(levels))
    return low if low == high else f"{low} to {high}"


def holm_range(verdicts: Iterable[Any]) -> str:
    """The levels Holm's procedure tested the testable cells at: "0.0033", or "0.0033 to 0.005"."""
    levels = [v.level for v in verdicts if v.p_value is not None]
    if not levels:
        return ""
    low, high = f"{min(levels):.2g}", f"{max(levels):.2g}"
    return low if low == high else f"{low} to {high}"


def points_of(verdicts: Iterable[Any]) -> list[Any]:
    """Every point (SizeComparison) of ``verdicts``, in their order."""
    return [p for v in verdicts for p in v.points]


def _family(an: Any) -> int:
    return max((v.family for v in an.verdicts if v.verdict != NOT_MEASURABLE), default=0)


def judged_metrics(verdicts: Sequence[Any]) -> list[MetricSpec]:
    """The metrics of ``verdicts`` in :data:`METRICS` order."""
    keys = {v.metric.key for v in verdicts}
    return [m for m in METRICS if m.key in keys]


def levels_sentence(verdicts: Sequence[Any]) -> str:
    """Holm's levels and the intervals' confidence, as the computation used them."""
    holm, conf = holm_range(verdicts), confidence_range(points_of(verdicts))
    if not holm:
        return f"Intervals: {conf}." if conf else ""
    return (f"Each cell is tested at the level Holm's procedure gives it ({holm} here); its two tests, the largest "
            f"point's and the trend's, each run at half that level, so every interval of a cell is a two-sided interval "
            f"at half its level: {conf} here (each cell's in the Evidence table).")


def control_text(an: Any, both: str = "") -> str:
    """How the table's error is controlled: one Holm procedure over every testable cell, or, where the sweep
    declares primary questions (measure/primary.py), one over the primary cells and another over the rest."""
    tested = [v for v in an.verdicts if v.p_value is not None and v.verdict != NOT_MEASURABLE]
    tiers = {v.tier: v.family for v in tested}
    if not tiers or set(tiers) == {""}:
        return (f"Error control over the whole table: Holm's step-down procedure over its testable cells{both} "
                f"({_family(an) or 'none here: a cell needs two points'}) keeps the chance of any false difference claim "
                f"at {ALPHA:.0%}.")
    primary = an.report_spec.primary if an.report_spec is not None else ()
    asked = ", ".join(q.text() for q in primary) or "none"
    return (f"Error control: the sweep's pre-declared primary questions ({asked}) form their own family, Holm's "
            f"step-down procedure over its {tiers.get('primary', 0)} testable cells holding the chance of any false "
            f"primary claim at {ALPHA:.0%}; every other cell is secondary, under a second Holm procedure over its "
            f"{tiers.get('secondary', 0)} cells at {ALPHA:.0%} (the Evidence table's tier column). The verdict words of "
            "report.md are the primary family's (docs/METHOD.md: primary questions).")
