"""The scaling verdict: does an optimizer's advantage over the baseline hold, grow or shrink with model size?

Seed 000's fourth question: "if increasing model parameters diminishes the saving in memory, convergence speed
and stability, the method should not be used in large-scale pretraining". This module turns per-run numbers into
that answer, with nothing but arithmetic, so it can be tested on constructed numbers.

The rule (every metric here is "lower is better": bytes, tokens, seconds, loss, spikes, divergences)
----------------------------------------------------------------------------------------------------------
For an optimizer O, the baseline B (AdamW) and a metric m, at each model size s with N_s parameters:

* ratio metrics (memory, tokens/seconds to target, final loss): the gap is the log-ratio
  ``g_s = mean_seeds(log m_O) - mean_seeds(log m_B)`` (a ratio of geometric means; ``ratio = exp(g_s)``, below 1
  is a saving). Difference metrics (spikes per 1k steps, fraction of seeds that diverged, which can be 0):
  ``g_s = mean(m_O) - mean(m_B)``.
* the seed-to-seed spread at that size is ``spread_s = max(sd_O, sd_B)`` (sample standard deviation over seeds,
  on log values for ratio metrics; 0 with a single seed, which the evidence then says).
* the gap is **significant** at s when ``|g_s| > max(k * spread_s, min_effect)`` (k = 2; ``min_effect`` is
  log(1.02) for ratios, i.e. 2 %, and a per-metric absolute floor for differences).
  No significant size at all -> **"not significant"**: the difference is inside the seed-to-seed spread.
* the **trend**: least squares of g_s on log10(N_s) gives a slope b (per decade of parameters); the fitted change
  across the sizes run is ``delta = b * (log10 N_max - log10 N_min)``. The *advantage* is ``-g`` (a saving is
  positive), so the advantage **"grows"** when ``delta < -threshold`` (the ratio falls as models grow),
  **"shrinks"** when ``delta > threshold``, and **"holds"** otherwise, with
  ``threshold = max(k * max_s spread_s, min_change)``; ``min_change`` is log(1.05) for ratios (a 5 % move of the
  ratio) and a per-metric floor for differences. A trend must exceed both the seed noise and a size that matters.
* fewer than two sizes with data on both sides -> **"insufficient data"**.

"shrinks" is the answer that, by seed 000's rule, argues against the method at scale; an optimizer that is
*worse* than the baseline and gets further behind also reads "shrinks" (its advantage goes down).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

VERDICTS = ("holds", "grows", "shrinks", "not significant", "insufficient data")
K_SIGMA = 2.0
RATIO_MIN_EFFECT = math.log(1.02)
RATIO_MIN_CHANGE = math.log(1.05)


@dataclass(frozen=True)
class MetricSpec:
    """One compared quantity. ``mode`` ratio: positive values compared as log-ratios; difference: plain gaps."""

    key: str
    question: Literal["memory", "convergence", "stability"]
    label: str
    mode: Literal["ratio", "difference"] = "ratio"
    min_effect: float = RATIO_MIN_EFFECT
    min_change: float = RATIO_MIN_CHANGE


# The metrics the report compares (keys of the per-run records the report builds from summary.json).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("optimizer_state_bytes", "memory", "optimizer state"),
    MetricSpec("peak_memory_bytes", "memory", "peak memory"),
    MetricSpec("tokens_to_target", "convergence", "tokens to target loss"),
    MetricSpec("seconds_to_target", "convergence", "seconds to target loss"),
    MetricSpec("final_eval_loss", "convergence", "final eval loss"),
    # One spike per 1k steps and one diverged seed in five are the smallest gaps worth a word.
    MetricSpec("loss_spikes_per_1k", "stability", "loss spikes / 1k steps", "difference", 1.0, 1.0),
    MetricSpec("diverged", "stability", "diverged fraction", "difference", 0.2, 0.2),
)


@dataclass(frozen=True)
class Observation:
    """One run's value of one metric (None: not measured / target not reached)."""

    optimizer: str
    model_size: str
    num_params: float
    seed: int
    value: float | None


@dataclass
class SizeComparison:
    """Optimizer vs baseline at one model size."""

    model_size: str
    num_params: float
    gap: float  # log-ratio (ratio mode) or difference
    spread: float
    significant: bool
    mean_optimizer: float
    mean_baseline: float
    n_optimizer: int
    n_baseline: int

    def ratio(self) -> float:
        """exp(gap) for ratio metrics (the figure a reader expects: 0.5 = half the baseline)."""
        return math.exp(self.gap)


@dataclass
class Verdict:
    optimizer: str
    metric: MetricSpec
    verdict: str
    points: list[SizeComparison] = field(default_factory=list)
    slope_per_decade: float | None = None
    change: float | None = None
    threshold: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> str:
        """One line a reader can check against the tables."""
        if not self.points:
            return "; ".join(self.notes) or "no data"
        first, last = self.points[0], self.points[-1]
        if self.metric.mode == "ratio":
            span = f"ratio {first.ratio():.3g} ({first.model_size}) -> {last.ratio():.3g} ({last.model_size})"
        else:
            span = f"gap {first.gap:+.3g} ({first.model_size}) -> {last.gap:+.3g} ({last.model_size})"
        parts = [span]
        if self.change is not None and self.threshold is not None:
            parts.append(f"fitted change {self.change:+.3f} vs threshold {self.threshold:.3f}")
        return "; ".join(parts + self.notes)


