"""Schedule values at chosen steps equal their formulas; warmup conventions; schedule-free rules; records."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.schedules import (
    SCHEDULES,
    build_scheduler,
    describe_scheduler,
    resolve_schedule,
    resolve_warmup_steps,
)

PEAK = 6e-4


def opt(lr: float = PEAK) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def lrs(sched, n: int) -> list[float]:
    """LR used at steps 0..n-1 (the value in effect when optimizer.step() runs)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n):
            out.append(sched.optimizer.param_groups[0]["lr"])
            sched.optimizer.step()
            sched.step()
    return out


def test_gpt3_cosine_warmup_then_cosine_to_ten_percent():
    n, w, r = 100, 10, 0.1
    got = lrs(build_scheduler("gpt3_cosine", opt(), num_training_steps=n, warmup_steps=w, min_lr_ratio=r), n + 1)

    def formula(s):
        if s < w:
            return PEAK * s / w
        return PEAK * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * (s - w) / (n - w))))

    for s in (0, 5, 10, 11, 55, 99, 100):
        assert got[s] == pytest.approx(formula(s), rel=1e-9, abs=1e-15), s
    assert got[100] == pytest.approx(0.1 * PEAK)


def test_warmup_fraction_and_steps():
    assert resolve_warmup_steps(0.1, 200) == 20 and resolve_warmup_steps(0.0, 200) == 0
    assert resolve_warmup_steps(37, 200) == 37 and resolve_warmup_steps(37.0, 200) == 37
    with pytest.raises(OptBenchError):
        resolve_warmup_steps(2.5, 200)
    with pytest.raises(OptBenchError):
        resolve_warmup_steps(-1, 200)
    sched = build_scheduler("gpt3_cosine", opt(), num_training_steps=200, warmup_steps=0.1)
    assert describe_scheduler(sched)["warmup_steps"] == 20
    with pytest.raises(OptBenchError, match="longer than the run"):
        build_scheduler("gpt3_cosine", opt(), num_training_steps=10, warmup_steps=20)


def test_wsd_warmup_stable_then_one_minus_sqrt_decay():
    n, w, r = 100, 10, 0.1
    sched = build_scheduler("wsd", opt(), num_training_steps=n, warmup_steps=w, min_lr_ratio=r)
    got = lrs(sched, n + 1)
    decay = 20  # default decay_ratio 0.2
    stable_end = n - decay
    assert got[0] == pytest.approx(PEAK * r)  # transformers' WSD warms up from min_lr_ratio
    assert got[5] == pytest.approx(PEAK * (r + (1 - r) * 5 / w))
    assert got[10] == got[50] == got[stable_end - 1] == pytest.approx(PEAK)
    for s in (stable_end, 85, 99):
        p = (s - stable_end) / decay
        assert got[s] == pytest.approx(PEAK * (r + (1 - r) * (1 - math.sqrt(p)))), s
    assert got[100] == pytest.approx(PEAK * r)
    rec = describe_scheduler(sched)
    assert rec["decay_steps"] == 20 and rec["decay_type"] == "1-sqrt"
    linear = lrs(build_scheduler("wsd", opt(), num_training_steps=n, warmup_steps=0, decay_ratio=0.5,
                                 decay_type="linear", min_lr_ratio=0.0), n)
    assert linear[75] == pytest.approx(PEAK * 0.5)


