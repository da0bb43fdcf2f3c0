"""The verdict's statistics on plain numbers: paired differences, one point's estimate, the per-seed trend, one
cell's p-value and Holm's levels over a table. The words drawn from them are :mod:`hf_optbench.measure.verdict_words`;
the types a reader sees (a point's comparison, a cell's verdict) and the table are :mod:`hf_optbench.measure.verdict`.

The rule (every metric is "lower is better": bytes, tokens, seconds, loss, spikes, divergences)
-----------------------------------------------------------------------------------------------
Runs with the same seed share the model's initial weights and the data order (tests/test_run.py checks it), so
an optimizer O is compared with the baseline B (AdamW) **per seed**: at each size s and seed i the paired
difference is ``d_si = log m_O - log m_B`` for ratio metrics (``exp(d)`` is the ratio; below 1 is better) and
``d_si = m_O - m_B`` for difference metrics (spikes per 1k steps, divergence), whose values can be 0.

* **At one size**: the mean of the n paired differences, with a Student-t confidence interval (n - 1 degrees of
  freedom; :mod:`hf_optbench.measure.intervals`). A size where some pairs are *bounds* (a speedup beyond the
  ladder, a run that never reached the target) gets no mean and no t interval of bounds: the censored-normal
  likelihood gives its estimate and interval (:func:`hf_optbench.measure.intervals.censored_fit`), judged with the
  spread pooled over the sizes measured without bounds where every pair is a bound.
* **The trend**: for each seed, the least-squares slope of its paired differences on log10(parameters); the mean
  of those per-seed slopes, with its own t interval, is the trend per decade (seeds with a bound at some size are
  left out: a slope through a bound is no slope). Taking one slope per seed keeps the pairing and needs no
  assumption that the noise is equal across sizes. Its threshold is ``margin / decades spanned`` (a change of at
  least the margin across the sizes run).
* **Error control over the whole table.** One cell (an optimizer x a metric) makes a difference claim when the
  largest size's test or the trend's test rejects; its p-value is ``2 min(p_largest, p_trend)`` (Bonferroni over
  its two tests). Across the table's cells Holm's step-down procedure (Holm 1979) holds the chance of *any* false
  difference claim in the table at the table's level: the cells are tested in order of their p-values, the k-th
  at ``alpha / (m - k + 1)``, and each cell's verdict is computed at the level it was tested at (both of its tests
  at half of it).

A metric is read through :class:`Scale` (its ``mode``, ``margin``, ``higher_is_better`` and ``baseline_value``) and
a run's value through :class:`Point`, so these functions need neither the verdict's types nor its records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from hf_optbench.measure.intervals import Censor, censored_fit, t_interval, t_p_values, t_quantile


class Scale(Protocol):
    """How a metric's values are compared (``measure.verdict.MetricSpec``): as log-ratios (``mode`` "ratio") or
    plain gaps, the equivalence ``margin`` on that scale, which way is better, and the constant every seed's
    baseline has where the metric is already relative to the baseline (a speedup)."""

    @property
    def mode(self) -> str: ...

    @property
    def margin(self) -> float: ...

    @property
    def higher_is_better(self) -> bool: ...

    @property
    def baseline_value(self) -> float | None: ...


class Point(Protocol):
    """One run's value of one metric (``measure.verdict.Observation``); ``direction``: which way a censored value
    is a bound ("above" or "below"), None for a measurement."""

    @property
    def optimizer(self) -> str: ...

    @property
    def model_size(self) -> str: ...

    @property
    def num_params(self) -> float: ...

    @property
    def seed(self) -> int: ...

    @property
    def value(self) -> float | None: ...

    @property
    def direction(self) -> Literal["above", "below"] | None: ...


def fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs (two sums: no numpy needed)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def difference(o: float, b: float, scale: Scale) -> float:
    """The paired difference, oriented so that negative is always better for the optimizer."""
    d = math.log(o) - math.log(b) if scale.mode == "ratio" else o - b
    return -d if scale.higher_is_better else d


def _flag(o: Literal["above", "below"] | None, b: Literal["above", "below"] | None,
          scale: Scale) -> Censor | Literal["both"]:
    """Which way a pair's oriented difference is a bound, from the directions of the optimizer's (``o``) and the
    baseline's (``b``) values: the optimizer's value at least its record raises the gap ("lower": the true gap is at
    least it), the baseline's lowers it; both ways cancel out ("both": no information); higher-is-better metrics
    flip."""
    sides = set()
    for direction, sign in ((o, 1), (b, -1)):
        if direction is not None:
            up = (direction == "above") == (sign == 1)
            sides.add("lower" if up != scale.higher_is_better else "upper")
    if not sides:
        return None
    return sides.pop() if len(sides) == 1 else "both"


@dataclass
class Pairs:
    """Paired values of one size: seed -> (optimizer value, baseline value, censoring of the difference)."""

    num_params: float
    by_seed: dict[int, tuple[float, float, Censor]] = field(default_factory=dict)


# (value, direction) of one run, keyed by (size, seed, optimizer)
_Values = Mapping[tuple[str, int, str], tuple[float, Literal["above", "below"] | None]]


def _usable(values: _Values, size: str, seed: int, optimizer: str, baseline: str, scale: Scale,
            notes: list[str]) -> tuple[float, float, Censor] | None:
    o, b = values.get((size, seed, optimizer)), values.get((size, seed, baseline))
    if o is None or b is None:
        return None
    if scale.mode == "ratio" and (o[0] <= 0 or b[0] <= 0):
        stateless = o[0] == 0 and b[0] > 0
        notes.append(f"{size} seed {seed}: " + (f"ratio 0 ({optimizer} measures 0)" if stateless
                                                else "non-positive value, no ratio"))
        return None
    flag = _flag(o[1], b[1], scale)
    if flag == "both":
        notes.append(f"{size} seed {seed}: both runs are bounds, the pair carries no information")
        return None
    return o[0], b[0], flag


def collect_pairs(observations: Iterable[Point], optimizer: str, baseline: str, scale: Scale,
                  notes: list[str]) -> dict[str, Pairs]:
    """Pair the optimizer's and the baseline's values by (size, seed), sizes in order of parameters; non-usable
    values and sizes with fewer than two pairs become notes."""
    values: dict[tuple[str, int, str], tuple[float, Literal["above", "below"] | None]] = {}
    params: dict[str, float] = {}
    for ob in observations:
        if ob.optimizer == optimizer or (ob.optimizer == baseline and scale.baseline_value is None):
            params.setdefault(ob.model_size, float(ob.num_params))
            if ob.value is not None and not math.isnan(ob.value):
                values[(ob.model_size, ob.seed, ob.optimizer)] = (ob.value, ob.direction)
                if scale.baseline_value is not None:  # a metric relative to the baseline: its value is a constant
                    values[(ob.model_size, ob.seed, baseline)] = (scale.baseline_value, None)
    out: dict[str, Pairs] = {}
    for size in sorted(params, key=params.__getitem__):
        pairs = Pairs(params[size])
        for seed in sorted({k[1] for k in values if k[0] == size}):
            pair = _usable(values, size, seed, optimizer, baseline, scale, notes)
            if pair is not None:
                pairs.by_seed[seed] = pair
        if len(pairs.by_seed) < 2:
            notes.append(f"{size}: {len(pairs.by_seed)} paired seed(s), needs 2")
            continue
        out[size] = pairs
    return out


def pooled_spread(sizes: Mapping[str, Pairs], scale: Scale) -> tuple[float | None, int]:
    """(pooled sd, degrees of freedom) of the paired differences of the sizes measured without bounds: the spread
    a size made only of bounds is judged by."""
    ss, df = 0.0, 0
    for p in sizes.values():
        if any(f is not None for _, _, f in p.by_seed.values()):
            continue
        diffs = [difference(o, b, scale) for o, b, _ in p.by_seed.values()]
        m = statistics.fmean(diffs)
        ss += sum((d - m) ** 2 for d in diffs)
        df += len(diffs) - 1
    return (math.sqrt(ss / df), df) if df > 0 and ss > 0 else (None, 0)


@dataclass(frozen=True)
class Estimate:
    """One size's paired estimate at one level: the gap (mean paired difference, or the censored-normal estimate
    where some pairs are bounds; where every pair is a bound on one side, the weakest bound, ``bounded`` saying
    which way), its spread and interval, the one-sided p-values of "beyond -margin" and "beyond +margin", the
    pairs and how many of them are bounds, and each side's mean value."""

    gap: float
    spread: float
    low: float
    high: float
    p_ahead: float
    p_behind: float
    bounded: Censor
    n_pairs: int
    censored_pairs: int
    mean_optimizer: float
    mean_baseline: float

    @property
    def p_value(self) -> float:
        """Two-sided p-value of a difference beyond the margin (ahead or behind)."""
        return min(1.0, 2.0 * min(self.p_ahead, self.p_behind))