def _spread(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _fit_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs (written out: two sums do not need numpy or scipy)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def compare_size(opt: Sequence[float], base: Sequence[float], spec: MetricSpec, k: float = K_SIGMA
                 ) -> tuple[float, float, bool]:
    """(gap, spread, significant) for one size; values must be positive in ratio mode."""
    if spec.mode == "ratio":
        lo, lb = [math.log(v) for v in opt], [math.log(v) for v in base]
        gap = statistics.fmean(lo) - statistics.fmean(lb)
        spread = max(_spread(lo), _spread(lb))
    else:
        gap = statistics.fmean(opt) - statistics.fmean(base)
        spread = max(_spread(opt), _spread(base))
    return gap, spread, abs(gap) > max(k * spread, spec.min_effect)


def classify(points: Sequence[SizeComparison], spec: MetricSpec, k: float = K_SIGMA
             ) -> tuple[str, float | None, float | None, float | None]:
    """(verdict, slope per decade, fitted change over the observed range, threshold) — see the module doc."""
    if len(points) < 2:
        return "insufficient data", None, None, None
    if not any(p.significant for p in points):
        return "not significant", None, None, None
    xs = [math.log10(p.num_params) for p in points]
    ys = [p.gap for p in points]
    slope = _fit_slope(xs, ys)
    change = slope * (max(xs) - min(xs))
    threshold = max(k * max(p.spread for p in points), spec.min_change)
    if change < -threshold:
        return "grows", slope, change, threshold
    if change > threshold:
        return "shrinks", slope, change, threshold
    return "holds", slope, change, threshold


def verdict_for(observations: Iterable[Observation], optimizer: str, spec: MetricSpec, *,
                baseline: str = "adamw", k: float = K_SIGMA) -> Verdict:
    """The verdict for one optimizer and one metric from per-run observations of it and of the baseline."""
    by_size: dict[str, dict[str, list[float]]] = {}
    params: dict[str, float] = {}
    notes: list[str] = []
    for ob in observations:
        if ob.optimizer not in (optimizer, baseline):
            continue
        params.setdefault(ob.model_size, float(ob.num_params))
        slot = by_size.setdefault(ob.model_size, {optimizer: [], baseline: []})
        if ob.value is None or (isinstance(ob.value, float) and math.isnan(ob.value)):
            continue
        slot[ob.optimizer].append(float(ob.value))
    points: list[SizeComparison] = []
    stateless_sizes = 0
    for size in sorted(by_size, key=lambda s: params[s]):
        opt, base = by_size[size][optimizer], by_size[size][baseline]
        if not opt or not base:
            missing = optimizer if not opt else baseline
            notes.append(f"{size}: no value for {missing}")
            continue
        if spec.mode == "ratio" and (min(opt) <= 0 or min(base) <= 0):
            if max(opt) == 0 and min(base) > 0:
                stateless_sizes += 1
                notes.append(f"{size}: ratio 0 ({optimizer} measures 0)")
            else:
                notes.append(f"{size}: non-positive values, no ratio")
            continue
        gap, spread, significant = compare_size(opt, base, spec, k)
        points.append(SizeComparison(size, params[size], gap, spread, significant, statistics.fmean(opt),
                                     statistics.fmean(base), len(opt), len(base)))
    if points and all(p.n_optimizer < 2 or p.n_baseline < 2 for p in points):
        notes.append("1 seed: spread unknown")
    label, slope, change, threshold = classify(points, spec, k)
    if not points and stateless_sizes >= 2:
        label = "holds"  # e.g. SGD without momentum keeps no state: a 100 % saving at every size
    return Verdict(optimizer, spec, label, points, slope, change, threshold, notes)


def verdict(records: Sequence[Mapping[str, object]], *, baseline: str = "adamw",
            metrics: Sequence[MetricSpec] = METRICS, k: float = K_SIGMA) -> list[Verdict]:
    """All verdicts: every optimizer other than ``baseline`` x every metric.

    ``records``: one mapping per run with ``optimizer``, ``model_size``, ``num_params``, ``seed`` and the metric
    keys (missing or None = not measured). Failed runs should be left out by the caller.
    """
    optimizers = sorted({str(r["optimizer"]) for r in records} - {baseline})
    out = []
    for spec in metrics:
        obs = [Observation(str(r["optimizer"]), str(r["model_size"]), float(r["num_params"]),  # type: ignore[arg-type]
                           int(r.get("seed", 0) or 0), _num(r.get(spec.key))) for r in records]  # type: ignore[arg-type]
        for name in optimizers:
            out.append(verdict_for(obs, name, spec, baseline=baseline, k=k))
    return out


def _num(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
