"""The speedup protocol's statistics, measured by simulation (benchmarks/speedup_rates.py prints the table the
README quotes): the interval covers the true speedup at its nominal rate, the null gives a false verdict at most
5 % of the time, and a true 1.3x is found at the demo's seeds. Fixed random seeds: deterministic, cannot flake."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import speedup_rates  # noqa: E402

DEMO_SEEDS = 5
TRIALS = 300


def test_a_true_speedup_is_covered_and_found() -> None:
    r = speedup_rates.rates(1.3, DEMO_SEEDS, 0.005, TRIALS, rng_seed=1)
    assert r["coverage"] >= 0.93
    assert speedup_rates.found(r) >= 0.8


def test_the_null_gives_a_false_verdict_at_most_at_the_nominal_level() -> None:
    r = speedup_rates.rates(1.0, DEMO_SEEDS, 0.01, TRIALS, rng_seed=2)
    assert speedup_rates.false_verdict(r) <= 0.05
    assert r["coverage"] >= 0.93


def test_a_rule_without_intervals_would_fail_the_null_check() -> None:
    """The simulation can fail: calling any mean speedup beyond the 3 % margin a gain exceeds the level."""
    rng = np.random.default_rng(3)
    false = 0
    for _ in range(100):
        _, logs = speedup_rates.simulate(1.0, 3, 0.01, rng)
        false += any(abs(np.mean(v)) > math.log(1.03) for v in logs.values())
    assert false / 100 > 0.05


def test_a_true_speedup_beyond_the_ladder_is_measured_after_the_automatic_extension() -> None:
    """Issue 29: a ladder ending below the true speedup gave bounds, and the report averaged them ("4 [4, 4]").
    The sweep doubles the top rung while a run beats it (to its cap): every speedup is then measured and found.
    Without the extension every speedup stays a bound, and no mean or interval is built from bounds: no claim."""
    extended = speedup_rates.rates(6.0, DEMO_SEEDS, 0.005, 40, rng_seed=3, cap=16.0)
    assert extended["censored"] == 0.0 and speedup_rates.found(extended) >= 0.95 and extended["coverage"] >= 0.9
    stuck = speedup_rates.rates(6.0, DEMO_SEEDS, 0.005, 20, rng_seed=3, cap=4.0)
    assert stuck["censored"] == 1.0 and math.isnan(stuck["coverage"]) and speedup_rates.false_verdict(stuck) == 0.0


def test_the_benchmark_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert speedup_rates.main(["--trials", "4", "--seeds", "3", "--noise", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "| 0.01 | 3 |" in out and "95 % interval coverage" in out and "| 0.01 | 3 | not extended |" in out
