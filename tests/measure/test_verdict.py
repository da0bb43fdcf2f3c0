"""The scaling verdict on constructed numbers: every verdict of the vocabulary, pairing, margins, censoring."""

from __future__ import annotations

import math

import pytest

from hf_optbench.measure.intervals import t_interval
from hf_optbench.measure.verdict import (
    CLAIMS,
    METRICS,
    VERDICT_MEANINGS,
    MetricSpec,
    Observation,
    stance,
    verdict,
    verdict_for,
)
from hf_optbench.measure.verdict_stats import holm_levels
from hf_optbench.measure.verdict_words import TREND_WORDS, VERDICTS

SIZES = {"tiny": 1.1e5, "mini": 8.1e5, "midi": 2.7e6, "big": 1.2e8}
RATIO = MetricSpec("m", "memory", "metric")
# per-seed multiplicative noise that is different for the optimizer and the baseline (paired differences vary)
JITTER = (0.0, 0.013, -0.011, 0.007, -0.009)


def _obs(ratios: dict[str, float], *, base: float = 100.0, jitter: float = 0.0, seeds: int = 3,
         opt: str = "opt") -> list[Observation]:
    """Baseline = base x (1 + seed effect); optimizer = baseline x ratio x (1 + jitter x JITTER[seed])."""
    out = []
    for size, ratio in ratios.items():
        for s in range(seeds):
            b = base * (1 + 0.2 * s)  # a seed effect shared by the pair: pairing removes it
            out.append(Observation("adamw", size, SIZES[size], s, b))
            out.append(Observation(opt, size, SIZES[size], s, b * ratio * (1 + jitter * JITTER[s] / 0.013)))
    return out


def test_vocabulary_is_small_and_defined() -> None:
    assert set(VERDICT_MEANINGS) == set(VERDICTS)
    assert len(VERDICTS) <= 11


def test_t_interval_matches_the_textbook() -> None:
    mean, sd, low, high = t_interval([1.0, 2.0, 3.0], 0.05)
    assert (mean, sd) == (2.0, 1.0)
    assert high - mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)  # t(0.975, 2) = 4.3027
    assert t_interval([1.0], 0.05)[2:] == (-math.inf, math.inf)


def test_stance_uses_the_equivalence_margin() -> None:
    m = math.log(1.02)
    assert stance(-0.5, -0.3, m) == "ahead"
    assert stance(0.3, 0.5, m) == "behind"
    assert stance(-0.001, 0.001, m) == "level"  # 0.1 % with no noise: level, not a difference
    assert stance(-0.001, 0.3, m) == "no difference"


def test_constant_saving_holds() -> None:
    v = verdict_for(_obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5}, jitter=0.01), "opt", RATIO)
    assert v.verdict == "holds"
    assert [round(p.ratio(), 2) for p in v.points] == [0.5, 0.5, 0.5]
    assert all(p.stance == "ahead" for p in v.points)


def test_noiseless_identical_saving_holds() -> None:
    v = verdict_for(_obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5}), "opt", RATIO)
    assert v.verdict == "holds"
    assert v.slope_per_decade == pytest.approx(0.0, abs=1e-12)


def test_falling_ratio_means_the_saving_grows() -> None:
    v = verdict_for(_obs({"tiny": 0.8, "mini": 0.6, "midi": 0.4, "big": 0.2}, jitter=0.01), "opt", RATIO)
    assert v.verdict == "grows"
    assert v.slope_per_decade is not None and v.slope_ci[1] < 0


def test_rising_ratio_means_the_saving_shrinks() -> None:
    assert verdict_for(_obs({"tiny": 0.5, "mini": 0.7, "midi": 0.9}, jitter=0.01), "opt", RATIO).verdict \
        == "shrinks"


def test_a_worse_optimizer_falling_further_behind_also_shrinks() -> None:
    assert verdict_for(_obs({"tiny": 1.1, "mini": 1.3, "midi": 1.6}, jitter=0.01), "opt", RATIO).verdict \
        == "shrinks"


def test_a_closing_deficit_is_not_a_growing_advantage() -> None:
    """Behind at the smallest size, level at the largest: the deficit vanishes; nothing 'grows'."""
    v = verdict_for(_obs({"tiny": 2.4, "mini": 1.4, "midi": 1.0}, jitter=0.004), "opt", RATIO)
    assert v.points[0].stance == "behind"
    assert v.points[-1].stance in ("level", "no difference")
    assert v.verdict == "deficit vanishes"


def test_behind_without_a_trend() -> None:
    assert verdict_for(_obs({"tiny": 1.3, "mini": 1.3, "midi": 1.3}, jitter=0.01), "opt", RATIO).verdict \
        == "behind"


