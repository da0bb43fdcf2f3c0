"""Issue 40's widening rule: a second tuning draw's shift widens an interval only past a third of its half-width,
the stance and the verdict word are taken again at the widened interval, and the trend widens by the largest slope
the shifts can make."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hf_optbench.measure.tuning_noise import (
    NEGLIGIBLE_SHARE,
    needs_widening,
    slope_shift,
    widen_point,
    widen_verdict,
)
from hf_optbench.measure.verdict import METRICS, Observation, verdict_for

LOSS = next(m for m in METRICS if m.key == "final_eval_loss")


def _verdict(gaps: dict[str, float], spread: float = 0.004) -> object:
    """Final-loss observations at two sizes (AdamW 3.0; the optimizer ``gaps[size]`` lower), three seeds."""
    params = {"tiny": 1e5, "mini": 1e6}
    obs = []
    for size, gap in gaps.items():
        for seed, jitter in enumerate((-spread, 0.0, spread)):
            obs += [Observation("adamw", size, params[size], seed, 3.0),
                    Observation("muon", size, params[size], seed, 3.0 - gap + jitter)]
    return verdict_for(obs, "muon", LOSS)


def test_a_shift_up_to_a_third_of_the_half_width_leaves_the_interval_alone() -> None:
    v = _verdict({"tiny": 0.05, "mini": 0.05})
    p = v.points[-1]
    half = (p.ci_high - p.ci_low) / 2
    same, record = widen_point(p, NEGLIGIBLE_SHARE * half * 0.99)
    assert same is p and record is not None and not record.widened and record.share == pytest.approx(0.33, abs=0.01)
    wider, record = widen_point(p, -0.5 * half)
    assert record.widened and wider.ci_low == pytest.approx(p.ci_low - 0.5 * half)
    assert wider.ci_high == pytest.approx(p.ci_high + 0.5 * half)
    assert widen_point(p, None) == (p, None)
    assert not needs_widening(10.0, math.inf)  # an interval open on a side cannot be widened


def test_the_stance_and_the_word_are_taken_again_at_the_widened_interval() -> None:
    v = _verdict({"tiny": 0.03, "mini": 0.03})  # ahead at both sizes, the trend shown flat: "holds"
    p = v.points[-1]
    assert v.verdict == "holds" and p.stance == "ahead" and p.ci_high < -LOSS.margin
    # a shift that carries the interval's upper end past -margin: ahead no longer holds at the largest size
    shift = max(-LOSS.margin - p.ci_high + 0.005, NEGLIGIBLE_SHARE * (p.ci_high - p.ci_low))
    new, records = widen_verdict(v, {"tiny": None, "mini": shift})
    assert [(r.label, r.widened) for r in records] == [("mini", True)]
    assert new.points[-1].ci_high == pytest.approx(p.ci_high + shift) and new.points[-1].stance == "no difference"
    assert new.points[0] is v.points[0]  # no shift at tiny: its interval stands
    assert new.verdict == "no difference" and v.verdict == "holds"  # the original is untouched
    assert any("widened by the tuning draw's shift at mini" in n for n in new.notes)


def test_the_trend_widens_by_the_largest_slope_the_shifts_can_make() -> None:
    assert slope_shift([0.0, 1.0], [0.1, 0.0]) == pytest.approx(0.1)
    assert slope_shift([0.0, 1.0], [0.1, 0.1]) == pytest.approx(0.2)  # opposite signs are the worst case
    assert slope_shift([0.0, 1.0, 2.0], [0.0, 0.3, 0.0]) == pytest.approx(0.0)  # the middle point moves no slope
    assert slope_shift([1.0], [0.5]) == 0.0
    v = _verdict({"tiny": 0.03, "mini": 0.03})
    assert v.slope_ci is not None
    half = (v.slope_ci[1] - v.slope_ci[0]) / 2
    # a shift too small for either point's interval can still move the trend past a third of its half-width
    small = {"tiny": 0.0, "mini": 0.0}
    assert widen_verdict(v, small)[0].slope_ci == v.slope_ci
    tiny = min((p.ci_high - p.ci_low) / 2 for p in v.points) * NEGLIGIBLE_SHARE * 0.9
    new, records = widen_verdict(v, {"tiny": tiny, "mini": tiny})
    assert not any(r.widened for r in records)
    assert 2 * tiny > NEGLIGIBLE_SHARE * half  # the seeds' slopes agree (same jitter at both sizes): a narrow trend
    assert new.slope_ci[0] == pytest.approx(v.slope_ci[0] - 2 * tiny)  # the slope moves by 2 x tiny over a decade
    assert any("trend interval widened" in n for n in new.notes)


def test_a_verdict_no_interval_decided_keeps_its_word() -> None:
    v = _verdict({"tiny": 0.03})  # one size: insufficient data
    assert v.verdict == "insufficient data"
    new, records = widen_verdict(v, {"tiny": 1.0})
    assert new.verdict == "insufficient data" and records[0].widened
    other = dataclasses.replace(v, verdict="not measurable here")
    assert widen_verdict(other, {"tiny": 1.0})[0].verdict == "not measurable here"
