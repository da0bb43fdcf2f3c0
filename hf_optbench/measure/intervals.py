"""Intervals, p-values and power for the mean of paired differences, with or without censored values.

The verdict (:mod:`hf_optbench.measure.verdict`) compares an optimizer with the baseline through the mean ``mu`` of
paired differences ``d`` (one per seed). Three tools, each chosen because the simpler one would mislead:

* **Student-t** (:func:`t_interval`, :func:`t_p_values`) for measured values: the interval ``mean +- t * sd /
  sqrt(n)`` and the one-sided p-values of "mu lies below ``-m``" and "mu lies above ``+m``" (the tests behind
  "ahead" and "behind" beyond an equivalence margin ``m``), consistent with each other: the (1 - a) interval lies
  wholly below ``-m`` exactly when that p-value is below a / 2.
* **Censored values** (:func:`censored_fit`): a run whose speedup lies beyond the baseline's ladder, or that never
  reached a target, gives a *bound* ("d <= x" or "d >= x"), not a value. A mean or a t interval of bounds is no
  estimate of anything (an optimizer that beats the 4x rung in every seed would read "4 [4, 4]"). The
  method made for such data is the censored-normal likelihood (Tobin 1958; the "Tobit" model): a measured value
  contributes its density, a bound the probability of lying beyond it. ``mu`` gets a profile-likelihood interval
  (``sigma`` maximised out) whose cut-off is calibrated so that **without censoring it is exactly the t interval**
  (the profile likelihood ratio of a normal mean is ``n log(1 + T^2 / (n - 1))``, so the cut-off is that function
  of Student-t's quantile). A size whose bounds leave the spread unidentified (fewer than two distinct measured
  values) takes the spread from ``sigma``, the pooled spread of the same comparison's measured sizes, and a
  t quantile with its degrees of freedom; without one the interval is unbounded and says so.
* **Exact power** (:func:`minimal_detectable_effect`): the smallest true gap that an interval at level ``a`` would
  place beyond the margin with the stated power, from the noncentral t distribution (the normal approximation
  overstates power at few seeds: it can claim 0.80 where the exact figure is 0.77).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# A censoring flag per paired difference: None (measured), "upper" (the true d is at most the value: the run was
# at least this much better) or "lower" (the true d is at least the value).
Censor = Literal["upper", "lower"] | None
POWER = 0.8  # the power at which each cell's minimal detectable effect is stated


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile: scipy.stats.t.ppf's own kernel (scipy.special.stdtrit) without the distribution
    object's argument checks and broadcasting, which cost ~60 us a call and were most of a verdict table's time
    (the verdict's error-rate simulations evaluate thousands of tables). The same floats."""
    from scipy.special import stdtrit

    if q <= 0 or q >= 1:  # stdtrit(df, 0) is +inf: the distribution's own edges instead
        return math.nan if math.isnan(q) else -math.inf if q <= 0 else math.inf
    return float(stdtrit(df, q))


def t_cdf(x: float, df: float) -> float:
    """Student's t CDF: scipy.stats.t.cdf's kernel (scipy.special.stdtr), as :func:`t_quantile`."""
    from scipy.special import stdtr

    return float(stdtr(df, x))


