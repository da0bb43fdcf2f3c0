"""The scaling verdict: does an optimizer's advantage over the baseline hold, grow or shrink with model size, and
with the data per parameter?

The question behind the benchmark: if growing the model shrinks an optimizer's saving in memory, convergence
speed or stability, the optimizer should not be used for large-scale pretraining. This module turns per-run
records into that answer, a table of verdicts (one per optimizer and metric), so the answer can be tested on
simulated data (benchmarks/verdict_rates.py and tests/measure/test_verdict_rates.py measure the false-verdict rate
of the whole table on data with no true difference). It holds the metrics compared and their margins, the types a
reader sees (:class:`SizeComparison`, one point's comparison; :class:`Verdict`, one cell's) with their texts, and
the table; the paired statistics are :mod:`hf_optbench.measure.verdict_stats` (per seed, per size, the trend,
Holm's levels) and the words and their rules :mod:`hf_optbench.measure.verdict_words`.

* **At one size** the optimizer is **ahead** when the whole interval of its paired difference with the baseline
  lies below ``-margin``, **behind** when it lies above ``+margin``, **level** when it lies inside
  ``[-margin, +margin]`` (an equivalence test: a 0.1 % gap measured with no noise is level, not a difference), and
  **no difference** otherwise; a size where some pairs are bounds says how many. Each cell states its **minimal
  detectable effect** (MDE): the smallest true gap it would call ahead or behind with 80 % power at the level it
  was tested at, computed exactly from the noncentral t distribution.
* **The margins**, each the smallest difference worth a word on its own scale:
  - final eval loss: a difference in nats, margin :data:`LOSS_MARGIN_NATS` = 0.01. Losses are compared on the
    language-model scale: a *ratio* margin of 2 % would be ~0.05 nats at a loss of 2.5, larger than the whole
    Muon-vs-AdamW gap at 1.2B parameters in the Marin study (~0.004 nats, a 1.1x speedup), so no number of seeds
    could see a real LM effect through it;
  - speedup (AdamW-equivalent data, :mod:`hf_optbench.measure.speedup`): a ratio, margin 3 %
    (:data:`SPEEDUP_MARGIN`): the smallest speedup recent comparisons report as a gain is ~1.1x (Marin at 1.2B),
    and 3 % keeps a tenth of it resolvable; higher is better, the baseline's own speedup is 1 by definition;
  - memory, tokens and seconds to target: ratios, margin 2 %;
  - differences with their own floor: 1 spike / 1k steps; 0.2 of the seeds diverging.
* **The trend** is **significant** when its interval lies wholly beyond ``threshold = margin / decades spanned`` on
  one side (a change of at least the margin across the sizes run), and **shown flat** when it lies wholly inside
  ``[-threshold, +threshold]``.
* **Error control over the whole table**: Holm's procedure over the table's cells holds the chance of *any* false
  difference claim in the table at :data:`ALPHA` (5 %). Wall-clock cells that cannot be measured on this machine
  are left out of the family.

The verdicts (one per optimizer and metric) and what each means: :data:`VERDICT_MEANINGS`.

Two axes
--------
A sweep over several data budgets (tokens per non-embedding parameter) has a second axis with the same question:
does the advantage hold, grow or shrink as each parameter sees more data (Marin, arXiv:2509.02046: Muon's speedup
shrinks with data)? The rule is the same, with log10(tokens per parameter) in place of log10(parameters): at each
size, the optimizer's paired differences at each ratio (the same seeds, so the same initial weights and data order,
at other budgets), the per-seed slope along the ratios, the same margins and words (a trend word says "with data":
"shrinks with data"). The table (:func:`verdict_table`, built by :func:`grid_families`) then holds the size axis at
each ratio every size ran and the data axis at each size, the latter for the metrics a data budget can move
(:data:`DATA_QUESTIONS`: convergence and stability; the memory of one model does not depend on its data); Holm's
procedure runs over every cell of both axes at once, so the chance of any false claim in the whole table stays at
:data:`ALPHA` (the cells share runs; Holm needs no independence).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from hf_optbench.measure.intervals import Censor, minimal_detectable_effect
from hf_optbench.measure.primary import PRIMARY, SECONDARY, ReportSpec, trend_mde
from hf_optbench.measure.verdict_stats import Cell, Estimate, Pairs, build_cell, estimate, holm_levels
from hf_optbench.measure.verdict_words import (
    TREND_PHRASES,
    TREND_WORDS,
    VERDICTS,
    classify,
    trend_direction,
    word_meaning,
)
from hf_optbench.rundir import BASELINE

# How every printed trend is oriented (:attr:`Verdict.advantage_trend`).
ADVANTAGE_SIGN = "+: advantage grows"

# The questions a data budget can move (the data axis's metrics); a model's memory is the same at every budget.
DATA_QUESTIONS = ("convergence", "stability")
SIZE_AXIS, DATA_AXIS = "size", "data"
TREND_RULE = ("A trend is beyond the margin when its whole interval lies beyond ± the trend threshold (the metric's "
              "margin over the decades spanned: a change of more than the margin across the {points} run), inside the "
              "margin when its whole interval lies within ± the threshold, and neither otherwise: an interval that "
              "excludes 0 but reaches inside the threshold is neither, and so is a trend from fewer than two seeds.")


def axis_word(word: str, axis: str) -> str:
    """A word as the table writes it along ``axis``: a trend word on the data axis says so ("shrinks with data")."""
    return f"{word} with data" if axis == DATA_AXIS and word in TREND_WORDS else word


def meanings(axis: str = SIZE_AXIS) -> dict[str, str]:
    """Every word's meaning along ``axis`` ("size" or "data"), keyed by the word as the table writes it
    (:func:`hf_optbench.measure.verdict_words.word_meaning`)."""
    return {axis_word(word, axis): word_meaning(word, axis) for word in VERDICTS}


VERDICT_MEANINGS = meanings(SIZE_AXIS)


# The words that claim a difference from the baseline (ahead, behind or a trend): the claims whose family-wise
# error rate Holm's procedure controls. "level" and "no difference" claim none.
CLAIMS = ("grows", "holds", "ahead, trend unresolved", "gaining", "shrinks", "deficit vanishes", "behind")
ALPHA = 0.05  # family-wise, over every cell of the verdict table (Holm), each cell's two tests at half its level
RATIO_MARGIN = math.log(1.02)
SPEEDUP_MARGIN = math.log(1.03)  # see the module doc: a tenth of the ~1.1x gains that recent studies report
LOSS_MARGIN_NATS = 0.01  # see the module doc: hundredths of a nat matter in language modelling
NOT_MEASURABLE = "not measurable here"


@dataclass(frozen=True)
class MetricSpec:
    """One compared quantity. ``mode`` ratio: positive values compared as log-ratios; difference: plain gaps.
    ``margin``: the smallest difference that counts (equivalence margin), on the log scale for ratios.
    ``higher_is_better``: compared as ``log b - log o`` so that "ahead" keeps its meaning (speedup).
    ``baseline_value``: the metric is already relative to the baseline (a speedup): every seed's baseline value is
    this constant, and no baseline observation is needed."""

    key: str
    question: Literal["memory", "convergence", "stability"]
    label: str
    mode: Literal["ratio", "difference"] = "ratio"
    margin: float = RATIO_MARGIN
    higher_is_better: bool = False
    baseline_value: float | None = None
    unit: str = ""  # of a difference metric, for the MDE text ("nats")
    censored_means: str = "a run that never reached the target (counted at its budget: a bound)"


# The metrics the report compares (keys of the per-run records the report builds from summary.json).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("optimizer_state_bytes", "memory", "optimizer state"),
    MetricSpec("peak_memory_bytes", "memory", "peak memory"),
    MetricSpec("speedup", "convergence", "speedup (AdamW-equivalent data)", margin=SPEEDUP_MARGIN,
               higher_is_better=True, baseline_value=1.0,
               censored_means="a loss beyond the ladder's range (a bound, never a value)"),
    MetricSpec("final_eval_loss", "convergence", "final eval loss", "difference", LOSS_MARGIN_NATS, unit="nats"),
    MetricSpec("tokens_to_target", "convergence", "tokens to target loss"),
    MetricSpec("seconds_to_target", "convergence", "seconds to target loss"),
    # One spike per 1k steps and one diverged seed in five are the smallest gaps worth a word.
    MetricSpec("loss_spikes_per_1k", "stability", "loss spikes / 1k steps", "difference", 1.0, unit="spikes/1k steps"),
    MetricSpec("diverged", "stability", "diverged fraction", "difference", 0.2, unit="share"),
)


@dataclass(frozen=True)
class Observation:
    """One run's value of one metric (None: not measured). ``censored``: the value is a bound, not a measurement;
    ``bound`` says which way: "above" (the true value is at least this: a run that never reached a target counts at
    its budget; a speedup beyond the ladder's top) or "below" (at most this). A censored value without ``bound``
    is read as "above"."""

    optimizer: str
    model_size: str
    num_params: float
    seed: int
    value: float | None
    censored: bool = False
    bound: Literal["above", "below"] | None = None

    @property
    def direction(self) -> Literal["above", "below"] | None:
        return (self.bound or "above") if self.censored else None


@dataclass
class SizeComparison:
    """Optimizer vs baseline at one model size, paired by seed. ``gap`` is the mean paired difference, or, where
    some pairs are bounds, the censored-normal estimate; when every pair is a bound on the same side no estimate
    exists and ``gap`` holds the weakest bound (``bounded`` says which way: "upper": the true gap is at most it)."""

    model_size: str
    num_params: float
    gap: float
    spread: float  # sample standard deviation of the paired differences (the fitted spread where censored)
    ci_low: float
    ci_high: float
    stance: str  # one of STANCES
    n_pairs: int
    mean_optimizer: float
    mean_baseline: float
    censored_pairs: int = 0
    level: float = ALPHA  # the two-sided level of this size's interval
    margin: float = 0.0
    higher_is_better: bool = False
    bounded: Censor = None
    p_ahead: float = 1.0  # one-sided p-values of "beyond -margin" / "beyond +margin"
    p_behind: float = 1.0
    transient: bool = False  # the baseline ends at or above the bigram reference here: shown, left out of the trend

    @property
    def significant(self) -> bool:
        """A difference beyond the margin, with confidence (ahead or behind)."""
        return self.stance in ("ahead", "behind")

    @cached_property
    def mde(self) -> float:
        """The minimal detectable effect (the |gap| called ahead or behind with 80 % power at this size's level),
        on the gap's scale; computed when asked (an exact noncentral-t solve: the simulations judge thousands of
        tables and read none of them)."""
        if self.n_pairs < 2 or not math.isfinite(self.spread):
            return math.inf
        return minimal_detectable_effect(self.spread, self.n_pairs, self.level, self.margin)

    @property
    def p_value(self) -> float:
        """Two-sided p-value of a difference beyond the margin (ahead or behind)."""
        return min(1.0, 2.0 * min(self.p_ahead, self.p_behind))

    def ratio(self) -> float:
        """The figure a reader expects for ratio metrics: exp(gap) (0.5 = half the baseline), or for a
        higher-is-better metric the value itself (a speedup of 1.6); a bound where ``bounded``."""
        return math.exp(-self.gap if self.higher_is_better else self.gap)

    def interval(self) -> tuple[float, float]:
        """The interval of :meth:`ratio` (low, high)."""
        if self.higher_is_better:
            return math.exp(-self.ci_high), math.exp(-self.ci_low)
        return math.exp(self.ci_low), math.exp(self.ci_high)

    def bound_sign(self) -> str:
        """"≥ " or "≤ " before a figure that is a bound (every pair censored one way), else ""."""
        if self.bounded is None:
            return ""
        at_least = (self.bounded == "upper") == self.higher_is_better  # a speedup's gap is -log(speedup)
        return "≥ " if at_least else "≤ "

    def ratio_text(self) -> str:
        """"0.823 [0.70, 0.96] ahead (1/5 pairs bounds)": the ratio (a bound, "≥ 4", where every pair is one), its
        interval and stance, and how many pairs are bounds."""
        low, high = self.interval()
        return f"{self.bound_sign()}{self.ratio():.3g} [{low:.3g}, {high:.3g}] {self.stance}{self.censored_text()}"

    def censored_text(self) -> str:
        return f" ({self.censored_pairs}/{self.n_pairs} pairs bounds)" if self.censored_pairs else ""

    def describe(self, spec: MetricSpec) -> str:
        """"speedup 1.6 [1.5, 1.7] (midi, ahead)", with the MDE where the stance is "no difference"."""
        if spec.mode == "ratio":
            low, high = self.interval()
            kind = "speedup" if spec.higher_is_better else "ratio"
            text = f"{kind} {self.bound_sign()}{self.ratio():.3g} [{low:.3g}, {high:.3g}]"
        else:
            text = f"gap {self.bound_sign()}{self.gap:+.3g} [{self.ci_low:+.3g}, {self.ci_high:+.3g}]"
        mde = f", {self.mde_text(spec.mode, spec.unit)}" if self.stance == "no difference" else ""
        return f"{text}{self.censored_text()} ({self.model_size}, {self.stance}{mde})"

    def mde_text(self, mode: str, unit: str = "") -> str:
        """"MDE 12 %" (ratio metrics: the smallest detectable ratio change) or "MDE 0.012 nats"."""
        if not math.isfinite(self.mde):
            return "MDE n/a: one seed" if self.n_pairs < 2 else "MDE n/a: bounds"
        if mode == "ratio":
            return f"MDE {math.expm1(self.mde):.0%}"
        return f"MDE {self.mde:.2g}" + (f" {unit}" if unit else "")


@dataclass
class Verdict:
    optimizer: str
    metric: MetricSpec
    verdict: str
    points: list[SizeComparison] = field(default_factory=list)
    slope_per_decade: float | None = None
    slope_ci: tuple[float, float] | None = None
    change: float | None = None  # fitted change across the sizes run (slope x decades)
    threshold: float | None = None  # the slope beyond which a trend counts (margin / decades)
    notes: list[str] = field(default_factory=list)
    p_value: float | None = None  # of a difference claim in this cell (None: no test possible)
    level: float = ALPHA  # the level this cell was tested at (Holm over the table)
    trend_p: tuple[float, float] = (1.0, 1.0)  # one-sided p of a favourable / unfavourable trend
    family: int = 1  # the cells Holm's procedure controlled together (the table's testable cells)
    axis: str = SIZE_AXIS  # "size": points are model sizes; "data": points are tokens per parameter at one size
    at: str = ""  # where on the other axis: the data ratio of a size-axis cell ("" for one), the size of a data one
    trend: str | None = None  # the trend's outcome (one of TRENDS; None: no trend to judge)
    tier: str = ""  # its Holm family where the sweep declares primary questions: "primary" / "secondary" ("": one
    trend_spread: tuple[float, int] | None = None  # (sd of the per-seed slopes, seeds): the trend's power

    @cached_property
    def trend_mde(self) -> float | None:
        """The smallest true trend (per decade, either way) its test would call beyond the threshold with 80 % power
        at the cell's level; None without a trend, inf where no number of this seeds' spread could (computed when
        asked: the error-rate simulations judge thousands of tables and read none of them)."""
        if self.trend_spread is None or self.threshold is None:
            return None
        sd, seeds = self.trend_spread
        try:
            return trend_mde(sd, seeds, self.interval_level, self.threshold)
        except (ValueError, ArithmeticError):
            return math.inf

    @property
    def judged_points(self) -> list[SizeComparison]:
        """The points the verdict's tests used: every shown point but the transient ones."""
        return [p for p in self.points if not p.transient]

    @property
    def advantage_trend(self) -> float | None:
        """The trend as a reader reads it: per decade, positive when the optimizer's advantage grows. For a speedup
        it is the slope of ln(speedup); for other ratio metrics the slope of ln(baseline / optimizer); for a
        difference metric the slope of (baseline - optimizer). The stored slope is of the oriented difference
        (negative is better), so this is its negative."""
        return None if self.slope_per_decade is None else -self.slope_per_decade

    @property
    def advantage_ci(self) -> tuple[float, float] | None:
        return None if self.slope_ci is None else (-self.slope_ci[1], -self.slope_ci[0])

    def trend_unit(self) -> str:
        """"ln/decade" for a ratio metric, "nats/decade" (its unit) for a difference metric."""
        return "ln/decade" if self.metric.mode == "ratio" else f"{self.metric.unit or 'units'}/decade"

    def trend_text(self, sign: bool = True) -> str:
        """"+0.270 ln/decade [+0.153, +0.388] (+: advantage grows)", without the orientation where the caller states
        it once (``sign`` false); "" without a trend."""
        a, ci = self.advantage_trend, self.advantage_ci
        if a is None or ci is None:
            return ""
        return f"{a:+.3f} {self.trend_unit()} [{ci[0]:+.3f}, {ci[1]:+.3f}]" + (f" ({ADVANTAGE_SIGN})" if sign else "")

    @property
    def word(self) -> str:
        """The verdict as the table writes it: a trend along the data axis says so ("shrinks with data")."""
        return axis_word(self.verdict, self.axis)

    @property
    def interval_level(self) -> float:
        """The two-sided level of every interval of this cell: half the level Holm's procedure tested it at (its two
        tests, the largest point's and the trend's, each at half of it)."""
        return self.level / 2

    @property
    def trend_p_value(self) -> float | None:
        """Two-sided p of a trend beyond its margin (``±threshold``); None without a trend."""
        return None if self.trend is None else min(1.0, 2.0 * min(self.trend_p))

    def p_text(self) -> str:
        """"cell p 6.9e-06 = 2 × min(p at 2 tok/param 3.4e-06, trend p 0.41), tested at 0.0033 (Holm over 15 cells)":
        what the cell's p is the p of (:meth:`hf_optbench.measure.verdict_stats.Cell.p_value`), and the level it was tested at."""
        if self.p_value is None or not self.judged_points:
            return ""
        last = self.judged_points[-1]
        parts = [f"p at {last.model_size} {last.p_value:.2g}"]
        if self.trend_p_value is not None:
            parts.append(f"trend p {self.trend_p_value:.2g}")
        smaller = min(last.p_value, self.trend_p_value if self.trend_p_value is not None else 1.0)
        of = f"min({', '.join(parts)})" if len(parts) > 1 else parts[0]
        capped = ", capped at 1" if 2 * smaller > 1 else ""
        return (f"cell p {self.p_value:.2g} = 2 × {of}{capped}, tested at {self.level:.2g} "
                f"(Holm over {self.family} {self.tier + ' ' if self.tier else ''}cells)")

    @property
    def evidence(self) -> str:
        """One line a reader can check against the tables."""
        if not self.judged_points:
            return "; ".join(self.notes) or "no data"
        first, last = self.judged_points[0], self.judged_points[-1]
        parts = [f"{first.describe(self.metric)} -> {last.describe(self.metric)}"]
        if self.slope_per_decade is not None and self.slope_ci is not None:
            mde = (f" (smallest detectable trend {self.trend_mde:.3g})"
                   if self.trend_mde is not None and math.isfinite(self.trend_mde) else "")
            parts.append(f"advantage trend {self.trend_text()} vs ±{self.threshold:.3f}: "
                         f"{TREND_PHRASES[self.trend or 'unresolved']}{mde}")
        if self.p_value is not None:
            parts.append(self.p_text())
        parts.append(f"intervals {confidence_text(self.interval_level)}")
        return "; ".join(parts + self.notes)


def confidence_text(alpha: float) -> str:
    """The confidence of a two-sided ``alpha`` interval, with the digits that tell its miss: "99.84 %", "97.5 %"."""
    decimals = max(1, 1 - math.floor(math.log10(100 * alpha))) if 0 < alpha < 1 else 1
    return f"{100 * (1 - alpha):.{decimals}f} %"


def stance(low: float, high: float, margin: float) -> str:
    """Where an interval of the difference lies relative to the equivalence margin (see the module doc)."""
    if high < -margin:
        return "ahead"
    if low > margin:
        return "behind"
    if -margin <= low and high <= margin:
        return "level"
    return "no difference"


def _compare(size: str, pairs: Pairs, spec: MetricSpec, alpha: float,
             pooled: tuple[float | None, int] = (None, 0)) -> SizeComparison:
    """One size's comparison at level ``alpha`` (:func:`hf_optbench.measure.verdict_stats.estimate`), with its
    stance."""
    e: Estimate = estimate(pairs, spec, alpha, pooled)
    return SizeComparison(
        size, pairs.num_params, e.gap, e.spread, e.low, e.high, stance(e.low, e.high, spec.margin), e.n_pairs,
        e.mean_optimizer, e.mean_baseline, e.censored_pairs, alpha, spec.margin, spec.higher_is_better, e.bounded,
        e.p_ahead, e.p_behind)


def _judge(cell: Cell[MetricSpec], alpha: float) -> Verdict:
    """The cell's verdict with both its tests at ``alpha / 2``."""
    spec, sizes, notes = cell.spec, cell.judged, list(cell.notes)
    shown = [dataclasses.replace(_compare(s, p, spec, alpha / 2, cell.pooled), transient=s in cell.transient)
             for s, p in cell.sizes.items()]
    if len(sizes) < 2:
        pts = shown  # the one judged point, and any transient ones beside it
        zero_sizes = {n.split(" ")[0] for n in notes if "ratio 0" in n}
        # e.g. SGD without momentum keeps no state: a 100 % saving at every size, which no ratio can express
        label = "holds" if not pts and len(zero_sizes) >= 2 else "insufficient data"
        return Verdict(cell.optimizer, spec, label, pts, notes=notes, level=alpha)
    points = [p for p in shown if not p.transient]
    # "level" at every size is an equivalence claim (TOST at alpha/2 per size); it is never a false difference
    all_level = all(p.stance == "level" for p in points)
    slope, ci, change, threshold, trend_p, spread = None, None, None, None, (1.0, 1.0), None
    if cell.trend is not None:
        tr = cell.trend
        slope, threshold, change = tr.slope, tr.threshold(spec.margin), tr.slope * tr.span
        ci = tr.interval(alpha)  # at alpha / 2
        trend_p = tr.p_values(spec.margin)
        spread = (tr.sd, tr.seeds)
    direction = trend_direction(ci, threshold)
    censored = sum(p.censored_pairs for p in points)
    if censored:
        notes.append(f"{censored} pair(s) include {spec.censored_means}")
    return Verdict(cell.optimizer, spec, classify(points, direction, all_level), shown, slope, ci, change, threshold,
                   notes, cell.p_value(), alpha, trend_p, trend=direction if cell.trend is not None else None,
                   trend_spread=spread)


def verdict_for(observations: Iterable[Observation], optimizer: str, spec: MetricSpec, *,
                baseline: str = BASELINE, alpha: float = ALPHA) -> Verdict:
    """The verdict for one optimizer and one metric on its own (a family of one cell, at ``alpha``)."""
    return _judge(build_cell(observations, optimizer, spec, baseline), alpha)


@dataclass(frozen=True)
class Family:
    """One slice of the verdict table, judged along one axis: ``records`` whose ``model_size`` and ``num_params``
    are the axis's points (sizes and parameter counts; on the data axis, ratio labels and tokens per parameter),
    ``at`` where on the other axis, the ``metrics`` it judges, its ``unmeasurable`` cells (see :func:`verdict`) and
    its ``transient`` points (labels as in ``model_size``: shown, left out of every trend and test)."""

    records: Sequence[Mapping[str, object]]
    axis: str = SIZE_AXIS
    at: str = ""
    metrics: Sequence[MetricSpec] = METRICS
    unmeasurable: Mapping[tuple[str, str], str] = field(default_factory=dict)
    transient: frozenset[str] = frozenset()


def verdict(records: Sequence[Mapping[str, object]], *, baseline: str = BASELINE,
            metrics: Sequence[MetricSpec] = METRICS, alpha: float = ALPHA,
            unmeasurable: Mapping[tuple[str, str], str] | None = None, report: ReportSpec | None = None,
            transient: frozenset[str] = frozenset()) -> list[Verdict]:
    """All verdicts along model size: every optimizer other than ``baseline`` x every metric, with Holm's control of
    the family-wise error over the table (see the module doc); a table of one :class:`Family`.

    ``records``: one mapping per run with ``optimizer``, ``model_size``, ``num_params``, ``seed`` and the metric
    keys (missing or None = not measured; ``<key>_censored`` true = the value is a bound, ``<key>_bound`` "above"
    or "below" which way). Failed runs should be left out by the caller. ``unmeasurable``: {(optimizer, metric
    key): reason} for cells this machine cannot measure (wall-clock figures under load or sharing): they get
    "not measurable here" and stay out of the family.
    """
    return verdict_table([Family(records, metrics=metrics, unmeasurable=dict(unmeasurable or {}),
                                 transient=transient)], baseline=baseline, alpha=alpha, report=report)


def verdict_table(families: Sequence[Family], *, baseline: str = BASELINE, alpha: float = ALPHA,
                  report: ReportSpec | None = None) -> list[Verdict]:
    """Every family's verdicts, with Holm's procedure over the testable cells of all of them at once (the whole
    table, both axes: the module doc), or, given a ``report`` spec, over its primary cells (``report.primary``: each
    a metric along an axis) and, separately, over the rest (:mod:`hf_optbench.measure.primary`). Each verdict says
    its ``axis``, ``at`` and ``tier``."""
    cells: list[tuple[Cell[MetricSpec], Family]] = []
    out: list[Verdict | None] = []
    for fam in families:
        optimizers = sorted({str(r["optimizer"]) for r in fam.records} - {baseline})
        for spec in fam.metrics:
            if spec.baseline_value is not None and not any(_num(r.get(spec.key)) is not None for r in fam.records):
                continue  # a relative metric nobody measured (a speedup needs the baseline's ladder)
            obs = [_observation(r, spec) for r in fam.records]
            for name in optimizers:
                if (name, spec.key) in fam.unmeasurable:
                    out.append(Verdict(name, spec, NOT_MEASURABLE, notes=[fam.unmeasurable[(name, spec.key)]],
                                       axis=fam.axis, at=fam.at))
                    continue
                cells.append((build_cell(obs, name, spec, baseline, fam.transient), fam))
                out.append(None)
    tiers = ["" if report is None else PRIMARY if report.is_primary(c.spec.key, fam.axis) else SECONDARY
             for c, fam in cells]
    p_values = [c.p_value() for c, _ in cells]
    levels, family = [ALPHA] * len(cells), {}
    for tier in dict.fromkeys(tiers):
        idx = [i for i, t in enumerate(tiers) if t == tier]
        family[tier] = sum(p_values[i] is not None for i in idx)
        for i, level in zip(idx, holm_levels([p_values[i] for i in idx], alpha), strict=True):
            levels[i] = level
    judged = []
    for (c, fam), level, tier in zip(cells, levels, tiers, strict=True):
        v = _judge(c, level)
        v.family, v.axis, v.at, v.tier = family[tier], fam.axis, fam.at, tier
        judged.append(v)
    it = iter(judged)
    return [v if v is not None else next(it) for v in out]


def ratio_label(tpp: float) -> str:
    """A data ratio as the tables write it: "0.5 tok/param"."""
    return f"{tpp:g} tok/param"


def grid_families(records: Sequence[Mapping[str, object]], *, metrics: Sequence[MetricSpec] = METRICS,
                  unmeasurable: Callable[[Sequence[Mapping[str, object]]], Mapping[tuple[str, str], str]] | None = None,
                  key: str = "budget_tpp", transient: frozenset[tuple[str, float]] = frozenset()) -> list[Family]:
    """The families of a sweep over model sizes and data ratios (``records[key]``: a run's tokens per parameter
    budget; None everywhere: one ratio, one family as :func:`verdict` judges it): the size axis at each ratio every
    size ran, and the data axis at each size (its points the ratios, at ``num_params`` = tokens per parameter; the
    metrics of :data:`DATA_QUESTIONS`). ``unmeasurable(records)`` gives each family's unmeasurable cells;
    ``transient``: the (size, ratio) cells left out of every trend and test (shown all the same)."""
    def skip(rows: Sequence[Mapping[str, object]]) -> dict[tuple[str, str], str]:
        return dict(unmeasurable(rows)) if unmeasurable is not None else {}

    ratios = sorted({float(r[key]) for r in records if r.get(key) is not None})  # type: ignore[arg-type]
    if not ratios:
        return [Family(records, metrics=metrics, unmeasurable=skip(records))]
    params: dict[str, float] = {}
    for r in records:
        params.setdefault(str(r["model_size"]), float(r["num_params"]))  # type: ignore[arg-type]
    sizes = sorted(params, key=params.__getitem__)
    out = []
    for tpp in ratios:
        rows = [r for r in records if r.get(key) == tpp]
        if {str(r["model_size"]) for r in rows} == set(sizes):
            out.append(Family(rows, SIZE_AXIS, ratio_label(tpp), metrics, skip(rows),
                              frozenset(s for s, t in transient if t == tpp)))
    along = [m for m in metrics if m.question in DATA_QUESTIONS]
    for size in sizes:
        rows = [{**r, "model_size": ratio_label(float(r[key])), "num_params": float(r[key])}  # type: ignore[arg-type]
                for r in records if str(r["model_size"]) == size and r.get(key) is not None]
        out.append(Family(rows, DATA_AXIS, size, along, skip(rows),
                          frozenset(ratio_label(t) for s, t in transient if s == size)))
    return out


def _observation(r: Mapping[str, object], spec: MetricSpec) -> Observation:
    bound = r.get(f"{spec.key}_bound")
    return Observation(str(r["optimizer"]), str(r["model_size"]), float(r["num_params"]),  # type: ignore[arg-type]
                       int(r.get("seed", 0) or 0), _num(r.get(spec.key)),  # type: ignore[arg-type]
                       bool(r.get(f"{spec.key}_censored", False)),
                       bound if bound in ("above", "below") else None)  # type: ignore[arg-type]


def _num(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