def estimate(pairs: Pairs, scale: Scale, alpha: float, pooled: tuple[float | None, int] = (None, 0)) -> Estimate:
    """One size's estimate at level ``alpha``: the t interval of measured pairs, the censored-normal fit where some
    pairs are bounds (``pooled``: :func:`pooled_spread`)."""
    diffs = [difference(o, b, scale) for o, b, _ in pairs.by_seed.values()]
    flags = [f for _, _, f in pairs.by_seed.values()]
    n, bounded = len(diffs), None
    if any(f is not None for f in flags):
        fit = censored_fit(diffs, flags, *pooled)
        gap, sd = fit.estimate, fit.sd
        low, high = fit.interval(alpha)
        p_ahead, p_behind = fit.p_values(scale.margin)
        if not math.isfinite(gap):  # every pair a bound on one side: the weakest bound is what every seed shows
            bounded = flags[0]
            gap = max(diffs) if bounded == "upper" else min(diffs)
    else:
        gap, sd, low, high = t_interval(diffs, alpha)
        p_ahead, p_behind = t_p_values(gap, sd, n, scale.margin)
    return Estimate(gap, sd, low, high, p_ahead, p_behind, bounded, n, sum(f is not None for f in flags),
                    statistics.fmean(o for o, _, _ in pairs.by_seed.values()),
                    statistics.fmean(b for _, b, _ in pairs.by_seed.values()))