def t_interval(values: Sequence[float], alpha: float) -> tuple[float, float, float, float]:
    """(mean, sample sd, low, high): the two-sided (1 - alpha) Student-t interval of the mean (scipy's t quantile).
    A single value has no interval: (-inf, inf)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), -math.inf, math.inf
    sd = statistics.stdev(values)
    half = t_quantile(1 - alpha / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, sd, mean - half, mean + half


def t_p_values(mean: float, sd: float, n: int, margin: float) -> tuple[float, float]:
    """(p of "mu < -margin", p of "mu > +margin"): one-sided t tests against the margin's two edges. A spread of 0
    (a deterministic figure such as the optimizer state's bytes) decides with certainty: 0 or 1."""
    if n < 2 or not math.isfinite(sd):
        return 1.0, 1.0
    if sd == 0:
        return (0.0 if mean < -margin else 1.0), (0.0 if mean > margin else 1.0)
    se = sd / math.sqrt(n)
    return t_cdf((mean + margin) / se, n - 1), 1.0 - t_cdf((mean - margin) / se, n - 1)


def minimal_detectable_effect(sd: float, n: int, alpha: float, margin: float, power: float = POWER) -> float:
    """The smallest true gap ``delta`` (beyond 0, on the gap's scale) that a two-sided (1 - alpha) interval from
    ``n`` paired values with spread ``sd`` places wholly beyond ``margin`` with probability ``power``, exactly: the
    interval lies below ``-margin`` when ``(mean + margin) / se < -t_crit``, and under a true gap ``-delta`` that
    statistic follows a noncentral t with ``n - 1`` degrees of freedom and noncentrality
    ``(margin - delta) / se``. inf with fewer than two values; ``margin`` when the spread is 0."""
    from scipy.optimize import brentq
    from scipy.stats import nct
    if n < 2 or not math.isfinite(sd):
        return math.inf
    if sd == 0:
        return margin
    df, se = n - 1, sd / math.sqrt(n)
    crit = t_quantile(1 - alpha / 2, df)

    def shortfall(delta: float) -> float:
        return float(nct.cdf(-crit, df, (margin - delta) / se)) - power

    high = margin + se * (crit + 10.0)
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, margin, high, xtol=1e-9 * max(1.0, high)))


def power_at(delta: float, sd: float, n: int, alpha: float, margin: float) -> float:
    """The exact probability that the interval lies beyond ``margin`` when the true gap is ``delta`` (see
    :func:`minimal_detectable_effect`)."""
    from scipy.stats import nct

    if n < 2 or not sd > 0:
        return float("nan")
    df, se = n - 1, sd / math.sqrt(n)
    return float(nct.cdf(-t_quantile(1 - alpha / 2, df), df, (margin - abs(delta)) / se))


# ------------------------------------------------------------------------------------------- censored values
@dataclass(frozen=True)
class CensoredFit:
    """The censored-normal fit of one size's paired differences: ``estimate`` (the maximum-likelihood mean; -inf or
    inf when every value is a bound on the same side), the spread, the degrees of freedom of its calibration, and
    what the interval needs: the profile log-likelihood's maximum and the spread when it is fixed (pooled)."""

    values: tuple[float, ...]
    flags: tuple[Censor, ...]
    estimate: float
    sd: float
    df: int
    top: float  # the maximum of the profile log-likelihood
    fixed_sd: float | None  # the pooled spread, when this size's own bounds leave it unidentified

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def censored(self) -> int:
        return sum(f is not None for f in self.flags)

    def _profile(self, mu: float) -> float:
        return _profile(self.values, self.flags, mu, self.fixed_sd, self.sd)

    def signed_t(self, mu: float) -> float:
        """The likelihood-ratio statistic at ``mu`` on Student-t's scale, signed like ``(estimate - mu)``: without
        censoring it is the t statistic itself."""
        lr = max(0.0, 2.0 * (self.top - self._profile(mu)))
        mag = math.sqrt(lr) if self.fixed_sd is not None else math.sqrt(self.df * math.expm1(min(lr / self.n, 700)))
        return mag if self.estimate > mu else -mag

    def p_values(self, margin: float) -> tuple[float, float]:
        """(p of "mu < -margin", p of "mu > +margin"), as :func:`t_p_values` for measured values."""
        if self.df < 1:
            return 1.0, 1.0
        return t_cdf(self.signed_t(-margin), self.df), 1.0 - t_cdf(self.signed_t(margin), self.df)

    def interval(self, alpha: float) -> tuple[float, float]:
        """The two-sided (1 - alpha) interval of ``mu``: the values the calibrated likelihood ratio keeps."""
        from scipy.optimize import brentq

        if self.df < 1:
            return -math.inf, math.inf
        crit = t_quantile(1 - alpha / 2, self.df)
        scale = _scale(self.values, self.fixed_sd)

        def end(direction: int) -> float:
            start = self.estimate if math.isfinite(self.estimate) else (
                min(self.values) if self.estimate < 0 else max(self.values))
            if direction * (self.estimate - start) > 0:  # an infinite estimate lies beyond every finite start
                return self.estimate
            if abs(self.signed_t(start)) > crit:
                return start
            step = scale
            for _ in range(60):
                far = start + direction * step
                if abs(self.signed_t(far)) > crit:
                    return float(brentq(lambda m: abs(self.signed_t(m)) - crit, *sorted((start, far)),
                                        xtol=1e-10 * max(1.0, abs(far))))
                start, step = far, step * 2
            return direction * math.inf

        return end(-1), end(+1)


