"""Step-time ratios from an interleaved calibration: each optimizer's step time over the baseline's at one shape,
paired by round, with an interval whose spread is the machine's own round-to-round noise.

What is measured (``study.calibration``): in every round each entry is built afresh and timed alone, one after the
other, and the round keeps the median of its steps. Round ``k`` gives each optimizer a log ratio
``d_k = log(its median / the baseline's median)``, both measured within the same round, so a drift of the machine
slower than a round cancels. The ratio is ``exp(mean d)``; its interval is Student-t's over the rounds,
``mean d +- t(df) * sd / sqrt(n)``, at :data:`LEVEL`, with ``sd`` the spread of one round's ``d`` pooled over every
optimizer at the shape (each about its own mean; ``df`` = the sum of their ``n - 1``): the noise is the machine's,
and pooling a handful of optimizers' rounds gives it a steady estimate where three rounds of one would not.

Why not the range of the round medians (the rule before): on a shared 2-core machine a round's log ratio moves by
0.12-0.17 (the pooled sd of two calibrations of the main job at ``tiny``, 9 minutes apart, identical runs before
them), so the range over three rounds is itself a noisy quantity, narrow in one calibration and wide in the next:
those two read Muon at x1.40 [1.29, 1.67] and x1.56 [0.997, 1.83] by it (x1.42 and x1.45 paired by round), and a
speedup in time whose word rests on such a range changes it with the calibration. The t interval's width follows the
estimate's own standard error, which is what differs from one calibration to the next; drawn from that noise, two
calibrations give the main job's Muon cell the same word in at least 90 % of pairs, the range in under 70 %
(tests/report/sections/test_time_to_quality.py).

Stable: the interval's half-width within :data:`TOLERANCE` of the ratio. A calibration that is not stable after
its first rounds measures more, up to twice as many (:func:`more_rounds`), and a shape still outside it is reported
"unstable": its interval holds what was measured, wider than the tolerance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hf_optbench.measure.intervals import t_quantile

LEVEL = 0.05  # two-sided level of a step-time ratio's interval
# The half-width (relative, at LEVEL) within which a calibration's ratios count as stable: a speedup in time then
# carries at most +-10 % from the calibration beside the token speedup's own interval.
TOLERANCE = 0.10


@dataclass(frozen=True)
class StepRatio:
    """One optimizer's step time over the baseline's at one shape: the ratio, its interval at :data:`LEVEL`, the
    rounds it is paired over and the pooled spread (sd of one round's log ratio, with its degrees of freedom)."""

    value: float
    low: float
    high: float
    rounds: int
    sd: float
    df: int

    @property
    def half_width(self) -> float:
        """The interval's half-width on the log scale (inf without a spread)."""
        return math.log(self.high / self.value) if math.isfinite(self.high) else math.inf

    @property
    def stable(self) -> bool:
        """Whether the interval lies within :data:`TOLERANCE` of the ratio (module doc)."""
        return self.half_width <= math.log1p(TOLERANCE)

    def text(self) -> str:
        """"1.42 [1.3, 1.55]", with ", unstable" where it is not within the tolerance."""
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]" + ("" if self.stable else ", unstable")


def paired_logs(mine: Sequence[float], base: Sequence[float]) -> list[float]:
    """Each round's log ratio of ``mine`` to ``base`` (round medians in round order, one each per round)."""
    if len(mine) != len(base):
        raise ValueError(f"{len(mine)} rounds against the baseline's {len(base)}: not paired by round")
    return [math.log(m / b) for m, b in zip(mine, base, strict=True)]


def pooled_sd(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """(sd, degrees of freedom) of values pooled over ``groups``, each about its own mean; (nan, 0) without any."""
    squares, df = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((v - mean) ** 2 for v in values)
            df += len(values) - 1
    return (math.sqrt(squares / df), df) if df else (math.nan, 0)


def step_ratios(rounds: Mapping[str, Sequence[float]], baseline: str,
                level: float = LEVEL) -> dict[str, StepRatio]:
    """{optimizer: its :class:`StepRatio`} at one shape from ``rounds`` ({optimizer: its round medians, in round
    order}); empty without the baseline. The baseline's own is exactly 1."""
    if baseline not in rounds:
        return {}
    logs = {opt: paired_logs(medians, rounds[baseline]) for opt, medians in rounds.items() if opt != baseline}
    sd, df = pooled_sd(logs.values())
    out = {baseline: StepRatio(1.0, 1.0, 1.0, len(rounds[baseline]), sd, df)}
    for opt, d in logs.items():
        mean = statistics.fmean(d)
        half = t_quantile(1 - level / 2, df) * sd / math.sqrt(len(d)) if df else math.inf
        out[opt] = StepRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(d), sd, df)
    return out


def settled(shapes: Iterable[Mapping[str, Sequence[float]]], baseline: str) -> bool:
    """Whether every optimizer's ratio at every shape (``shapes``: one ``rounds`` mapping of :func:`step_ratios`
    each) is stable."""
    return all(r.stable for rounds in shapes for r in step_ratios(rounds, baseline).values())


def more_rounds(shapes: Iterable[Mapping[str, Sequence[float]]], baseline: str, done: int, first: int) -> bool:
    """Whether a calibration that has measured ``done`` rounds goes on: always before its ``first`` rounds, then while
    a ratio is not stable (:func:`settled`), up to twice ``first`` (its cost at most doubled)."""
    if done < first:
        return True
    return done < 2 * first and not settled(shapes, baseline)
