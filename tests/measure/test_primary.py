"""The primary questions, the trend's orientation, transient points and the trend's power: each rule on constructed
numbers, and the power arithmetic checked by simulating the verdict's own trend test."""

from __future__ import annotations

import math
import random

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.primary import (
    DEFAULT_PRIMARY,
    Question,
    ReportSpec,
    parse_report_spec,
    pooled_point_sd,
    seeds_for_trend,
    slope_sd,
    trend_mde,
)
from hf_optbench.measure.verdict import (
    ADVANTAGE_SIGN,
    DATA_AXIS,
    METRICS,
    Family,
    Observation,
    verdict_for,
    verdict_table,
)

SPEEDUP = next(m for m in METRICS if m.key == "speedup")
KEYS = [m.key for m in METRICS]
RATIOS = (1.0, 3.2, 10.0)  # a decade of data


def _speedups(law: dict[float, float], seeds: int = 5, noise: float = 0.02, rng: random.Random | None = None,
              opt: str = "muon") -> list[Observation]:
    """One speedup observation per seed at each ratio (the data axis: ``num_params`` is the ratio), around ``law``."""
    rng = rng or random.Random(0)
    return [Observation(opt, f"{t:g} tok/param", t, s, law[t] * math.exp(rng.gauss(0.0, noise)))
            for t in law for s in range(seeds)]


def test_the_default_primary_family_is_the_benchmark_s_own_question() -> None:
    spec = parse_report_spec(None, KEYS)
    assert spec.primary == DEFAULT_PRIMARY and not spec.include_transient
    assert spec.is_primary("speedup", "data") and spec.is_primary("speedup", "size")
    assert not spec.is_primary("final_eval_loss", "data")
    mine = parse_report_spec({"primary": ["final_eval_loss along data"], "include_transient": True}, KEYS)
    assert mine == ReportSpec((Question("final_eval_loss", "data"),), True)
    assert parse_report_spec(mine.as_dict(), KEYS) == mine  # what the manifest records reads back the same


@pytest.mark.parametrize("raw, says", [
    ({"primary": ["speedup along time"]}, "not 'METRIC along AXIS'"),
    ({"primary": ["speedups along data"]}, "METRIC one of"),
    ({"primary": []}, "non-empty list"),
    ({"include_transient": "yes"}, "true or false"),
    ({"primary_questions": []}, "unknown key 'primary_questions'"),
    (["speedup along data"], "must be a mapping"),
])
def test_a_bad_report_section_is_refused_naming_the_fix(raw: object, says: str) -> None:
    with pytest.raises(OptBenchError, match=says):
        parse_report_spec(raw, KEYS)


def test_a_rising_speedup_reads_as_a_growing_advantage() -> None:
    """The stored slope is of -ln(speedup); what is printed is its negative, the slope of ln(speedup)."""
    rising = verdict_for(_speedups({1.0: 1.5, 3.2: 2.0, 10.0: 2.7}), "muon", SPEEDUP)
    falling = verdict_for(_speedups({1.0: 2.7, 3.2: 2.0, 10.0: 1.5}), "muon", SPEEDUP)
    assert rising.advantage_trend == pytest.approx(math.log(2.7 / 1.5), abs=0.05)  # over one decade
    assert rising.slope_per_decade == pytest.approx(-rising.advantage_trend)
    assert falling.advantage_trend < 0 and falling.verdict == "shrinks"
    assert rising.verdict == "grows"
    assert rising.trend_text().startswith("+0.") and ADVANTAGE_SIGN in rising.trend_text()
    assert f"advantage trend {rising.trend_text()}" in rising.evidence
    low, high = rising.advantage_ci
    assert low < rising.advantage_trend < high and low > 0


def test_a_transient_point_is_shown_and_left_out_of_the_trend() -> None:
    """A wild speedup at the first ratio (the transient) would make the trend fall; left out, the trend is flat."""
    law = {0.15: 6.0, 1.0: 2.0, 3.2: 2.0, 10.0: 2.0}
    obs = _speedups(law)
    with_it = verdict_for(obs, "muon", SPEEDUP)
    table = verdict_table([Family([_record(o) for o in obs], DATA_AXIS, "nano", [SPEEDUP],
                                  transient=frozenset({"0.15 tok/param"}))])
    (without,) = table
    assert with_it.advantage_trend < -0.3 and with_it.verdict == "shrinks"
    assert abs(without.advantage_trend) < 0.05 and without.verdict in ("holds", "ahead, trend unresolved")
    assert [p.transient for p in without.points] == [True, False, False, False]
    assert [p.model_size for p in without.judged_points] == ["1 tok/param", "3.2 tok/param", "10 tok/param"]
    assert "transient (left out of the trend and the cell's test): 0.15 tok/param" in without.evidence


