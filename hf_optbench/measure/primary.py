"""The pre-declared primary questions of a sweep, and the power of its trend test.

Why a primary family: the verdict table of a study holds every metric along both axes (87 cells in the CPU study),
and Holm's procedure over all of them tests each cell at about ``0.05 / 87``: with 5 seeds that is a t quantile near
11, and the one question the benchmark exists to answer (is an optimizer's speedup over tuned AdamW holding as each
parameter sees more data, and as the model grows?) could resolve nothing. Clinical trials face the same problem and
solve it by declaring, before the data are seen, a small set of *primary* endpoints that carry the trial's
conclusion under their own error control, every other endpoint being *secondary*, reported under its own control and
labelled so (ICH E9, "Statistical Principles for Clinical Trials", 1998, sections 2.2.2 and 5.6; Moher et al.,
"CONSORT 2010 Explanation and Elaboration", BMJ 340:c869, item 6a). A sweep file declares its primary questions in
``report.primary`` (default :data:`DEFAULT_PRIMARY`); Holm's procedure runs over the primary cells alone, and again,
separately, over the rest.

Why transient cells leave the trend: where the baseline ends at or above the data's bigram reference loss
(``report.sections.regime``) training is still in its first moments, the budget ladder is noise (a 30-step run whose x1
rung has a seed spread of 0.1 nats), and one seed's speedup there can carry most of a slope's spread. Such cells are
shown, marked transient, and left out of every trend unless ``report.include_transient`` says otherwise.

Power of the trend: the trend along an axis is the mean over seeds of each seed's least-squares slope, so the
smallest trend it can detect follows from the per-seed slope's spread exactly as a cell's MDE follows from its
pairs' spread (:func:`hf_optbench.measure.intervals.minimal_detectable_effect`). For planning, a per-point spread
``sigma`` of ln(speedup) and the design's points ``x`` (log10 of the ratios) give the slope's spread
``sigma / sqrt(sum((x - mean x)^2))`` (ordinary least squares), and :func:`seeds_for_trend` the seeds a target
needs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.intervals import POWER, minimal_detectable_effect

AXES = ("data", "size")
PRIMARY, SECONDARY = "primary", "secondary"


@dataclass(frozen=True)
class Question:
    """One primary question: a metric (a key of ``measure.verdict.METRICS``) judged along an axis."""

    metric: str
    axis: str

    def text(self) -> str:
        return f"{self.metric} along {self.axis}"


# The benchmark's own question: each optimizer's speedup over tuned AdamW along data (at each size) and along size.
DEFAULT_PRIMARY: tuple[Question, ...] = (Question("speedup", "data"), Question("speedup", "size"))


@dataclass(frozen=True)
class ReportSpec:
    """A sweep file's ``report:`` section: its primary questions and whether transient cells join the trends."""

    primary: tuple[Question, ...] = DEFAULT_PRIMARY
    include_transient: bool = False

    def is_primary(self, metric: str, axis: str) -> bool:
        return Question(metric, axis) in self.primary

    def as_dict(self) -> dict[str, object]:
        return {"primary": [q.text() for q in self.primary], "include_transient": self.include_transient}


REPORT_KEYS = {"primary", "include_transient"}


def parse_report_spec(raw: object, metric_keys: Sequence[str], where: str = "report") -> ReportSpec:
    """``report:`` of a sweep file (or of a manifest), checked: ``primary`` a list of "METRIC along AXIS" strings
    (e.g. "speedup along data"), ``include_transient`` true or false. None gives the defaults."""
    if raw is None:
        return ReportSpec()
    if not isinstance(raw, Mapping):
        raise OptBenchError(f"{where} must be a mapping (primary:, include_transient:), got {type(raw).__name__}.")
    unknown = sorted(set(raw) - REPORT_KEYS)
    if unknown:
        raise OptBenchError(f"unknown key '{unknown[0]}' in {where}. Allowed: {', '.join(sorted(REPORT_KEYS))}.")
    include = raw.get("include_transient", False)
    if not isinstance(include, bool):
        raise OptBenchError(f"{where}.include_transient must be true or false, got {include!r}.")
    primary = raw.get("primary")
    if primary is None:
        return ReportSpec(DEFAULT_PRIMARY, include)
    if not isinstance(primary, list) or not primary:
        raise OptBenchError(f"{where}.primary must be a non-empty list such as [speedup along data, speedup along "
                            f"size], got {primary!r}.")
    out = []
    for item in primary:
        parts = str(item).split(" along ")
        if len(parts) != 2 or parts[0].strip() not in metric_keys or parts[1].strip() not in AXES:
            raise OptBenchError(f"{where}.primary: '{item}' is not 'METRIC along AXIS' with METRIC one of "
                                f"{', '.join(metric_keys)} and AXIS one of {', '.join(AXES)} (e.g. 'speedup along "
                                "data').")
        out.append(Question(parts[0].strip(), parts[1].strip()))
    return ReportSpec(tuple(dict.fromkeys(out)), include)


# ------------------------------------------------------------------------------------------------- power
def slope_sd(point_sd: float, xs: Sequence[float]) -> float:
    """The spread of one seed's least-squares slope on ``xs`` when each point carries independent noise of spread
    ``point_sd``: ``point_sd / sqrt(Sxx)``; inf with fewer than two distinct points."""
    mx = statistics.fmean(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    return math.inf if sxx <= 0 else point_sd / math.sqrt(sxx)


def trend_mde(slope_spread: float, seeds: int, alpha: float, threshold: float, power: float = POWER) -> float:
    """The smallest true trend (per decade, beyond 0) that the trend test at two-sided level ``alpha`` places
    beyond ``±threshold`` with ``power``, from ``seeds`` per-seed slopes of spread ``slope_spread``."""
    return minimal_detectable_effect(slope_spread, seeds, alpha, threshold, power)


def seeds_for_trend(target: float, slope_spread: float, alpha: float, threshold: float, power: float = POWER,
                    most: int = 200) -> int | None:
    """The fewest seeds (at least 2) whose trend MDE is at most ``target``; None when even ``most`` do not reach it
    (a target at or inside the threshold never can: the test calls a trend only beyond it)."""
    if target <= threshold or not math.isfinite(slope_spread):
        return None
    for n in range(2, most + 1):
        if trend_mde(slope_spread, n, alpha, threshold, power) <= target:
            return n
    return None


def pooled_point_sd(values_by_cell: Mapping[object, Sequence[float]]) -> tuple[float, int] | None:
    """(pooled sample sd, cells pooled) of per-seed values within each cell (e.g. ln speedup of each seed at each
    size and ratio): the per-point noise a planned trend inherits. None without a cell of two or more values."""
    ss, df, cells = 0.0, 0, 0
    for values in values_by_cell.values():
        vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if len(vals) < 2:
            continue
        m = statistics.fmean(vals)
        ss += sum((v - m) ** 2 for v in vals)
        df += len(vals) - 1
        cells += 1
    return (math.sqrt(ss / df), cells) if df else None