def test_a_tiny_noiseless_difference_is_level() -> None:
    assert verdict_for(_obs({"tiny": 1.001, "mini": 0.999, "midi": 1.001}), "opt", RATIO).verdict == "level"


def test_difference_inside_seed_noise_is_no_difference() -> None:
    v = verdict_for(_obs({"tiny": 1.01, "mini": 0.99, "midi": 1.01}, jitter=0.1), "opt", RATIO)
    assert v.verdict == "no difference"
    assert not any(p.significant for p in v.points)


def test_pairing_removes_a_seed_effect_shared_by_the_pair() -> None:
    """The baseline varies 40 % between seeds; the optimizer is exactly 0.9x its own seed's baseline."""
    v = verdict_for(_obs({"tiny": 0.9, "mini": 0.9, "midi": 0.9}), "opt", RATIO)
    assert v.verdict == "holds"
    assert all(p.spread == pytest.approx(0.0, abs=1e-12) for p in v.points)


def test_two_seeds_give_wide_intervals_one_seed_insufficient() -> None:
    one = verdict_for(_obs({"tiny": 0.5, "mini": 0.5}, seeds=1), "opt", RATIO)
    assert one.verdict == "insufficient data"
    assert verdict_for(_obs({"mini": 0.5}), "opt", RATIO).verdict == "insufficient data"


def test_unpaired_seeds_are_not_compared() -> None:
    obs = [o for o in _obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5}) if not (o.optimizer == "adamw" and o.seed == 0)]
    v = verdict_for(obs, "opt", RATIO)
    assert all(p.n_pairs == 2 for p in v.points)


def test_censored_pairs_are_reported() -> None:
    obs = _obs({"tiny": 1.0, "mini": 1.0, "midi": 1.0}, jitter=0.01)
    obs = [Observation(o.optimizer, o.model_size, o.num_params, o.seed, o.value,
                       censored=o.optimizer == "opt" and o.seed == 0) for o in obs]
    v = verdict_for(obs, "opt", RATIO)
    assert sum(p.censored_pairs for p in v.points) == 3
    assert any("never reached the target" in n for n in v.notes)


def test_stateless_optimizer_holds_its_full_saving() -> None:
    obs = [Observation(o.optimizer, o.model_size, o.num_params, o.seed, 0.0 if o.optimizer == "opt" else o.value)
           for o in _obs({"tiny": 1.0, "mini": 1.0})]
    assert verdict_for(obs, "opt", RATIO).verdict == "holds"


def test_difference_metrics_use_their_own_margin() -> None:
    spikes = next(s for s in METRICS if s.key == "loss_spikes_per_1k")
    obs = []
    for size, params in (("tiny", 1e5), ("mini", 1e6)):
        for seed in range(3):
            obs += [Observation("adamw", size, params, seed, 0.0), Observation("lion", size, params, seed, 0.5)]
    assert verdict_for(obs, "lion", spikes).verdict == "level"  # 0.5 spikes / 1k < the 1-spike margin


def test_verdict_over_records_reads_censored_flags() -> None:
    records = []
    for size, params in (("tiny", 1e5), ("mini", 1e6), ("midi", 3e6)):
        for seed in range(3):
            records.append({"optimizer": "adamw", "model_size": size, "num_params": params, "seed": seed,
                            "tokens_to_target": 100.0 + seed})
            records.append({"optimizer": "lion", "model_size": size, "num_params": params, "seed": seed,
                            "tokens_to_target": 200.0, "tokens_to_target_censored": True})
    vs = [v for v in verdict(records) if v.metric.key == "tokens_to_target"]
    assert vs[0].points[0].censored_pairs == 3
    # every pair a bound at every size: no spread measured to judge the bounds by, so no interval and no claim; the
    # cell shows the bound (at least 2x the tokens) and how many pairs are bounds
    assert vs[0].verdict == "no difference" and vs[0].points[-1].bounded == "lower"
    assert "ratio ≥ 1.96" in vs[0].evidence and "(3/3 pairs bounds)" in vs[0].evidence


# ------------------------------------------------------------------------------- issue 29: words and the table
def _diffs(table: dict[str, list[float]], opt: str = "opt") -> list[Observation]:
    """Observations whose paired log-ratios are exactly ``table[size][seed]``."""
    out = []
    for size, diffs in table.items():
        for seed, d in enumerate(diffs):
            out += [Observation("adamw", size, SIZES[size], seed, 100.0),
                    Observation(opt, size, SIZES[size], seed, 100.0 * math.exp(d))]
    return out


SEED_SHIFT = (0.12, -0.10, 0.05, -0.08, 0.01)  # a per-seed effect shared by every size: wide per-size intervals,
# yet exact per-seed slopes