def _scale(values: Sequence[float], fixed_sd: float | None) -> float:
    spread = max(values) - min(values) if values else 0.0
    return max(spread, fixed_sd or 0.0, 1e-3)


def _loglik(values: Sequence[float], flags: Sequence[Censor], mu: float, sd: float) -> float:
    from scipy.stats import norm

    total = 0.0
    for x, f in zip(values, flags, strict=True):
        z = (x - mu) / sd
        if f is None:
            total += float(norm.logpdf(z)) - math.log(sd)
        elif f == "upper":  # the true value is at most x
            total += float(norm.logcdf(z))
        else:
            total += float(norm.logsf(z))
    return total


def _profile(values: Sequence[float], flags: Sequence[Censor], mu: float, fixed_sd: float | None,
             hint: float) -> float:
    """The log-likelihood at ``mu`` with the spread maximised out (or fixed to ``fixed_sd``)."""
    from scipy.optimize import minimize_scalar

    if fixed_sd is not None:
        return _loglik(values, flags, mu, fixed_sd)
    scale = _scale(values, None)
    low, high = math.log(scale * 1e-4), math.log(scale * 1e3 + abs(mu) * 10 + 1.0)
    res = minimize_scalar(lambda s: -_loglik(values, flags, mu, math.exp(s)), bounds=(low, high), method="bounded",
                          options={"xatol": 1e-6})
    return float(-res.fun)


def censored_fit(values: Sequence[float], flags: Sequence[Censor], pooled_sd: float | None = None,
                 pooled_df: int = 0) -> CensoredFit:
    """The censored-normal (Tobit) fit of paired differences, some of them bounds (see the module doc). With fewer
    than two distinct measured values the spread is ``pooled_sd`` (degrees of freedom ``pooled_df``) when given."""
    from scipy.optimize import minimize_scalar

    vals, fl = tuple(float(v) for v in values), tuple(flags)
    measured = sorted({v for v, f in zip(vals, fl, strict=True) if f is None})
    fixed = None
    df = len(vals) - 1
    if len(measured) < 2:
        if pooled_sd is None or not pooled_sd > 0:
            return CensoredFit(vals, fl, _one_sided_estimate(vals, fl), math.nan, 0, 0.0, None)
        fixed, df = float(pooled_sd), int(pooled_df)
    hint = statistics.stdev(measured) if len(measured) >= 2 else float(fixed or 1.0)
    if all(f == "upper" for f in fl) or all(f == "lower" for f in fl):
        # every value a bound on one side: the likelihood rises towards 1 (log 0) as the mean moves beyond them all
        estimate = -math.inf if fl[0] == "upper" else math.inf
        return CensoredFit(vals, fl, estimate, float(fixed or math.nan), df, 0.0, fixed)
    scale = _scale(vals, fixed)
    res = minimize_scalar(lambda m: -_profile(vals, fl, m, fixed, hint), method="bounded",
                          bounds=(min(vals) - 20 * scale, max(vals) + 20 * scale), options={"xatol": 1e-9})
    estimate = float(res.x)
    return CensoredFit(vals, fl, estimate, _best_sd(vals, fl, estimate, fixed), df, float(-res.fun), fixed)


def _one_sided_estimate(values: Sequence[float], flags: Sequence[Censor]) -> float:
    if all(f == "upper" for f in flags):
        return -math.inf
    if all(f == "lower" for f in flags):
        return math.inf
    return statistics.median(values)


def _best_sd(values: Sequence[float], flags: Sequence[Censor], mu: float, fixed: float | None) -> float:
    from scipy.optimize import minimize_scalar

    if fixed is not None:
        return fixed
    scale = _scale(values, None)
    res = minimize_scalar(lambda s: -_loglik(values, flags, mu, math.exp(s)), method="bounded",
                          bounds=(math.log(scale * 1e-4), math.log(scale * 1e3 + 1.0)), options={"xatol": 1e-6})
    return float(math.exp(res.x))
