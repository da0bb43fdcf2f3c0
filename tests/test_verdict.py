"""The scaling verdict on constructed numbers: shrinking, holding, growing, not significant."""

from __future__ import annotations

import math

import pytest

from hf_optbench.verdict import METRICS, MetricSpec, Observation, classify, compare_size, verdict, verdict_for

SIZES = {"tiny": 3.3e6, "mini": 7.2e6, "midi": 1.2e7, "big": 1.2e8}
RATIO = MetricSpec("m", "memory", "metric")


def _obs(ratios: dict[str, float], *, base: float = 100.0, jitter: float = 0.0, seeds: int = 2,
         opt: str = "opt") -> list[Observation]:
    """Baseline = base (+-jitter over seeds); the optimizer = base * ratio (+-jitter)."""
    out = []
    for size, ratio in ratios.items():
        for s in range(seeds):
            sign = 1 if s % 2 == 0 else -1
            out.append(Observation("adamw", size, SIZES[size], s, base * (1 + sign * jitter)))
            out.append(Observation(opt, size, SIZES[size], s, base * ratio * (1 + sign * jitter)))
    return out


def test_constant_saving_holds() -> None:
    v = verdict_for(_obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5}), "opt", RATIO)
    assert v.verdict == "holds"
    assert [round(p.ratio(), 6) for p in v.points] == [0.5, 0.5, 0.5]
    assert v.change == pytest.approx(0.0, abs=1e-12)


def test_falling_ratio_means_the_saving_grows() -> None:
    v = verdict_for(_obs({"tiny": 0.8, "mini": 0.6, "midi": 0.4, "big": 0.2}), "opt", RATIO)
    assert v.verdict == "grows"
    assert v.slope_per_decade is not None and v.slope_per_decade < 0


def test_rising_ratio_means_the_saving_shrinks() -> None:
    v = verdict_for(_obs({"tiny": 0.5, "mini": 0.7, "midi": 0.9}), "opt", RATIO)
    assert v.verdict == "shrinks"
    assert v.change is not None and v.change > v.threshold


def test_a_worse_optimizer_falling_further_behind_also_shrinks() -> None:
    v = verdict_for(_obs({"tiny": 1.1, "mini": 1.3, "midi": 1.6}), "opt", RATIO)
    assert v.verdict == "shrinks"


def test_difference_inside_seed_spread_is_not_significant() -> None:
    # 1 % gap, 10 % seed-to-seed jitter
    v = verdict_for(_obs({"tiny": 1.01, "mini": 0.99, "midi": 1.01}, jitter=0.1), "opt", RATIO)
    assert v.verdict == "not significant"
    assert not any(p.significant for p in v.points)


def test_trend_inside_seed_noise_holds_not_grows() -> None:
    # a clear 30 % saving, drifting 0.70 -> 0.66, with 5 % seed jitter: the drift is within 2 x spread
    v = verdict_for(_obs({"tiny": 0.70, "mini": 0.68, "midi": 0.66}, jitter=0.05), "opt", RATIO)
    assert all(p.significant for p in v.points)
    assert v.verdict == "holds"
    # the same drift without seed noise is still below the 5 % minimum change
    assert verdict_for(_obs({"tiny": 0.70, "mini": 0.69, "midi": 0.68}), "opt", RATIO).verdict == "holds"


def test_one_size_is_insufficient() -> None:
    assert verdict_for(_obs({"mini": 0.5}), "opt", RATIO).verdict == "insufficient data"


def test_missing_and_zero_values() -> None:
    obs = _obs({"tiny": 0.5, "mini": 0.5, "midi": 0.5})
    obs = [o for o in obs if not (o.optimizer == "opt" and o.model_size == "midi")]
    v = verdict_for(obs, "opt", RATIO)
    assert len(v.points) == 2 and any("no value for opt" in n for n in v.notes)
    stateless = [Observation(o.optimizer, o.model_size, o.num_params, o.seed,
                             0.0 if o.optimizer == "opt" else o.value) for o in _obs({"tiny": 1, "mini": 1})]
    assert verdict_for(stateless, "opt", RATIO).verdict == "holds"


def test_difference_metrics() -> None:
    spec = MetricSpec("spikes", "stability", "spikes", "difference", 1.0, 1.0)
    grows_worse = []
    for size, extra in (("tiny", 0.0), ("mini", 2.0), ("midi", 6.0)):
        for s in range(2):
            grows_worse += [Observation("adamw", size, SIZES[size], s, 1.0),
                            Observation("opt", size, SIZES[size], s, 1.0 + extra)]
    assert verdict_for(grows_worse, "opt", spec).verdict == "shrinks"
    gap, spread, significant = compare_size([0.0, 1.0], [0.0, 0.0], spec)
    assert gap == 0.5 and spread == pytest.approx(math.sqrt(0.5)) and not significant


def test_classify_threshold_uses_the_larger_of_noise_and_minimum() -> None:
    obs = _obs({"tiny": 0.5, "midi": 0.5 * 1.2}, jitter=0.0)
    v = verdict_for(obs, "opt", RATIO)
    assert v.threshold == pytest.approx(RATIO.min_change)
    assert v.verdict == "shrinks"
    label, *_ = classify(v.points, RATIO, k=100.0)
    assert label == "shrinks"  # spread is 0: k does not matter


def test_verdict_over_records_covers_every_optimizer_and_metric() -> None:
    records = []
    for opt, state in (("adamw", 8.0), ("lion", 4.0), ("sgd", 4.0)):
        for size in ("tiny", "mini", "midi"):
            for seed in (0, 1):
                records.append({"optimizer": opt, "model_size": size, "num_params": SIZES[size], "seed": seed,
                                "optimizer_state_bytes": state * SIZES[size], "final_eval_loss": 5.0 + 0.01 * seed,
                                "diverged": 0.0})
    out = verdict(records)
    assert {(v.optimizer, v.metric.key) for v in out} == {(o, m.key) for o in ("lion", "sgd") for m in METRICS}
    state = {v.optimizer: v.verdict for v in out if v.metric.key == "optimizer_state_bytes"}
    assert state == {"lion": "holds", "sgd": "holds"}
    loss = {v.optimizer: v.verdict for v in out if v.metric.key == "final_eval_loss"}
    assert loss == {"lion": "not significant", "sgd": "not significant"}
    missing = {v.optimizer: v.verdict for v in out if v.metric.key == "tokens_to_target"}
    assert missing == {"lion": "insufficient data", "sgd": "insufficient data"}