def test_ahead_with_an_undecided_trend_is_not_holds() -> None:
    """Issue 29: "holds" was given when no trend was detected (an interval of -0.35 .. +0.33 per decade)."""
    wobble = {"tiny": [-0.7, -0.5, -0.8], "mini": [-0.6, -0.75, -0.5], "midi": [-0.55, -0.7, -0.72]}
    v = verdict_for(_diffs(wobble), "opt", RATIO)
    assert v.points[-1].stance == "ahead" and v.slope_ci is not None
    assert not (-v.threshold <= v.slope_ci[0] and v.slope_ci[1] <= v.threshold)
    assert v.verdict == "ahead, trend unresolved"
    flat = verdict_for(_obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5}, jitter=0.001, seeds=5), "opt", RATIO)
    assert flat.verdict == "holds"  # the trend's interval inside the margin: shown flat


def test_a_significant_favourable_trend_not_yet_ahead_is_gaining() -> None:
    """Issue 29: Lion's significant favourable trend read "no difference" because no word covered it."""
    trend = {"tiny": 0.05, "mini": 0.0, "midi": -0.03}
    v = verdict_for(_diffs({s: [t + e for e in SEED_SHIFT] for s, t in trend.items()}), "opt", RATIO)
    assert v.slope_ci is not None and v.slope_ci[1] < -v.threshold
    assert v.points[-1].stance == "no difference" and v.points[0].stance != "behind"
    assert v.verdict == "gaining"


def test_holm_levels() -> None:
    assert holm_levels([0.001, 0.04, None, 0.02], 0.05) == pytest.approx([0.05 / 3, 0.05, 0.05, 0.025])
    # the first that fails stops the procedure: everything after it is judged at that level
    assert holm_levels([0.001, 0.04, 0.03], 0.05) == pytest.approx([0.05 / 3, 0.025, 0.025])


def _table_records(n_opts: int, diff: float) -> list[dict]:
    records = []
    for size in ("tiny", "mini", "midi"):
        for seed, e in enumerate(SEED_SHIFT[:3]):
            records.append({"optimizer": "adamw", "model_size": size, "num_params": SIZES[size], "seed": seed,
                            "optimizer_state_bytes": 100.0})
            for k in range(n_opts):
                records.append({"optimizer": f"opt{k}", "model_size": size, "num_params": SIZES[size], "seed": seed,
                                "optimizer_state_bytes": 100.0 * math.exp(diff + e / 10)})
    return records


def test_the_table_controls_the_family_wise_error_with_holm() -> None:
    """A difference a cell alone would call (p ~ 0.02) is not called when three such cells share the 5 %."""
    metric = (METRICS[0],)
    one = verdict(_table_records(1, -0.07), metrics=metric)
    assert one[0].p_value is not None and 0.0125 < one[0].p_value < 0.05 and one[0].verdict in CLAIMS
    three = verdict(_table_records(3, -0.07), metrics=metric)
    assert [v.verdict for v in three] == ["no difference"] * 3
    assert all(v.family == 3 and v.level == pytest.approx(0.05 / 3) for v in three)
    assert "Holm over 3 cells" in three[0].evidence


def test_an_unmeasurable_wall_clock_cell_gets_no_word_and_leaves_the_family() -> None:
    records = _table_records(2, -0.5)
    for r in records:
        r["seconds_to_target"] = r["optimizer_state_bytes"]
    seconds = next(m for m in METRICS if m.key == "seconds_to_target")
    vs = verdict(records, metrics=(METRICS[0], seconds),
                 unmeasurable={("opt0", "seconds_to_target"): "measured with 2 runs at once sharing the machine"})
    cell = next(v for v in vs if v.optimizer == "opt0" and v.metric.key == "seconds_to_target")
    assert cell.verdict == "not measurable here" and cell.points == []
    assert cell.evidence == "measured with 2 runs at once sharing the machine"
    assert {v.family for v in vs if v.verdict != "not measurable here"} == {3}


def test_a_speedup_beyond_the_ladder_is_a_bound_not_a_mean() -> None:
    """Every seed beyond the ladder's top (4x) at the largest size: no mean of bounds; the spread measured at the
    other sizes says the bound is real, so the optimizer is ahead there, shown as "≥ 4"."""
    speedup = next(m for m in METRICS if m.key == "speedup")
    records = []
    for size, values in (("tiny", [1.9, 2.1, 2.0]), ("mini", [2.6, 2.9, 3.1]), ("midi", [4.0, 4.0, 4.0])):
        for seed, value in enumerate(values):
            records.append({"optimizer": "muon", "model_size": size, "num_params": SIZES[size], "seed": seed,
                            "speedup": value, "speedup_censored": size == "midi",
                            "speedup_bound": "above" if size == "midi" else ""})
    v = verdict(records, metrics=(speedup,))[0]
    last = v.points[-1]
    assert last.censored_pairs == 3 and last.bounded == "upper" and last.stance == "ahead"
    assert last.ratio() == pytest.approx(4.0) and "speedup ≥ 4 [" in last.describe(speedup)
    assert "trend from 0 seed(s)" in v.evidence  # no slope through a bound
    assert v.verdict == "ahead, trend unresolved"


