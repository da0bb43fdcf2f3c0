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
  measured with no noise is level, not a difference), and **no difference** otherwise. Each cell also states its
  **minimal detectable effect** (MDE): the smallest true gap it would call ahead or behind with 80 % power, from
  the measured paired spread and the number of seeds (normal approximation to the noncentral t:
  ``margin + (t_{1-a/2} + t_{0.8}) * sd / sqrt(n)``, at the interval's own level), so "no difference (MDE 12 %)"
  says how blind the comparison was.
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
* **The trend**: for each seed, the least-squares slope of its paired differences on log10(parameters); the mean
  of those per-seed slopes, with its own t interval, is the trend per decade. Taking one slope per seed keeps the
  pairing and needs no assumption that the noise is equal across sizes. The trend is **significant** when its
  interval lies wholly beyond ``margin / decades spanned`` on one side (a change of at least the margin across
  the sizes run).
* The size-level interval is taken at the largest size only, and both tests run at ``alpha / 2`` (Bonferroni),
  so on data with no true difference the chance of any verdict other than "no difference" / "level" is at most
  ``alpha`` (5 %).

The verdicts (one per optimizer and metric) and what each means: :data:`VERDICT_MEANINGS`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hf_optbench.rundir import BASELINE

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
SPEEDUP_MARGIN = math.log(1.03)  # see the module doc: a tenth of the ~1.1x gains that recent studies report
LOSS_MARGIN_NATS = 0.01  # see the module doc: hundredths of a nat matter in language modelling
POWER = 0.8  # the power at which each cell's minimal detectable effect is stated


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
    censored_means: str = "a run that never reached the target (counted at its budget)"


# The metrics the report compares (keys of the per-run records the report builds from summary.json).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("optimizer_state_bytes", "memory", "optimizer state"),
    MetricSpec("peak_memory_bytes", "memory", "peak memory"),
    MetricSpec("speedup", "convergence", "speedup (AdamW-equivalent data)", margin=SPEEDUP_MARGIN,
               higher_is_better=True, baseline_value=1.0,
               censored_means="a loss beyond the ladder's range (counted at its end: the speedup is a bound)"),
    MetricSpec("final_eval_loss", "convergence", "final eval loss", "difference", LOSS_MARGIN_NATS, unit="nats"),
    MetricSpec("tokens_to_target", "convergence", "tokens to target loss"),
    MetricSpec("seconds_to_target", "convergence", "seconds to target loss"),
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
    mde: float = math.inf  # minimal detectable effect (|gap| at POWER), on the gap's scale
    higher_is_better: bool = False

    @property
    def significant(self) -> bool:
        """A difference beyond the margin, with confidence (ahead or behind)."""
        return self.stance in ("ahead", "behind")

    def ratio(self) -> float:
        """The figure a reader expects for ratio metrics: exp(gap) (0.5 = half the baseline), or for a
        higher-is-better metric the value itself (a speedup of 1.6)."""
        return math.exp(-self.gap if self.higher_is_better else self.gap)

    def interval(self) -> tuple[float, float]:
        """The interval of :meth:`ratio` (low, high)."""
        if self.higher_is_better:
            return math.exp(-self.ci_high), math.exp(-self.ci_low)
        return math.exp(self.ci_low), math.exp(self.ci_high)

    def describe(self, spec: MetricSpec) -> str:
        """"speedup 1.6 [1.5, 1.7] (midi, ahead)", with the MDE where the stance is "no difference"."""
        if spec.mode == "ratio":
            low, high = self.interval()
            kind = "speedup" if spec.higher_is_better else "ratio"
            text = f"{kind} {self.ratio():.3g} [{low:.3g}, {high:.3g}]"
        else:
            text = f"gap {self.gap:+.3g} [{self.ci_low:+.3g}, {self.ci_high:+.3g}]"
        mde = f", {self.mde_text(spec.mode, spec.unit)}" if self.stance == "no difference" else ""
        return f"{text} ({self.model_size}, {self.stance}{mde})"

    def mde_text(self, mode: str, unit: str = "") -> str:
        """"MDE 12 %" (ratio metrics: the smallest detectable ratio change) or "MDE 0.012 nats"."""
        if not math.isfinite(self.mde):
            return "MDE n/a: one seed"
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

    @property
    def evidence(self) -> str:
        """One line a reader can check against the tables."""
        if not self.points:
            return "; ".join(self.notes) or "no data"
        first, last = self.points[0], self.points[-1]
        parts = [f"{first.describe(self.metric)} -> {last.describe(self.metric)}"]
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
    """The paired difference, oriented so that negative is always better for the optimizer."""
    d = math.log(o) - math.log(b) if spec.mode == "ratio" else o - b
    return -d if spec.higher_is_better else d


def minimal_detectable_effect(sd: float, n: int, alpha: float, margin: float, power: float = POWER) -> float:
    """The smallest true gap an interval at level ``alpha`` (two-sided) from ``n`` paired values with spread ``sd``
    would place wholly beyond ``margin`` with probability ``power`` (normal approximation to the noncentral t);
    inf with fewer than two values."""
    from scipy.stats import t as student_t

    if n < 2 or not math.isfinite(sd):
        return math.inf
    q = float(student_t.ppf(1 - alpha / 2, n - 1)) + float(student_t.ppf(power, n - 1))
    return margin + q * sd / math.sqrt(n)


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
        if ob.optimizer == optimizer or (ob.optimizer == baseline and spec.baseline_value is None):
            params.setdefault(ob.model_size, float(ob.num_params))
            if ob.value is not None and not math.isnan(ob.value):
                values[(ob.model_size, ob.seed, ob.optimizer)] = ob
                if spec.baseline_value is not None:  # a metric relative to the baseline: its value is a constant
                    values[(ob.model_size, ob.seed, baseline)] = Observation(
                        baseline, ob.model_size, ob.num_params, ob.seed, spec.baseline_value)
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
        sum(c for _, _, c in pairs.by_seed.values()),
        minimal_detectable_effect(sd, len(diffs), alpha, spec.margin), spec.higher_is_better)


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
                baseline: str = BASELINE, alpha: float = ALPHA) -> Verdict:
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
        notes.append(f"{censored} pair(s) include {spec.censored_means}")
    return Verdict(optimizer, spec, classify(points, direction, all_level), points, slope, ci, change, threshold,
                   notes)


def verdict(records: Sequence[Mapping[str, object]], *, baseline: str = BASELINE,
            metrics: Sequence[MetricSpec] = METRICS, alpha: float = ALPHA) -> list[Verdict]:
    """All verdicts: every optimizer other than ``baseline`` x every metric.

    ``records``: one mapping per run with ``optimizer``, ``model_size``, ``num_params``, ``seed`` and the metric
    keys (missing or None = not measured; ``<key>_censored`` true = the value is the run's budget because the
    run never reached the target). Failed runs should be left out by the caller.
    """
    optimizers = sorted({str(r["optimizer"]) for r in records} - {baseline})
    out = []
    for spec in metrics:
        if spec.baseline_value is not None and not any(_num(r.get(spec.key)) is not None for r in records):
            continue  # a relative metric nobody measured (a speedup needs the baseline's ladder)
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