@dataclass(frozen=True)
class Trend:
    """The mean per-seed slope per decade, the sd of the per-seed slopes, the seeds used and the decades spanned."""

    slope: float
    sd: float
    seeds: int
    span: float

    def threshold(self, margin: float) -> float:
        """The slope beyond which a trend counts: the margin over the decades spanned."""
        return margin / self.span

    def p_values(self, margin: float) -> tuple[float, float]:
        """One-sided p of a favourable / unfavourable trend beyond ``±threshold``."""
        return t_p_values(self.slope, self.sd, self.seeds, self.threshold(margin))

    def interval(self, alpha: float) -> tuple[float, float]:
        """The slope's t interval at the two-sided level ``alpha / 2`` (the trend is one of a cell's two tests)."""
        width = t_quantile(1 - alpha / 4, self.seeds - 1) * self.sd / math.sqrt(self.seeds)
        return self.slope - width, self.slope + width


def seed_trend(sizes: Mapping[str, Pairs], scale: Scale, notes: list[str]) -> Trend | None:
    """The trend along the sizes (:class:`Trend`); None with < 2 seeds observed at two or more sizes. Seeds with a
    bound at some size are left out (a slope through a bound is no slope), and said."""
    seeds = sorted({s for p in sizes.values() for s in p.by_seed})
    slopes, span, dropped = [], 0.0, 0
    for seed in seeds:
        if any(p.by_seed[seed][2] is not None for p in sizes.values() if seed in p.by_seed):
            dropped += 1
            continue
        xs = [math.log10(p.num_params) for p in sizes.values() if seed in p.by_seed]
        ys = [difference(*p.by_seed[seed][:2], scale) for p in sizes.values() if seed in p.by_seed]
        if len(xs) >= 2 and max(xs) > min(xs):
            slopes.append(fit_slope(xs, ys))
            span = max(span, max(xs) - min(xs))
    if dropped:
        notes.append(f"trend from {len(slopes)} seed(s): {dropped} seed(s) with a bound at some size left out")
    if len(slopes) < 2:
        return None
    return Trend(statistics.fmean(slopes), statistics.stdev(slopes), len(slopes), span)


S = TypeVar("S", bound=Scale)


@dataclass
class Cell(Generic[S]):
    """One cell's data (an optimizer x a metric ``spec``), ready to be judged at any level: its sizes' pairs, the
    pooled spread and the trend."""

    optimizer: str
    spec: S
    sizes: dict[str, Pairs]
    notes: list[str]
    trend: Trend | None
    pooled: tuple[float | None, int]
    transient: frozenset[str] = frozenset()  # points shown but left out of the trend and the cell's test

    @property
    def judged(self) -> dict[str, Pairs]:
        """The points the cell's tests use: every point but the transient ones."""
        return {s: p for s, p in self.sizes.items() if s not in self.transient}

    def p_value(self) -> float | None:
        """2 min(p of the largest size's difference, p of the trend): None without two sizes to judge."""
        judged = self.judged
        if len(judged) < 2:
            return None
        p = estimate(list(judged.values())[-1], self.spec, 1.0, self.pooled).p_value
        if self.trend is not None:
            fav, unfav = self.trend.p_values(self.spec.margin)
            p = min(p, min(1.0, 2.0 * min(fav, unfav)))
        return min(1.0, 2.0 * p)


def build_cell(observations: Iterable[Point], optimizer: str, spec: S, baseline: str,
               transient: frozenset[str] = frozenset()) -> Cell[S]:
    """The optimizer's cell against ``baseline``: its pairs, trend and pooled spread, the ``transient`` points shown
    but left out of the trend and the test."""
    notes: list[str] = []
    sizes = collect_pairs(list(observations), optimizer, baseline, spec, notes)
    left_out = frozenset(s for s in sizes if s in transient)
    judged = {s: p for s, p in sizes.items() if s not in left_out}
    if left_out:
        notes.append(f"transient (left out of the trend and the cell's test): {', '.join(s for s in sizes if s in left_out)}")
    trend = seed_trend(judged, spec, notes) if len(judged) >= 2 else None
    return Cell(optimizer, spec, sizes, notes, trend, pooled_spread(judged, spec), left_out)


def holm_levels(p_values: Sequence[float | None], alpha: float) -> list[float]:
    """The level each test is judged at under Holm's step-down procedure (Holm 1979): in order of p-value, the
    k-th (from 0) of m at ``alpha / (m - k)`` while each rejects; from the first that does not, every later one at
    that level (so none of them rejects). A test without a p-value (None) is not in the family."""
    order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(order)
    levels = [alpha] * len(p_values)
    stop = None
    for k, (p, i) in enumerate(order):
        level = alpha / (m - k)
        if stop is None and p > level:
            stop = level
        levels[i] = level if stop is None else stop
    return levels
