"""Step-time ratios paired by round: the ratio is the geometric mean of each round's ratio, its interval Student-t's
with the round-to-round spread pooled over the optimizers at a shape, and a calibration measures more rounds (up to
twice its first) only while a ratio is outside the tolerance."""

from __future__ import annotations

import math
import statistics

import pytest

from hf_optbench.measure.intervals import t_quantile
from hf_optbench.measure.step_ratio import (
    LEVEL,
    TOLERANCE,
    more_rounds,
    paired_logs,
    pooled_sd,
    settled,
    step_ratios,
)


def test_the_ratio_pairs_rounds_and_pools_the_spread_over_the_optimizers() -> None:
    rounds = {"adamw": [10.0, 12.0, 11.0], "muon": [15.0, 19.2, 16.5], "lion": [11.0, 12.0, 12.1]}
    out = step_ratios(rounds, "adamw")
    muon, lion = paired_logs(rounds["muon"], rounds["adamw"]), paired_logs(rounds["lion"], rounds["adamw"])
    assert muon == pytest.approx([math.log(1.5), math.log(1.6), math.log(1.5)])
    squares = sum((d - statistics.fmean(ds)) ** 2 for ds in (muon, lion) for d in ds)
    sd = math.sqrt(squares / 4)
    assert pooled_sd([muon, lion]) == (pytest.approx(sd), 4)
    half = t_quantile(1 - LEVEL / 2, 4) * sd / math.sqrt(3)
    r = out["muon"]
    assert r.value == pytest.approx(math.exp(statistics.fmean(muon)))
    assert (r.low, r.high) == (pytest.approx(r.value * math.exp(-half)), pytest.approx(r.value * math.exp(half)))
    assert (r.rounds, r.df) == (3, 4) and r.half_width == pytest.approx(half)
    assert (out["adamw"].value, out["adamw"].low, out["adamw"].high) == (1.0, 1.0, 1.0)


def test_a_drift_shared_by_a_round_cancels_and_one_round_has_no_spread() -> None:
    """The machine slowing every entry of a round alike moves no ratio; a single round gives no interval."""
    steady = step_ratios({"adamw": [10.0, 10.0, 10.0], "muon": [15.0, 15.0, 15.0]}, "adamw")["muon"]
    drift = step_ratios({"adamw": [10.0, 13.0, 8.0], "muon": [15.0, 19.5, 12.0]}, "adamw")["muon"]
    assert drift.value == pytest.approx(steady.value) and drift.half_width == pytest.approx(0.0, abs=1e-12)
    one = step_ratios({"adamw": [10.0], "muon": [15.0]}, "adamw")["muon"]
    assert one.df == 0 and math.isinf(one.high) and not one.stable
    assert step_ratios({"muon": [15.0]}, "adamw") == {}
    with pytest.raises(ValueError, match="not paired by round"):
        paired_logs([1.0, 2.0], [1.0])


def test_stable_is_within_the_tolerance_and_the_text_says_when_not() -> None:
    quiet = step_ratios({"adamw": [10.0, 10.1, 9.9], "muon": [15.0, 15.2, 14.9]}, "adamw")["muon"]
    noisy = step_ratios({"adamw": [10.0, 13.0, 9.0], "muon": [15.0, 14.0, 17.0]}, "adamw")["muon"]
    assert quiet.stable and quiet.half_width <= math.log1p(TOLERANCE) and "unstable" not in quiet.text()
    assert not noisy.stable and noisy.text().endswith(", unstable")


def test_more_rounds_until_stable_at_most_twice_the_first() -> None:
    quiet = [{"adamw": [10.0, 10.1, 9.9], "muon": [15.0, 15.2, 14.9]}]
    noisy = [{"adamw": [10.0, 13.0, 9.0], "muon": [15.0, 14.0, 17.0]}]
    assert settled(quiet, "adamw") and not settled(noisy, "adamw")
    assert more_rounds(quiet, "adamw", done=2, first=3)  # the first rounds always
    assert not more_rounds(quiet, "adamw", done=3, first=3)
    assert more_rounds(noisy, "adamw", done=3, first=3) and more_rounds(noisy, "adamw", done=5, first=3)
    assert not more_rounds(noisy, "adamw", done=6, first=3)  # the cap: twice the first rounds
    assert settled([{"muon": [15.0, 19.0]}], "adamw")  # no baseline at a shape: nothing to pair there
