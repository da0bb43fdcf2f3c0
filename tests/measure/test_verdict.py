"""The scaling verdict on constructed numbers: every verdict of the vocabulary, pairing, margins, censoring."""

from __future__ import annotations

import math

import pytest

from hf_optbench.measure.verdict import (
    METRICS,
    VERDICT_MEANINGS,
    VERDICTS,
    MetricSpec,
    Observation,
    stance,
    t_interval,
    verdict,
    verdict_for,
)

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
    assert len(VERDICTS) <= 8


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
    assert vs[0].verdict == "behind"