# ------------------------------------------------------------------------------ the data axis (issue 31)
def _grid(speedup: dict[tuple[str, float], float], seeds: int = 5) -> list[dict]:
    """Records of a sweep over sizes and data ratios: the baseline and "muon" with the given true speedup per (size,
    ratio), a little per-seed noise, final losses that fall with data for both alike."""
    params = {"tiny": 100_352.0, "mini": 793_088.0}
    out = []
    for (size, tpp), value in speedup.items():
        for s in range(seeds):
            base = {"optimizer": "adamw", "model_size": size, "num_params": params[size], "seed": s,
                    "budget_tpp": tpp, "final_eval_loss": 3.0 - 0.1 * math.log(tpp) + 0.01 * s}
            out.append(base)
            out.append({**base, "optimizer": "muon", "speedup": value * (1 + 0.01 * JITTER[s] / 0.013),
                        "final_eval_loss": base["final_eval_loss"] - 0.05})
    return out


def test_a_speedup_that_falls_with_data_reads_shrinks_with_data() -> None:
    """Marin's finding, constructed: Muon 2.0x at 0.5 tokens/param, 1.6x at 1, 1.3x at 2 (every seed's slope
    negative): along the data axis the verdict is "shrinks", written "shrinks with data", and the size axis is read at
    each ratio every size ran (here 0.5 and 1: mini did not run 2)."""
    from hf_optbench.measure.verdict import DATA_AXIS, SIZE_AXIS, grid_families, meanings, verdict_table

    truth = {("tiny", 0.5): 2.0, ("tiny", 1.0): 1.6, ("tiny", 2.0): 1.3, ("mini", 0.5): 2.0, ("mini", 1.0): 1.6}
    families = grid_families(_grid(truth))
    assert [(f.axis, f.at) for f in families] == [(SIZE_AXIS, "0.5 tok/param"), (SIZE_AXIS, "1 tok/param"),
                                                  (DATA_AXIS, "tiny"), (DATA_AXIS, "mini")]
    assert {m.question for f in families if f.axis == DATA_AXIS for m in f.metrics} == {"convergence", "stability"}
    table = verdict_table(families)
    speedups = {(v.axis, v.at): v for v in table if v.metric.key == "speedup"}
    tiny = speedups[(DATA_AXIS, "tiny")]
    assert (tiny.verdict, tiny.word) == ("shrinks", "shrinks with data")
    assert [p.model_size for p in tiny.points] == ["0.5 tok/param", "1 tok/param", "2 tok/param"]
    assert tiny.slope_per_decade > 0 and tiny.points[-1].ratio() == pytest.approx(1.3, rel=0.02)  # gap: unfavourable
    assert speedups[(DATA_AXIS, "mini")].verdict == "shrinks"  # two ratios are enough for a trend
    # along size at one ratio nothing changes: no trend claimed, and the family is the whole table's
    assert speedups[(SIZE_AXIS, "0.5 tok/param")].verdict in ("holds", "ahead, trend unresolved")
    assert {v.family for v in table if v.p_value is not None} == {sum(v.p_value is not None for v in table)}
    assert "as each parameter sees more data" in meanings(DATA_AXIS)["shrinks with data"]
    assert "largest data ratio" in meanings(DATA_AXIS)["holds"] and "size" not in meanings(DATA_AXIS)["grows with data"]


def test_a_speedup_flat_in_data_is_no_trend_word_and_one_ratio_is_one_family() -> None:
    from hf_optbench.measure.verdict import grid_families, verdict_table

    flat = {("tiny", 0.5): 1.5, ("tiny", 2.0): 1.5}
    (v,) = [v for v in verdict_table(grid_families(_grid(flat))) if v.metric.key == "speedup" and v.axis == "data"]
    assert v.verdict not in TREND_WORDS and v.points[-1].stance == "ahead"
    single = [{**r, "budget_tpp": None} for r in _grid({("tiny", 0.5): 1.5, ("mini", 0.5): 1.5})]
    (family,) = grid_families(single)  # a sweep with one ratio: the size axis only, as verdict() judges it
    assert family.axis == "size" and family.at == ""
    assert [v.verdict for v in verdict_table([family])] == [v.verdict for v in verdict(single)]
