"""The speedup read off a baseline ladder: power law where it fits, monotone interpolation otherwise, censored
outside the ladder's range (never extrapolated)."""

from __future__ import annotations

import math

import pytest

from hf_optbench.measure.speedup import (
    FIT_TOLERANCE,
    INTERPOLATION,
    POWER_LAW,
    fit_ladder,
    monotone_losses,
    speedup,
)

D1 = 61_440.0


def law(tokens: float) -> float:
    return 1.5 * (tokens / D1) ** -0.35 + 2.0


LADDER = [0.5 * D1, D1, 2 * D1, 4 * D1]


@pytest.mark.parametrize("true", [0.6, 1.0, 1.3, 1.6, 3.5])
def test_a_clean_power_law_ladder_gives_back_the_true_speedup(true: float) -> None:
    fit = fit_ladder(LADDER, [law(t) for t in LADDER])
    assert fit is not None and fit.method == POWER_LAW
    s = speedup(fit, law(true * D1), D1)
    assert s.censored is None
    assert s.value == pytest.approx(true, rel=1e-6)
    assert s.equivalent_tokens == pytest.approx(true * D1, rel=1e-6)


def test_losses_beyond_the_ladder_are_censored_not_extrapolated() -> None:
    fit = fit_ladder(LADDER, [law(t) for t in LADDER])
    above = speedup(fit, law(9 * D1), D1)
    below = speedup(fit, law(0.2 * D1), D1)
    assert (above.censored, above.value, above.text()) == ("above", 4.0, "> 4x")
    assert (below.censored, below.value, below.text()) == ("below", 0.5, "< 0.5x")
    assert above.equivalent_tokens is None and below.equivalent_tokens is None


def test_a_ladder_the_power_law_misses_falls_back_to_monotone_interpolation() -> None:
    losses = [law(t) for t in LADDER]
    losses[1] += 4 * FIT_TOLERANCE  # one noisy point: no power law fits every point within the tolerance
    fit = fit_ladder(LADDER, losses)
    assert fit is not None and fit.method == INTERPOLATION
    # halfway (in loss) between the x1 and x2 points lies halfway in log D between them
    mid = (losses[1] + losses[2]) / 2
    assert speedup(fit, mid, D1).value == pytest.approx(math.sqrt(2), rel=1e-9)


def test_three_points_are_too_few_to_judge_a_power_law() -> None:
    fit = fit_ladder(LADDER[:3], [law(t) for t in LADDER[:3]])
    assert fit is not None and fit.method == INTERPOLATION
    assert speedup(fit, law(D1), D1).value == pytest.approx(1.0)


def test_pool_adjacent_violators_makes_the_curve_non_increasing() -> None:
    ts, ls = monotone_losses([1, 2, 4, 8], [5.0, 4.0, 4.2, 3.0])
    assert ls == [5.0, 4.1, 3.0]
    assert ts[1] == pytest.approx(math.sqrt(8))  # the pooled block sits at its mean log budget
    assert all(a > b for a, b in zip(ls, ls[1:], strict=False))


def test_no_curve_without_two_budgets_or_with_a_flat_ladder() -> None:
    assert fit_ladder([D1], [3.0]) is None
    assert fit_ladder([D1, D1], [3.0, 3.1]) is None
    assert fit_ladder([D1, 2 * D1], [3.0, 3.2]) is None  # losses rise with data: pooled to one point


def test_read_against_the_baselines_own_run_an_identical_optimizer_scores_exactly_one() -> None:
    """A power law that misses the x1 point (within the tolerance) would shift every seed's speedup the same way;
    read against the baseline's own x1 loss, the miss cancels."""
    losses = [law(t) for t in LADDER]
    losses[1] += 0.8 * FIT_TOLERANCE / 2  # the x1 run a little above the curve, every other point on it
    fit = fit_ladder(LADDER, losses)
    assert fit is not None and fit.method == POWER_LAW
    assert abs(fit.loss_at(D1) - losses[1]) > 1e-4  # the fit does miss it
    assert speedup(fit, losses[1], D1, reference_loss=losses[1]).value == pytest.approx(1.0, abs=1e-9)
    assert speedup(fit, losses[1], D1).value != pytest.approx(1.0, abs=1e-3)