def test_one_cycle_matches_torch_formula():
    n, w = 100, 20
    got = lrs(build_scheduler("one_cycle", opt(), num_training_steps=n, warmup_steps=w), n)
    initial, final = PEAK / 25, PEAK / 25 / 1e4
    assert got[0] == pytest.approx(initial)
    peak_step = int(0.2 * n) - 1  # OneCycleLR's first phase ends at pct_start * total - 1
    assert got[peak_step] == pytest.approx(PEAK)
    assert got[peak_step // 2] == pytest.approx(initial + (PEAK - initial) * (1 - math.cos(math.pi * (peak_step // 2) / peak_step)) / 2)
    assert got[n - 1] == pytest.approx(final, rel=1e-6)
    assert max(got) == pytest.approx(PEAK)
    default = build_scheduler("one_cycle", opt(), num_training_steps=n, warmup_steps=0)
    assert describe_scheduler(default)["pct_start"] == 0.3 and describe_scheduler(default)["cycle_momentum"] is False
    with pytest.raises(OptBenchError, match="pct_start"):
        build_scheduler("one_cycle", opt(), num_training_steps=n, warmup_steps=10, pct_start=0.5)


def test_constant_schedules():
    got = lrs(build_scheduler("constant_with_warmup", opt(), num_training_steps=50, warmup_steps=10), 20)
    assert got[0] == 0 and got[5] == pytest.approx(PEAK / 2) and got[10] == got[19] == pytest.approx(PEAK)
    assert set(lrs(build_scheduler("constant", opt(), num_training_steps=50, warmup_steps=0), 10)) == {PEAK}
    with pytest.raises(OptBenchError, match="constant_with_warmup"):
        build_scheduler("none", opt(), num_training_steps=50, warmup_steps=0.1)


def test_schedule_free_takes_no_decay_and_gets_the_warmup():
    from schedulefree import AdamWScheduleFree

    sf = AdamWScheduleFree([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    with pytest.raises(OptBenchError, match="schedule-free"):
        build_scheduler("gpt3_cosine", sf, num_training_steps=100, warmup_steps=10)
    sched = build_scheduler("none", sf, num_training_steps=100, warmup_steps=0.1)
    assert sf.param_groups[0]["warmup_steps"] == 10 and describe_scheduler(sched)["name"] == "constant"
    record = resolve_schedule("none", num_training_steps=100, warmup_steps=0.1, schedule_free=True)
    assert record["warmup_by"] == "optimizer" and record["warmup_steps"] == 10
    assert sf.param_groups[0]["lr"] == 1e-3  # the LR itself is left to the optimizer
    sf2 = AdamWScheduleFree([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, warmup_steps=5)
    with pytest.raises(OptBenchError, match="warmup given twice"):
        build_scheduler("none", sf2, num_training_steps=100, warmup_steps=10)


def test_unknown_schedule_and_kwargs_are_named():
    with pytest.raises(OptBenchError, match="Did you mean 'gpt3_cosine'"):
        build_scheduler("gpt3_cosin", opt(), num_training_steps=10, warmup_steps=0)
    with pytest.raises(OptBenchError, match="'decay_ration'.*Did you mean 'decay_ratio'"):
        build_scheduler("wsd", opt(), num_training_steps=10, warmup_steps=0, decay_ration=0.1)
    assert set(SCHEDULES) == {"gpt3_cosine", "wsd", "one_cycle", "cosine", "linear", "constant_with_warmup",
                              "constant", "none"}


def test_transformers_cosine_and_linear_decay_to_zero():
    n, w = 100, 10
    cosine = lrs(build_scheduler("cosine", opt(), num_training_steps=n, warmup_steps=w), n + 1)
    assert cosine[w] == pytest.approx(PEAK) and cosine[n] == pytest.approx(0.0, abs=1e-15)
    assert cosine[55] == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi * 45 / 90)))
    linear = lrs(build_scheduler("linear", opt(), num_training_steps=n, warmup_steps=w), n + 1)
    assert linear[w] == pytest.approx(PEAK) and linear[55] == pytest.approx(PEAK * 45 / 90) and linear[n] == 0


def test_a_scheduler_built_elsewhere_is_named_from_what_it_computes():
    """Issue 39: transformers' get_cosine_schedule_with_warmup (cosine to 0) was labelled gpt3_cosine (to 10%)."""
    from torch.optim.lr_scheduler import LambdaLR, StepLR
    from transformers import get_cosine_schedule_with_warmup

    rec = describe_scheduler(get_cosine_schedule_with_warmup(opt(), num_warmup_steps=2, num_training_steps=10))
    assert rec["name"] == "cosine" and rec["warmup_steps"] == 2 and rec["class"] == "torch.optim.lr_scheduler.LambdaLR"
    assert rec["shape"] == {"steps": 10, "warmup_steps": 2, "peak_lr_ratio": 1.0, "lr_ratio_at_end": 0.0}
    ours = describe_scheduler(build_scheduler("gpt3_cosine", opt(), num_training_steps=10, warmup_steps=2))
    assert ours["name"] == "gpt3_cosine" and ours["shape"]["lr_ratio_at_end"] == pytest.approx(0.1)
    own = describe_scheduler(LambdaLR(opt(), lambda s: min(1.0, (s + 1) / 4)), num_training_steps=8)
    assert own["name"] == "torch.optim.lr_scheduler.LambdaLR" and own["lr_lambda"].endswith("<lambda>")
    assert own["warmup_steps"] == 3 and own["shape"]["lr_ratio_at_end"] == 1.0
    assert describe_scheduler(StepLR(opt(), 5))["name"] == "torch.optim.lr_scheduler.StepLR"


def test_groups_keep_their_ratio():
    p1, p2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    o = torch.optim.SGD([{"params": [p1], "lr": 1e-3}, {"params": [p2], "lr": 2e-2}], lr=1e-3)
    sched = build_scheduler("gpt3_cosine", o, num_training_steps=20, warmup_steps=4)
    lrs(sched, 7)
    a, b = (g["lr"] for g in o.param_groups)
    assert b / a == pytest.approx(20.0)


@pytest.mark.parametrize("name, kwargs", [
    ("gpt3_cosine", {"warmup_steps": 0.1}), ("wsd", {"warmup_steps": 2, "decay_ratio": 0.3, "decay_type": "cosine"}),
    ("one_cycle", {"warmup_steps": 3}), ("constant_with_warmup", {"warmup_steps": 4}), ("constant", {}),
])
def test_describe_scheduler_reads_the_built_object(name: str, kwargs: dict) -> None:
    """What a scheduler computes is read from the object (its transformers lambda and arguments, or OneCycleLR's
    phases), nothing stamped on it: every parameter it holds equals the resolved record's."""
    sched = build_scheduler(name, opt(), num_training_steps=20, **kwargs)
    assert not [k for k in vars(sched) if k.startswith("hf_optbench")]
    held, planned = describe_scheduler(sched), resolve_schedule(name, num_training_steps=20, **kwargs)
    assert held["name"] == name and "warmup_steps" in held
    assert {k: held[k] for k in held if k in planned} == {k: planned[k] for k in held if k in planned}


def test_describe_scheduler_names_transformers_default() -> None:
    """The Trainer's own default (lr_scheduler_type "linear") is named as such, not taken for ours."""
    from transformers.optimization import get_scheduler

    held = describe_scheduler(get_scheduler("linear", opt(), num_warmup_steps=2, num_training_steps=10))
    assert held == {"name": "linear", "class": "torch.optim.lr_scheduler.LambdaLR", "warmup_steps": 2,
                    "num_training_steps": 10,
                    "shape": {"steps": 10, "warmup_steps": 2, "peak_lr_ratio": 1.0, "lr_ratio_at_end": 0.0}}
