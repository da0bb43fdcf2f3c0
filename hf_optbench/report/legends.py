"""The report's legends, written from the variables its numbers were computed with.

Why one module: a legend typed by hand drifts from the code: it can say an interval is "at the level Holm's
procedure gave the cell" while every interval is at half of it (each cell's two tests, the largest point's and the
trend's, share the cell's level), or state a margin other than the one the column is judged at.
Here every figure a legend states is read from where the computation keeps it: the margins from each metric's
:class:`~hf_optbench.measure.verdict.MetricSpec`, the intervals' confidence from each point's own level
(``SizeComparison.level``, the level its interval was computed at), Holm's levels from the verdicts, the power from
:data:`~hf_optbench.measure.intervals.POWER`; tests/report/test_legends.py fails where a legend's figure differs
from the one its numbers used. The report's layout (which legend goes under which table) stays in
:mod:`hf_optbench.report.build`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from hf_optbench.measure.intervals import POWER
from hf_optbench.measure.verdict import (
    ADVANTAGE_SIGN,
    ALPHA,
    DATA_QUESTIONS,
    METRICS,
    NOT_MEASURABLE,
    TREND_RULE,
    MetricSpec,
    confidence_text,
)
from hf_optbench.rundir import BASELINE


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


def _points(verdicts: Iterable[Any]) -> list[Any]:
    return [p for v in verdicts for p in v.points]


def _family(an: Any) -> int:
    return max((v.family for v in an.verdicts if v.verdict != NOT_MEASURABLE), default=0)


def _judged(verdicts: Sequence[Any]) -> list[MetricSpec]:
    """The metrics of ``verdicts`` in :data:`METRICS` order."""
    keys = {v.metric.key for v in verdicts}
    return [m for m in METRICS if m.key in keys]


def _levels_sentence(verdicts: Sequence[Any]) -> str:
    """Holm's levels and the intervals' confidence, as the computation used them."""
    holm, conf = holm_range(verdicts), confidence_range(_points(verdicts))
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


# ------------------------------------------------------------------------------------------------ legends
def verdict_legend(an: Any) -> str:
    """The paragraph under the verdict table (the size axis): how a cell is decided and what controls the table's
    error, with the levels, confidences and margins its cells were computed at."""
    both = " (both axes: the size tables and the data tables below)" if an.multi else ""
    along = [v for v in an.verdicts if v.axis == "size"]
    return (f"Cells: the verdict, then the ratio (or gap) to {BASELINE} at the smallest → largest size run and where "
            f"the optimizer stands at the largest size. Runs are paired with {BASELINE} by seed (same initial weights "
            "and data order); each size has a Student-t interval of the mean paired log-ratio (or difference), or, where "
            "some pairs are bounds (a speedup beyond the ladder, a run that never reached the target), a censored-normal "
            "likelihood interval (never a mean of bounds; ≥ / ≤ marks a figure that is itself a bound). The trend is the "
            f"mean of per-seed slopes over log10(parameters) with its own interval, printed as the advantage trend "
            f"({ADVANTAGE_SIGN}). {control_text(an, both)} {_levels_sentence(along)} Margins (a difference within one "
            "is level): "
            f"{margins_text(_judged(along) or METRICS)}. {TREND_RULE.format(points='sizes')} A \"no difference\" cell "
            f"states its MDE: the smallest true effect it would have called with {POWER:.0%} power at its level (exact, "
            "from the noncentral t). Wall-clock cells measured while runs shared the machine, or whose per-seed ratios "
            f"spread wider than their effect, say \"{NOT_MEASURABLE}\" and stay out of the family. Time to target uses "
            "the 50 % target (see Convergence); a run that never reached it, or diverged, counts at its budget as a "
            "bound. Full rule: hf_optbench/measure/verdict.py.")


def data_legend(an: Any) -> str:
    """The paragraph under the data-axis tables: what is judged along data, the error control they share, the levels,
    confidences and margins of their cells."""
    along = [v for v in an.verdicts if v.axis == "data"]
    return (f"Along data per parameter, at each size: the same rule as along size, with log10(tokens per parameter) in "
            f"place of log10(parameters). Each seed is paired with {BASELINE} at each ratio (the same initial weights "
            "and data order, at another budget; each ratio tuned and laddered on its own), the trend is the mean of "
            "per-seed slopes over log10(tokens per parameter), its threshold the margin over the decades of data "
            "spanned. Cells: the verdict, then the ratio (or gap) at the smallest → largest ratio and where the optimizer "
            "stands at the largest; a trend reads \"... with data\" (Marin, arXiv:2509.02046, found Muon's speedup "
            f"shrinking with data). Judged: the {' and '.join(DATA_QUESTIONS)} metrics (a model's memory does not depend "
            f"on its data budget). {control_text(an, ' (both axes together)')} "
            f"{_levels_sentence(along)} Margins: {margins_text(_judged(along) or METRICS)}. "
            f"{TREND_RULE.format(points='data ratios')}")


def evidence_legend(verdicts: Sequence[Any]) -> str:
    """The paragraph under the Evidence table of ``verdicts`` (its rows), printed in every report that has one: what
    each figure of a row is, and what its p is the p of."""
    shown = [v for v in verdicts if v.points]
    return ("Evidence: each row gives the paired comparison at the smallest and the largest point (size, or data ratio "
            "along data) with its interval and stance, then the advantage trend per decade [its interval] ("
            f"{ADVANTAGE_SIGN}: for a ratio metric the slope of ln(baseline / optimizer), of ln(speedup) for the "
            "speedup) against ± its threshold (the margin over the decades spanned), where it lies (beyond the margin, "
            "inside it, or neither) and the smallest trend its test could detect with 80 % power. "
            "Then the cell's p, and what it is the p of: \"cell p = 2 × min(p at <largest point>, trend p)\" "
            "(at most 1; Bonferroni over the cell's two tests), where \"p at <largest point>\" is the two-sided p of "
            "the largest point's paired difference lying beyond its margin (twice the smaller one-sided p of \"below "
            "−margin\" and \"above +margin\") and \"trend p\" the same for the trend against ± its threshold. "
            "\"tested at\": the level Holm's procedure gave the cell, which claims a difference when its p is at or "
            f"below it. \"intervals\": the confidence of every interval in the row, half that level"
            f"{f' ({confidence_range(_points(shown))} here)' if shown else ''}.")


def ratio_legend(an: Any) -> str:
    """The paragraph under the ratio table: each column's margin and the intervals' confidence, as computed."""
    ratio_specs = [s for s in METRICS if s.mode == "ratio"]
    points = [an.point(o, s.key, c)[1] for o in an.optimizers if o != BASELINE for s in ratio_specs for c in an.sizes]
    conf = confidence_range(points)
    return (f"Cells: mean paired ratio to {BASELINE} [its interval: two-sided, at half the level Holm's procedure gave "
            f"the verdict cell that judges it{f', {conf} here' if conf else ''}; each cell's in the Evidence table] and "
            "the stance (ahead / behind: the whole interval beyond the column's margin; level: inside it; no "
            f"difference: neither). Margins: {margins_text(ratio_specs)}. Bounds: pairs where a run never reached "
            "the target (counted at its budget) or a speedup lies beyond the ladder, estimated by the censored-normal "
            "likelihood, never averaged. A wall-clock figure whose per-seed ratios spread wider than its effect is "
            "marked not interpretable: the machine's load, not the optimizer, moved it. Predicted rows: the memory "
            "planner's optimizer-state ratio at GPT-2 sizes not run (`hf-optbench memory`), with GPT-2's 50,304-row "
            "embedding and 1,024 positions; the 8-bit optimizers as configured in this sweep (embedding state 32-bit "
            "or not).")