def _record(o: Observation) -> dict[str, object]:
    return {"optimizer": o.optimizer, "model_size": o.model_size, "num_params": o.num_params, "seed": o.seed,
            "speedup": o.value}


def test_primary_cells_get_their_own_holm_family() -> None:
    """Two cells: the speedup (primary) and the final loss (secondary). Each is its own family of one, tested at the
    full level, where one family would test the better one at half of it."""
    rows = []
    for o in _speedups({1.0: 2.0, 3.2: 2.0, 10.0: 2.0}):
        rows.append({**_record(o), "final_eval_loss": 3.0 - 0.05 * o.seed})
        rows.append({"optimizer": "adamw", "model_size": o.model_size, "num_params": o.num_params, "seed": o.seed,
                     "final_eval_loss": 3.01 - 0.05 * o.seed})
    loss = next(m for m in METRICS if m.key == "final_eval_loss")
    fam = Family(rows, DATA_AXIS, "nano", [SPEEDUP, loss])
    one = verdict_table([fam])
    two = verdict_table([fam], report=ReportSpec())
    assert {v.family for v in one} == {2} and {v.tier for v in one} == {""}
    assert {(v.metric.key, v.tier, v.family) for v in two} == {("speedup", "primary", 1),
                                                                 ("final_eval_loss", "secondary", 1)}
    assert all(v.level == pytest.approx(0.05) for v in two)
    assert "Holm over 1 primary cells" in next(v for v in two if v.tier == "primary").evidence


def test_slope_sd_is_the_least_squares_slope_s_spread() -> None:
    xs = [math.log10(r) for r in RATIOS]
    rng = random.Random(1)
    slopes = []
    for _ in range(4000):
        ys = [rng.gauss(0.0, 0.1) for _ in xs]
        mx, my = sum(xs) / 3, sum(ys) / 3
        slopes.append(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs))
    sd = math.sqrt(sum(s * s for s in slopes) / len(slopes))
    assert sd == pytest.approx(slope_sd(0.1, xs), rel=0.05)
    assert slope_sd(0.1, [1.0, 1.0]) == math.inf


def test_the_trend_mde_is_detected_with_80_percent_power_by_the_verdict_s_own_test() -> None:
    """Simulate the data axis with a true trend equal to the stated MDE: the verdict's trend test (at the level the
    MDE was computed for) calls it beyond the margin in about 80 % of tables; with no trend, in at most its level."""
    xs = [math.log10(r) for r in RATIOS]
    noise, seeds = 0.05, 5
    threshold = SPEEDUP.margin / (xs[-1] - xs[0])
    mde = trend_mde(slope_sd(noise, xs), seeds, 0.05 / 2, threshold)  # a family of one: the trend at half its level
    rng = random.Random(7)

    def called(trend: float) -> bool:
        law = {r: 2.0 * 10 ** (0 * x) * math.exp(trend * x) for r, x in zip(RATIOS, xs, strict=True)}
        v = verdict_for(_speedups(law, seeds, noise, rng), "muon", SPEEDUP)
        return v.trend == "favourable"

    trials = 600
    power = sum(called(mde) for _ in range(trials)) / trials
    null = sum(called(0.0) for _ in range(trials)) / trials
    assert power == pytest.approx(0.80, abs=0.06)
    assert null <= 0.025 + 0.02  # one-sided: a favourable call under no trend


def test_seeds_for_a_target_trend_are_the_fewest_that_reach_it() -> None:
    spread, level, threshold = slope_sd(0.13, [0.0, 0.5, 1.0]), 0.05 / 12 / 2, 0.03
    n = seeds_for_trend(0.25, spread, level, threshold)
    assert n is not None and n >= 2
    assert trend_mde(spread, n, level, threshold) <= 0.25 < trend_mde(spread, n - 1, level, threshold)
    assert seeds_for_trend(0.02, spread, level, threshold) is None  # inside the threshold: never a call


def test_the_pooled_point_spread_pools_within_cells_only() -> None:
    sd, cells = pooled_point_sd({"a": [0.0, 0.2], "b": [1.0, 1.2], "c": [5.0]})
    assert cells == 2 and sd == pytest.approx(math.sqrt(0.02 + 0.02) / math.sqrt(2))
    assert pooled_point_sd({"a": [1.0]}) is None
