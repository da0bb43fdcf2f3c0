"""The scaling verdict: does an optimizer's advantage over the baseline hold, grow or shrink with model size?

The question behind the benchmark: if growing the model shrinks an optimizer's saving in memory, convergence
speed or stability, the optimizer should not be used for large-scale pretraining. This module turns per-run
numbers into that answer with paired statistics, so the answer can be tested on simulated data
(tests/measure/test_verdict_rates.py measures its false-verdict rate on data with no true difference).

The rule (every metric is "lower is better": bytes, tokens, seconds, loss, spikes, divergences)
-----------------------------------------------------------------------------------------------
Runs with the same seed share the model's initial weights and the data order (tests/test_run.py checks it), so
an optimizer O is compared with the baseline B (AdamW) **per seed**: at each size s and seed i the paired
difference is ``d_si = log m_O - log m_B`` for ratio metrics (``exp(d)`` is the ratio; below 1 is better) and
``d_si = m_O - m_B`` for difference metrics (spikes per 1k steps, divergence), whose values can be 0.

* **At one size**: the mean of the n paired differences, with a Student-t confidence interval (n - 1 degrees of
  freedom). The optimizer is **ahead** when the whole interval lies below ``-margin``, **behind** when it lies
  above ``+margin``, **level** when it lies inside ``[-margin, +margin]`` (an equivalence test: a 0.1 % gap
  measured with no noise is level, not a difference), and **no difference** otherwise. ``margin`` is 2 % for
  ratios and a per-metric floor for differences (1 spike / 1k steps; 0.2 of the seeds diverging).
* **The trend**: for each seed, the least-squares slope of its paired differences on log10(parameters); the mean
  of those per-seed slopes, with its own t interval, is the trend per decade. Taking one slope per seed keeps the
  pairing and needs no assumption that the noise is equal across sizes. The trend is **significant** when its
  interval lies wholly beyond ``margin / decades spanned`` on one side (a change of at least the margin across
  the sizes run).
* The size-level interval is taken at the largest size only, and both tests run at ``alpha / 2`` (Bonferroni),
  so on data with no true difference the chance of any verdict other than "no difference" / "level" is at most
  ``alpha`` (5 %).

The verdicts (one per optimizer and metric)
-------------------------------------------
``grows``            significant favourable trend, ahead at the largest size: the advantage increases with size.
``holds``            no significant trend, ahead at the largest size.
``shrinks``          significant unfavourable trend (the advantage decreases, or a deficit deepens).
``deficit vanishes`` significant favourable trend from behind at the smallest size to level / no difference at
                     the largest: the optimizer catches up, it does not pull ahead.
``behind``           worse than the baseline at the largest size, with no significant favourable trend.
``level``            equivalent to the baseline (within the margin) at every size.
``no difference``    none of the above: the data do not show a difference.
``insufficient data`` fewer than two sizes with two or more paired seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

VERDICTS = ("grows", "holds", "shrinks", "deficit vanishes", "behind", "level", "no difference",
            "insufficient data")
VERDICT_MEANINGS = {
    "grows": "significant favourable trend with model size, and ahead of the baseline at the largest size",
    "holds": "ahead of the baseline at the largest size, no significant trend with model size",
    "shrinks": "significant unfavourable trend: the advantage decreases (or the deficit deepens) as models grow",
    "deficit vanishes": "behind at the smallest size, a significant favourable trend, not behind at the largest",
    "behind": "worse than the baseline at the largest size, no significant favourable trend",
    "level": "equivalent to the baseline within the margin at every size",
    "no difference": "the data do not show a difference or a trend",
    "insufficient data": "fewer than two sizes with two or more seeds paired with the baseline",
}
STANCES = ("ahead", "behind", "level", "no difference")
ALPHA = 0.05  # family-wise: split between the trend test and the largest-size test (Bonferroni)
RATIO_MARGIN = math.log(1.02)


@dataclass(frozen=True)
class MetricSpec:
    """One compared quantity. ``mode`` ratio: positive values compared as log-ratios; difference: plain gaps.
    ``margin``: the smallest difference that counts (equivalence margin), on the log scale for ratios."""

    key: str
    question: Literal["memory", "convergence", "stability"]
    label: str
    mode: Literal["ratio", "difference"] = "ratio"
    margin: float = RATIO_MARGIN


# The metrics the report compares (keys of the per-run records the report builds from summary.json).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("optimizer_state_bytes", "memory", "optimizer state"),
    MetricSpec("peak_memory_bytes", "memory", "peak memory"),
    MetricSpec("tokens_to_target", "convergence", "tokens to target loss"),
    MetricSpec("seconds_to_target", "convergence", "seconds to target loss"),
    MetricSpec("final_eval_loss", "convergence", "final eval loss"),
    # One spike per 1k steps and one diverged seed in five are the smallest gaps worth a word.
    MetricSpec("loss_spikes_per_1k", "stability", "loss spikes / 1k steps", "difference", 1.0),
    MetricSpec("diverged", "stability", "diverged fraction", "difference", 0.2),
)


@dataclass(frozen=True)
class Observation:
    """One run's value of one metric (None: not measured). ``censored``: the value is a bound (a run that never
    reached a target counts at its budget), which the evidence line reports."""

    optimizer: str
    model_size: str
    num_params: float
    seed: int
    value: float | None
    censored: bool = False


@dataclass
class SizeComparison:
    """Optimizer vs baseline at one model size, paired by seed."""

    model_size: str
    num_params: float
    gap: float  # mean paired log-ratio (ratio mode) or difference
    spread: float  # sample standard deviation of the paired differences
    ci_low: float
    ci_high: float
    stance: str  # one of STANCES
    n_pairs: int
    mean_optimizer: float
    mean_baseline: float
    censored_pairs: int = 0

    @property
    def significant(self) -> bool:
        """A difference beyond the margin, with confidence (ahead or behind)."""
        return self.stance in ("ahead", "behind")

    def ratio(self) -> float:
        """exp(gap) for ratio metrics: the figure a reader expects (0.5 = half the baseline)."""
        return math.exp(self.gap)


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

    @property
    def evidence(self) -> str:
        """One line a reader can check against the tables."""
        if not self.points:
            return "; ".join(self.notes) or "no data"
        first, last = self.points[0], self.points[-1]
        fmt = (lambda p: f"{p.ratio():.3g} [{math.exp(p.ci_low):.3g}, {math.exp(p.ci_high):.3g}]") \
            if self.metric.mode == "ratio" else (lambda p: f"{p.gap:+.3g} [{p.ci_low:+.3g}, {p.ci_high:+.3g}]")
        kind = "ratio" if self.metric.mode == "ratio" else "gap"
        parts = [f"{kind} {fmt(first)} ({first.model_size}, {first.stance}) -> {fmt(last)} "
                 f"({last.model_size}, {last.stance})"]
        if self.slope_per_decade is not None and self.slope_ci is not None:
            parts.append(f"trend {self.slope_per_decade:+.3f}/decade [{self.slope_ci[0]:+.3f}, "
                         f"{self.slope_ci[1]:+.3f}] vs +-{self.threshold:.3f}")
        return "; ".join(parts + self.notes)


def t_interval(values: Sequence[float], alpha: float) -> tuple[float, float, float, float]:
    """(mean, sample sd, low, high): the two-sided (1 - alpha) Student-t interval of the mean (scipy's t quantile).
    A single value has no interval: (-inf, inf)."""
    from scipy.stats import t as student_t

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), -math.inf, math.inf
    sd = statistics.stdev(values)
    half = float(student_t.ppf(1 - alpha / 2, len(values) - 1)) * sd / math.sqrt(len(values))
    return mean, sd, mean - half, mean + half


def stance(low: float, high: float, margin: float) -> str:
    """Where an interval of the difference lies relative to the equivalence margin (see the module doc)."""
    if high < -margin:
        return "ahead"
    if low > margin:
        return "behind"
    if -margin <= low and high <= margin:
        return "level"
    return "no difference"


def _fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs (two sums: no numpy needed)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def _difference(o: float, b: float, spec: MetricSpec) -> float:
    return math.log(o) - math.log(b) if spec.mode == "ratio" else o - b


@dataclass
class _Pairs:
    """Paired values of one size: seed -> (optimizer value, baseline value, censored)."""

    num_params: float
    by_seed: dict[int, tuple[float, float, bool]] = field(default_factory=dict)


def _collect(observations: Iterable[Observation], optimizer: str, baseline: str, spec: MetricSpec,
             notes: list[str]) -> dict[str, _Pairs]:
    """Pair the optimizer's and the baseline's values by (size, seed); non-usable values become notes."""
    values: dict[tuple[str, int, str], Observation] = {}
    params: dict[str, float] = {}
    for ob in observations:
        if ob.optimizer in (optimizer, baseline):
            params.setdefault(ob.model_size, float(ob.num_params))
            if ob.value is not None and not math.isnan(ob.value):
                values[(ob.model_size, ob.seed, ob.optimizer)] = ob
    out: dict[str, _Pairs] = {}
    for size in sorted(params, key=params.__getitem__):
        pairs = _Pairs(params[size])
        seeds = sorted({k[1] for k in values if k[0] == size})
        for seed in seeds:
            o, b = values.get((size, seed, optimizer)), values.get((size, seed, baseline))
            if o is None or b is None:
                continue
            if spec.mode == "ratio" and (o.value <= 0 or b.value <= 0):
                stateless = o.value == 0 and b.value > 0
                notes.append(f"{size} seed {seed}: " + (f"ratio 0 ({optimizer} measures 0)" if stateless
                                                        else "non-positive value, no ratio"))
                continue
            pairs.by_seed[seed] = (o.value, b.value, o.censored or b.censored)
        if len(pairs.by_seed) < 2:
            notes.append(f"{size}: {len(pairs.by_seed)} paired seed(s), needs 2")
            continue
        out[size] = pairs
    return out


def _compare(size: str, pairs: _Pairs, spec: MetricSpec, alpha: float) -> SizeComparison:
    diffs = [_difference(o, b, spec) for o, b, _ in pairs.by_seed.values()]
    mean, sd, low, high = t_interval(diffs, alpha)
    return SizeComparison(
        size, pairs.num_params, mean, sd, low, high, stance(low, high, spec.margin), len(diffs),
        statistics.fmean(o for o, _, _ in pairs.by_seed.values()),
        statistics.fmean(b for _, b, _ in pairs.by_seed.values()),
        sum(c for _, _, c in pairs.by_seed.values()))


def _trend(sizes: dict[str, _Pairs], spec: MetricSpec, alpha: float
           ) -> tuple[float, tuple[float, float], float, int] | None:
    """(mean per-seed slope per decade, its t interval, the decades spanned, seeds used); None with < 2 seeds
    observed at two or more sizes."""
    seeds = sorted({s for p in sizes.values() for s in p.by_seed})
    slopes, span = [], 0.0
    for seed in seeds:
        xs = [math.log10(p.num_params) for p in sizes.values() if seed in p.by_seed]
        ys = [_difference(*p.by_seed[seed][:2], spec) for p in sizes.values() if seed in p.by_seed]
        if len(xs) >= 2 and max(xs) > min(xs):
            slopes.append(_fit_slope(xs, ys))
            span = max(span, max(xs) - min(xs))
    if len(slopes) < 2:
        return None
    mean, _, low, high = t_interval(slopes, alpha)
    return mean, (low, high), span, len(slopes)


def classify(points: Sequence[SizeComparison], trend: str, all_level: bool) -> str:
    """The verdict from the largest and smallest sizes' stances and the trend ("favourable" | "unfavourable" |
    "none"); see the module doc."""
    first, last = points[0].stance, points[-1].stance
    if trend == "favourable":
        if last == "ahead":
            return "grows"
        if first == "behind" and last in ("level", "no difference"):
            return "deficit vanishes"
    if trend == "unfavourable":
        return "shrinks"
    if last == "ahead":
        return "holds"
    if last == "behind":
        return "behind"
    if all_level:
        return "level"
    return "no difference"


def verdict_for(observations: Iterable[Observation], optimizer: str, spec: MetricSpec, *,
                baseline: str = "adamw", alpha: float = ALPHA) -> Verdict:
    """The verdict for one optimizer and one metric from per-run observations of it and of the baseline."""
    notes: list[str] = []
    sizes = _collect(list(observations), optimizer, baseline, spec, notes)
    if len(sizes) < 2:
        pts = [_compare(s, p, spec, alpha / 2) for s, p in sizes.items()]
        zero_sizes = {n.split(" ")[0] for n in notes if "ratio 0" in n}
        # e.g. SGD without momentum keeps no state: a 100 % saving at every size, which no ratio can express
        label = "holds" if not pts and len(zero_sizes) >= 2 else "insufficient data"
        return Verdict(optimizer, spec, label, pts, notes=notes)
    # every size's interval at alpha/2, so the largest size's stance (the one the verdict uses) is at alpha/2
    points = [_compare(s, p, spec, alpha / 2) for s, p in sizes.items()]
    # "level" at every size is an equivalence claim (TOST at alpha/2 per size); it is never a false difference
    all_level = all(p.stance == "level" for p in points)
    fitted = _trend(sizes, spec, alpha / 2)
    direction, slope, ci, change, threshold = "none", None, None, None, None
    if fitted is not None:
        slope, ci, span, _ = fitted
        threshold = spec.margin / span
        change = slope * span
        if ci[1] < -threshold:
            direction = "favourable"
        elif ci[0] > threshold:
            direction = "unfavourable"
    censored = sum(p.censored_pairs for p in points)
    if censored:
        notes.append(f"{censored} pair(s) include a run that never reached the target (counted at its budget)")
    return Verdict(optimizer, spec, classify(points, direction, all_level), points, slope, ci, change, threshold,
                   notes)


def verdict(records: Sequence[Mapping[str, object]], *, baseline: str = "adamw",
            metrics: Sequence[MetricSpec] = METRICS, alpha: float = ALPHA) -> list[Verdict]:
    """All verdicts: every optimizer other than ``baseline`` x every metric.

    ``records``: one mapping per run with ``optimizer``, ``model_size``, ``num_params``, ``seed`` and the metric
    keys (missing or None = not measured; ``<key>_censored`` true = the value is the run's budget because the
    run never reached the target). Failed runs should be left out by the caller.
    """
    optimizers = sorted({str(r["optimizer"]) for r in records} - {baseline})
    out = []
    for spec in metrics:
        obs = [Observation(str(r["optimizer"]), str(r["model_size"]), float(r["num_params"]),  # type: ignore[arg-type]
                           int(r.get("seed", 0) or 0), _num(r.get(spec.key)),  # type: ignore[arg-type]
                           bool(r.get(f"{spec.key}_censored", False))) for r in records]
        for name in optimizers:
            out.append(verdict_for(obs, name, spec, baseline=baseline, alpha=alpha))
    return out


def _num(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
