"""Speedup over the baseline as recent optimizer studies report it: the data the baseline would need to reach an
optimizer's loss, divided by the data the optimizer used.

Why not time to a target loss inside one run: the target is crossed mid-schedule, where rankings still change
during the learning-rate decay (Wen et al. 2025, "Fantastic Pretraining Optimizers and Where to Find Them",
arXiv:2509.02046, name this pitfall). Here every number is a *final* loss of a run with its own full schedule.

The method (marin-community/marin, experiments/optimizer_sweep; Wen et al. 2025):

1. the baseline (AdamW) runs at several data budgets ``D_k`` (the ladder: e.g. 0.5, 1, 2, 4 x the budget), each
   with its own full schedule; their final eval losses ``L_k`` give a curve ``L(D)``;
2. the optimizer runs at budget ``D_O`` and ends at loss ``L_O``;
3. ``D_eq = L^-1(L_O)`` is the data the baseline needs for that loss; the speedup is ``D_eq / D_O``, read
   against the baseline's own x1 run on the same curve (``D_eq(L_O) / D_eq(L_B)``, see :func:`speedup`).

The curve: Chinchilla's data term, ``L(D) = a * D^-b + c`` (Hoffmann et al. 2022, eq. 2, with N fixed), fitted by
least squares when it fits: at least 4 points (one degree of freedom to judge the fit), a converged fit with
``b > 0`` and every residual within :data:`FIT_TOLERANCE`. Otherwise, monotone interpolation: the losses made
non-increasing in D (pool-adjacent-violators), then linear in log D. The method is returned, so the report says which.

Censoring: the curve is never extrapolated. A loss below the curve at the largest budget gives a lower bound
(``> 4x`` with a ladder up to 4x), a loss above it at the smallest budget an upper bound (``< 0.5x``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

# Half the 0.01-nat equivalence margin of final losses (hf_optbench.measure.verdict.LOSS_MARGIN_NATS): a power law
# that misses a ladder point by more could move the answer by a loss difference the verdict would count.
FIT_TOLERANCE = 0.005
MIN_POWER_LAW_POINTS = 4
POWER_LAW = "power law"
INTERPOLATION = "interpolation"


@dataclass(frozen=True)
class LadderFit:
    """The baseline's final loss as a function of its data budget, over the ladder's range only."""

    method: Literal["power law", "interpolation"]
    tokens: tuple[float, ...]  # the ladder's budgets, ascending
    losses: tuple[float, ...]  # the curve's values at them (fitted, or the monotone losses)
    params: tuple[float, float, float] | None = None  # (a, b, c) of a * (D / tokens[0])^-b + c
    max_residual: float | None = None  # of the power law, in nats

    def loss_at(self, tokens: float) -> float:
        """The curve at ``tokens`` (within the ladder's range)."""
        if self.params is not None:
            a, b, c = self.params
            return a * (tokens / self.tokens[0]) ** -b + c
        return _interp(math.log(tokens), [math.log(t) for t in self.tokens], list(self.losses))

    def tokens_for(self, loss: float) -> float:
        """The budget at which the curve reaches ``loss`` (``loss`` inside the curve's range)."""
        if self.params is not None:
            a, b, c = self.params
            return self.tokens[0] * ((loss - c) / a) ** (-1.0 / b)
        # losses fall as tokens grow: interpolate log D against the reversed (ascending) losses
        logs = [math.log(t) for t in self.tokens]
        return math.exp(_interp(loss, list(reversed(self.losses)), list(reversed(logs))))


@dataclass(frozen=True)
class Speedup:
    """One optimizer run's speedup over one ladder. ``censored``: "above" = the speedup is at least ``value``
    (the run beat the ladder's largest budget), "below" = at most ``value``; None = measured."""

    value: float
    censored: Literal["above", "below"] | None
    method: str
    equivalent_tokens: float | None

    def text(self) -> str:
        sign = {"above": "> ", "below": "< ", None: ""}[self.censored]
        return f"{sign}{self.value:.3g}x"


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Linear interpolation at ``x`` for ascending, distinct ``xs`` (x inside their range)."""
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0]


def monotone_losses(tokens: Sequence[float], losses: Sequence[float]) -> tuple[list[float], list[float]]:
    """(tokens, losses) made non-increasing in tokens by pool-adjacent-violators (each pooled block becomes one
    point at its mean log budget and mean loss, so the curve has no flat stretch to invert ambiguously)."""
    blocks: list[list[float]] = []  # [sum log D, sum loss, count]
    for t, loss in sorted(zip(tokens, losses, strict=True)):
        blocks.append([math.log(t), loss, 1.0])
        while len(blocks) > 1 and blocks[-1][1] / blocks[-1][2] >= blocks[-2][1] / blocks[-2][2]:
            last = blocks.pop()
            for i in range(3):
                blocks[-1][i] += last[i]
    return [math.exp(b[0] / b[2]) for b in blocks], [b[1] / b[2] for b in blocks]


def _linear_part(x: Any, y: Any, b: float, c_max: float) -> tuple[float, float]:
    """(a, c) minimising the squared error of ``a * x^-b + c`` for a fixed exponent ``b``, with ``0 <= c <= c_max``
    (a clamped ``c`` is held and ``a`` refitted alone)."""
    import numpy as np

    z = x ** -b
    a, c = np.linalg.lstsq(np.stack([z, np.ones_like(z)], axis=1), y, rcond=None)[0]
    if not 0.0 <= c <= c_max:
        c = min(max(float(c), 0.0), c_max)
        a = float(np.dot(z, y - c) / np.dot(z, z))
    return float(a), float(c)


def _power_law(tokens: Sequence[float], losses: Sequence[float]) -> tuple[tuple[float, float, float], float] | None:
    """Least-squares ``a * (D / D_0)^-b + c`` with ``a > 0``, ``0 < b <= 5``, ``0 <= c <= min(L)``; ((a, b, c),
    max |residual|), or None when no decreasing curve fits. By variable projection (Golub & Pereyra 1973): for a
    fixed ``b`` the best ``a, c`` are a linear least-squares solve, so only ``b`` is searched (scipy's bounded
    scalar minimiser) — about ten times faster than a general three-parameter fit, and it cannot stall at a bad
    starting point."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    x = np.asarray(tokens, dtype=float) / tokens[0]
    y = np.asarray(losses, dtype=float)
    if float(y.max() - y.min()) <= 0:
        return None
    c_max = float(y.min())

    def sse(b: float) -> float:
        a, c = _linear_part(x, y, b, c_max)
        return float(np.sum((a * x ** -b + c - y) ** 2))

    b = float(minimize_scalar(sse, bounds=(1e-4, 5.0), method="bounded", options={"xatol": 1e-6}).x)
    a, c = _linear_part(x, y, b, c_max)
    if not (a > 0 and all(map(math.isfinite, (a, b, c)))):
        return None
    return (a, b, c), float(np.max(np.abs(a * x ** -b + c - y)))


def fit_ladder(tokens: Sequence[float], losses: Sequence[float]) -> LadderFit | None:
    """The curve through one ladder (one size, one seed): the power law where it fits (see the module doc), else
    monotone interpolation. None with fewer than two budgets, or a ladder whose losses do not fall at all."""
    pts = sorted((float(t), float(v)) for t, v in zip(tokens, losses, strict=True)
                 if t and t > 0 and v is not None and math.isfinite(v))
    if len({t for t, _ in pts}) < 2:
        return None
    ts, ls = [p[0] for p in pts], [p[1] for p in pts]
    if len(pts) >= MIN_POWER_LAW_POINTS:
        fitted = _power_law(ts, ls)
        if fitted is not None and fitted[1] <= FIT_TOLERANCE:
            (a, b, c), resid = fitted
            curve = tuple(a * (t / ts[0]) ** -b + c for t in ts)
            return LadderFit(POWER_LAW, tuple(ts), curve, (a, b, c), resid)
    mt, ml = monotone_losses(ts, ls)
    if len(mt) < 2:
        return None
    return LadderFit(INTERPOLATION, tuple(mt), tuple(ml))


def speedup(fit: LadderFit, loss: float, tokens: float, reference_loss: float | None = None) -> Speedup:
    """The speedup of a run that reached ``loss`` with ``tokens``, read off the ladder's curve (censored outside
    its range: never extrapolated).

    ``reference_loss``: the baseline's own final loss at the same budget (its x1 run, same seed). The speedup is
    then ``D_eq(loss) / D_eq(reference_loss)``: the baseline's own run scores exactly 1, an optimizer identical to the
    baseline scores exactly 1, and where a power law misses the x1 point (within :data:`FIT_TOLERANCE`) the miss
    cancels instead of shifting every seed's speedup the same way. Without it, ``D_eq(loss) / tokens``."""
    best, worst = fit.loss_at(fit.tokens[-1]), fit.loss_at(fit.tokens[0])
    base = tokens
    if reference_loss is not None and best <= reference_loss <= worst:
        base = fit.tokens_for(reference_loss)
    if loss < best:
        return Speedup(fit.tokens[-1] / base, "above", fit.method, None)
    if loss > worst:
        return Speedup(fit.tokens[0] / base, "below", fit.method, None)
    eq = fit.tokens_for(loss)
    return Speedup(eq / base, None, fit.method, eq * tokens / base)
