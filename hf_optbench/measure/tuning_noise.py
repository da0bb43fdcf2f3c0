"""Tuning noise beside the comparison's intervals: the rule that widens an interval by the shift a second
tuning draw produced, and the verdict taken again at the widened interval.

What the intervals cover: a cell's interval is over its compared seeds, so it holds the seed-to-seed noise of
training at the tuned values. It does not hold the noise of the tuning that picked those values: one tuning seed
picks them, and another seed can pick others (measured on the main job's 1 token/param cell: a second tuning seed
moved AdamW's non-matrix pick from x2 to x1 and Muon's speedup from 2.36 to 2.19, 15 % of the interval's width).
A second draw (``study.second_draw``) tunes chosen cells again at another seed, and the report measures the shift
``delta`` of each cell's estimate on the verdict's own scale (the gap: minus the log speedup, the final-loss
difference in nats; ``measure.verdict``). The rule, per point (a size, or a data ratio, of a verdict):

* ``|delta| <= h / 3``, with ``h`` the interval's half-width: the interval stands. One draw is one sample of the
  tuning's noise; a shift that small moves neither end by more than a sixth of the interval's width, which the
  interval's own level (Holm's, over the table) is not resolved to.
* otherwise the interval is widened by ``|delta|`` on both sides, ``[low - |delta|, high + |delta|]`` (the end the
  other draw would have moved it to, and as far on the other side: the sign of a second draw's shift is not known in
  advance), and the point's stance (ahead / behind / level / no difference against the margin) is taken again.
* the trend: shifts ``delta_i`` at points ``x_i`` (log10 of parameters, or of tokens per parameter) move the
  least-squares slope by ``sum (x_i - mean x) delta_i / Sxx``; its largest value over the shifts' signs,
  ``sum |x_i - mean x| |delta_i| / Sxx``, is the slope's shift, widened by under the same third rule.
* the verdict word is taken again from the widened points and trend (``measure.verdict_words.classify``). Holm's
  levels stay as they were: the widening moves intervals, not the order of the cells' p-values.

Which shift a point gets (its own cell's, or one borrowed from a drawn cell of the same size) is the caller's
choice (``report.sections.tuning_noise`` says it in the table).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hf_optbench.measure.verdict import NOT_MEASURABLE, SizeComparison, Verdict, stance
from hf_optbench.measure.verdict_words import classify, trend_direction

# A shift up to this share of the interval's half-width leaves the interval as it is (the module doc says why).
NEGLIGIBLE_SHARE = 1.0 / 3.0
# Verdicts that are not drawn from intervals (classify never made them): their points widen, their word stays.
UNCLASSIFIED = (NOT_MEASURABLE, "insufficient data")


@dataclass(frozen=True)
class PointShift:
    """One point's tuning shift against its interval: ``shift`` on the gap scale, ``half_width`` of the interval
    before widening, ``widened`` whether the rule widened it."""

    label: str
    shift: float
    half_width: float
    widened: bool

    @property
    def share(self) -> float:
        """|shift| as a share of the half-width (0 for no shift; inf for a shift against a zero half-width)."""
        if self.shift == 0:
            return 0.0
        return abs(self.shift) / self.half_width if self.half_width > 0 else math.inf


def needs_widening(shift: float, half_width: float) -> bool:
    """Whether ``shift`` exceeds :data:`NEGLIGIBLE_SHARE` of an interval's ``half_width`` (never for an interval
    that is unbounded on a side: it cannot be widened)."""
    return math.isfinite(half_width) and abs(shift) > NEGLIGIBLE_SHARE * half_width


def widen_point(p: SizeComparison, shift: float | None) -> tuple[SizeComparison, PointShift | None]:
    """The point with its interval widened by ``shift`` where the rule says so, its stance taken again; and the
    record of it (None without a shift)."""
    if shift is None or not math.isfinite(shift):
        return p, None
    half = (p.ci_high - p.ci_low) / 2.0
    record = PointShift(p.model_size, shift, half, needs_widening(shift, half))
    if not record.widened:
        return p, record
    low, high = p.ci_low - abs(shift), p.ci_high + abs(shift)
    return dataclasses.replace(p, ci_low=low, ci_high=high, stance=stance(low, high, p.margin)), record


def slope_shift(xs: Sequence[float], shifts: Sequence[float]) -> float:
    """The largest move of a least-squares slope over ``xs`` that point shifts of these sizes can make (any signs)."""
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    sxx = sum((x - mean) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum(abs(x - mean) * abs(d) for x, d in zip(xs, shifts, strict=True)) / sxx


def widen_verdict(v: Verdict, shifts: Mapping[str, float | None]) -> tuple[Verdict, list[PointShift]]:
    """``v`` with each point widened by its shift (``shifts``: {point label: shift on the gap scale, None where
    unknown}), the trend widened by the slope's shift, and the word taken again; the per-point records."""
    records: list[PointShift] = []
    points = []
    for p in v.points:
        new, record = widen_point(p, shifts.get(p.model_size))
        points.append(new)
        if record is not None:
            records.append(record)
    if not records:
        return v, records
    ci, notes = v.slope_ci, list(v.notes)
    if ci is not None and v.threshold is not None:
        move = slope_shift([math.log10(p.num_params) for p in v.points],
                           [abs(shifts.get(p.model_size) or 0.0) for p in v.points])
        if needs_widening(move, (ci[1] - ci[0]) / 2.0):
            ci = (ci[0] - move, ci[1] + move)
            notes.append(f"trend interval widened by {move:.3g}/decade for the tuning draw")
    widened = [r.label for r in records if r.widened]
    if widened:
        notes.append(f"interval widened by the tuning draw's shift at {', '.join(widened)}")
    word = v.verdict
    if len(points) >= 2 and v.verdict not in UNCLASSIFIED:
        direction = trend_direction(ci, v.threshold)
        word = classify(points, direction, all(p.stance == "level" for p in points))
    return dataclasses.replace(v, points=points, slope_ci=ci, verdict=word, notes=notes), records
