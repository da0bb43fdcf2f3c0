"""Targets fixed from the baseline alone; censoring instead of dropping; matched-budget eval loss; the normalised
loss mean; the wall-clock warning; hyperparameter sources and tuning curves."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_optbench.report.analysis import analyse
from hf_optbench.report.noise import spread_exceeds_effect, wallclock_note
from hf_optbench.report.targets import eval_at_tokens, mean_loss_over_budget
from hf_optbench.report.tuning_curves import curve_frame, short_source, sources_cell

from fixtures.sweep_fixture import build_fixture_sweep

STEPS, TOKENS_PER_STEP = 60, 256


def _targets(root: Path) -> dict[str, list[tuple[str, float]]]:
    return {size: [(t.name, t.loss) for t in ts] for size, ts in analyse(root).targets.items()}


def test_targets_do_not_move_when_an_optimizer_is_added_or_dropped(tmp_path: Path) -> None:
    kw = {"sizes": ("tiny", "mini"), "seeds": (0, 1), "steps": STEPS}
    two = _targets(build_fixture_sweep(tmp_path / "two", optimizers=("adamw", "lion"), **kw))
    three = _targets(build_fixture_sweep(tmp_path / "three", optimizers=("adamw", "lion", "adafactor"), **kw))
    alone = _targets(build_fixture_sweep(tmp_path / "alone", optimizers=("adamw", "adafactor"), **kw))
    assert two == three == alone
    assert [name for name, _ in two["tiny"]] == ["25%", "50%", "75%", "100%"]
    # decreasing constructed curves: a later point of the budget is a lower target
    assert two["tiny"][0][1] > two["tiny"][1][1]


def test_a_run_that_never_reaches_the_target_is_censored_not_dropped(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0, 1, 2),
                               steps=STEPS, floor_offset={"lion__mini__s1": 2.0})
    an = analyse(root)
    slow = next(r for r in an.records if r["run_id"] == "lion__mini__s1")
    assert slow["target"] == "50%"
    assert slow["tokens_to_target"] == STEPS * TOKENS_PER_STEP and slow["tokens_to_target_censored"] is True
    assert slow["steps_to_target"] == STEPS and slow["target_censored"] is True
    fast = next(r for r in an.records if r["run_id"] == "lion__mini__s0")
    assert fast["tokens_to_target_censored"] is False and fast["tokens_to_target"] < STEPS * TOKENS_PER_STEP
    tok = next(v for v in an.verdicts if v.optimizer == "lion" and v.metric.key == "tokens_to_target")
    mini = next(p for p in tok.points if p.model_size == "mini")
    assert mini.n_pairs == 3 and mini.censored_pairs == 1  # counted at its budget, not dropped


def test_a_diverged_run_is_censored_at_its_planned_budget(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0, 1),
                               steps=STEPS, diverged=["lion__tiny__s0"])
    an = analyse(root)
    run = next(r for r in an.records if r["run_id"] == "lion__tiny__s0")
    assert run["status"] == "diverged" and run["steps"] < STEPS
    final = run["to_target"]["100%"]  # the end-of-budget target lies beyond where the run stopped
    assert final == {"steps": STEPS, "tokens": STEPS * TOKENS_PER_STEP, "seconds": pytest.approx(
        run.summary["step_time_median_s"] * STEPS), "censored": True}
    assert run["mean_loss_over_budget"] is None  # no mean loss for a diverged run (it counts under stability)


def test_eval_loss_at_matched_tokens_interpolates_and_never_extrapolates() -> None:
    evals = [{"tokens": 100, "eval_loss": 5.0}, {"tokens": 200, "eval_loss": 4.0}, {"tokens": 300,
                                                                                      "eval_loss": float("nan")}]
    assert eval_at_tokens(evals, 150) == pytest.approx(4.5)
    assert eval_at_tokens(evals, 200) == pytest.approx(4.0)
    assert eval_at_tokens(evals, 50) is None and eval_at_tokens(evals, 400) is None
    assert eval_at_tokens(evals, 250) is None  # past a divergence


def test_mean_loss_over_budget_does_not_reward_stopping_early() -> None:
    full = [{"tokens": t, "loss": 4.0} for t in range(0, 1001, 100)]
    short = full[:4]  # same loss, but logged only the first 300 of 1,000 tokens
    assert mean_loss_over_budget(full, 1000, diverged=False) == pytest.approx(4.0)
    assert mean_loss_over_budget(short, 1000, diverged=False) == pytest.approx(4.0)  # extended at its last loss
    falling = [{"tokens": 0, "loss": 6.0}, {"tokens": 1000, "loss": 4.0}]
    assert mean_loss_over_budget(falling, 1000, diverged=False) == pytest.approx(5.0)
    assert mean_loss_over_budget(falling, 1000, diverged=True) is None


def test_wallclock_warning_when_seed_spread_exceeds_the_effect() -> None:
    base = {0: 10.0, 1: 10.0}
    # the two demos of the issue: ratios 2.23 and 13.2 for identical configurations
    noisy = wallclock_note({0: 22.3, 1: 132.0}, base)
    assert noisy.startswith("(spread 2.2-13x > effect") and "not interpretable on this machine" in noisy
    assert wallclock_note({0: 5.0, 1: 5.2}, base) == ""  # consistent halving: readable
    assert wallclock_note({0: 10.05, 1: 9.95}, base) == ""  # no effect, but seeds agree within the 2 % margin
    assert wallclock_note({0: 5.0}, {0: 10.0}) == ""  # one seed: nothing to judge the spread by
    assert spread_exceeds_effect([0.8, 9.7]) and not spread_exceeds_effect([0.5, 0.52])


def test_hyperparameter_sources_and_tuning_curve(tmp_path: Path) -> None:
    assert short_source("Chen et al. 2023, Symbolic Discovery, Sec. 5 | other") == "cited: Chen et al. 2023"
    assert short_source("tuned: /tmp/x/runs/t.yaml") == "tuned: t.yaml" and short_source("user") == "user"
    cited = "Loshchilov & Hutter 2019, Decoupled Weight Decay"
    assert sources_cell({"learning_rate": cited, "weight_decay": cited, "max_grad_norm": cited}) == \
        "all cited: Loshchilov & Hutter 2019"
    assert sources_cell({"learning_rate": "user", "weight_decay": cited}) == \
        "lr user; wd cited: Loshchilov & Hutter 2019"
    root = build_fixture_sweep(tmp_path / "t", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1),
                               steps=30, lr_multipliers=(0.5, 1.0, 2.0), tuning_loss=True,
                               diverged=["lion__tiny__s1__lrx2"])
    an = analyse(root)
    assert {r["lr_multiplier"] for r in an.records} == {1.0} and len(an.tuning) == 12
    frame, key = curve_frame(an.tuning)
    assert key == "final_tuning_loss" and len(frame) == 6
    lion = frame[frame["optimizer"] == "lion"].set_index("lr_multiplier")
    assert lion.loc[2.0, "bad"] == 1 and not lion.loc[2.0, "best"]  # a diverged seed disqualifies the rate
    assert frame.groupby("optimizer")["best"].sum().tolist() == [1, 1]


def test_a_target_the_baseline_reaches_out_of_order_is_refused() -> None:
    """AdamW's loss flat from 75 % to 100 % of its budget: the 100 % target is no time to quality (every ratio to it
    would read 1 [1, 1]), so it is left out with a note; the earlier ones stay."""
    from hf_optbench.report.targets import baseline_targets
    from hf_optbench.study.records import RunRecord

    def run(seed: int, losses: list[float]) -> tuple[RunRecord, list[dict], int]:
        rec = RunRecord(f"adamw__tiny__s{seed}", seed=seed, max_steps=len(losses), figures={"tokens_per_step": 10})
        return rec, [{"step": i + 1, "loss": v} for i, v in enumerate(losses)], 1

    curve = [5.0 - 0.1 * i for i in range(6)] + [4.5, 4.5]  # steps 1-8: falls to step 6, flat after
    targets, notes = baseline_targets("tiny", [run(1, curve), run(2, curve)], "adamw")
    assert [t.name for t in targets] == ["25%", "50%", "75%"]
    assert notes == ["tiny: the 100% target (4.5000) is not below the 75% one (4.5000): adamw reaches it out of "
                     "order, so it is no target (left out)"]
