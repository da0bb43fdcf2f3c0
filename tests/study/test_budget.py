"""A sweep's budget as tokens per parameter, and the baseline's ladder: steps per size, ladder runs, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.models import non_embedding_params
from hf_optbench.study.sweep_spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
TOKENS_PER_STEP = 8 * 64


def _sweep(tmp_path: Path, **extra: object) -> Path:
    raw = {"base": str(REPO / "recipes" / "quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
           "overrides": {"data_source": "synthetic", "block_size": 64, "per_device_train_batch_size": 8},
           "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny", "mini"], "seed": [1, 2]},
           "launcher": {"type": "python"}}
    for key, value in extra.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _steps(run: object) -> int:
    args = run.args  # type: ignore[attr-defined]
    return int(args[len(args) - 1 - args[::-1].index("--max_steps") + 1])


def test_budget_sets_max_steps_per_size_from_tokens_per_non_embedding_parameter(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": 0.5}))
    want = {s: round(0.5 * non_embedding_params(s) / TOKENS_PER_STEP) for s in ("tiny", "mini")}
    assert want == {"tiny": 98, "mini": 775}
    assert len(spec.runs) == 8
    for run in spec.runs:
        assert _steps(run) == want[run.model_size]
        assert run.budget_multiple is None


def test_the_ladder_adds_the_baselines_runs_at_each_multiple(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": 0.5}, ladder={"multiples": [4, 0.5, 1, 2]}))
    ladder = [r for r in spec.runs if r.budget_multiple is not None]
    assert len(spec.runs) == 8 + 2 * 2 * 3  # seeds x sizes x (the multiples other than 1)
    assert {r.optimizer for r in ladder} == {"adamw"}
    by_id = {r.run_id: r for r in spec.runs}
    assert _steps(by_id["adamw__tiny__s1__dx0.5"]) == 49
    assert _steps(by_id["adamw__tiny__s1__dx4"]) == 392
    assert _steps(by_id["adamw__mini__s2__dx2"]) == 1550
    assert _steps(by_id["lion__mini__s2"]) == 775 and "lion__mini__s2__dx2" not in by_id


def test_a_ladder_without_a_budget_multiplies_the_recipes_steps(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, ladder={"multiples": [0.5, 1, 2]},
                             overrides={"data_source": "synthetic", "max_steps": 40}))
    by_id = {r.run_id: r for r in spec.runs}
    assert _steps(by_id["adamw__tiny__s1"]) == 40 and _steps(by_id["adamw__tiny__s1__dx2"]) == 80


def test_tuning_runs_get_the_budget_but_not_the_ladder(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": 0.5}, ladder={"multiples": [0.5, 1, 2]},
                             tune={"lr_multipliers": [0.5, 1, 2], "seed": [0]},
                             overrides={"data_source": "synthetic", "block_size": 64, "tuning_blocks": 8}))
    assert spec.tuning is not None and spec.tuning.runs
    assert all(r.budget_multiple is None for r in spec.tuning.runs)
    assert {(r.model_size, _steps(r)) for r in spec.tuning.runs} == {("tiny", 98), ("mini", 775)}


@pytest.mark.parametrize(("extra", "message"), [
    ({"budget": {"tokens_per_param": -1}}, "budget.tokens_per_param must be a positive number"),
    ({"budget": {"tokens_per_parameter": 1}}, "unknown key 'tokens_per_parameter' in budget"),
    ({"budget": {}}, "budget needs tokens_per_param"),
    ({"budget": {"tokens_per_param": 1},
      "overrides": {"data_source": "synthetic", "max_steps": 10}}, "'max_steps' in overrides conflicts"),
    ({"ladder": {"multiples": [2, 4, 8]}}, "must hold 1"),
    ({"ladder": {"multiples": [1, 2]}}, "at least 3 distinct values"),
    ({"ladder": {"multiples": [0.5, 1, 2], "optimizer": "sgd"}}, "ladder.optimizer 'sgd' is not in matrix"),
    ({"ladder": [0.5, 1, 2]}, "ladder must be a mapping"),
    ({"budget": {"tokens_per_param": 0.003}, "ladder": {"multiples": [0.5, 1, 2]}}, "collapse to the same step"),
    ({"ladder": {"multiples": [0.5, 1, 2], "max_multiple": 1}}, "max_multiple 1 is below the ladder's largest"),
    ({"ladder": {"multiples": [0.5, 1, 2], "max_multiple": -4}}, "ladder.max_multiple must be a positive number"),
])
def test_bad_budget_or_ladder_stops_before_any_run(tmp_path: Path, extra: dict, message: str) -> None:
    with pytest.raises(OptBenchError, match=message):
        load_sweep(_sweep(tmp_path, **extra))
    assert not (tmp_path / "out").exists()


def test_the_ladder_states_the_cap_of_its_extension(tmp_path: Path) -> None:
    """Issue 29: the ladder grows by doubling while a run beats its top rung, up to a cap the sweep states."""
    spec = load_sweep(_sweep(tmp_path, ladder={"multiples": [0.5, 1, 2], "max_multiple": 16}))
    assert spec.ladder is not None and spec.ladder.cap == 16.0
    assert load_sweep(_sweep(tmp_path, ladder={"multiples": [0.5, 1, 2]})).ladder.cap == 16.0  # 8 x the top


# ------------------------------------------------------------------------------ data per parameter as an axis
def test_a_list_of_ratios_runs_every_size_at_each_and_the_ids_carry_the_ratio(tmp_path: Path) -> None:
    """Issue 31: budget.tokens_per_param [0.25, 0.5]: each (size, ratio) cell is a sweep of its own inside the sweep,
    its runs named by the ratio (``__tpp0.25``), its max_steps from its own ratio, its ladder at its own budgets."""
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": [0.5, 0.25]}, ladder={"multiples": [0.5, 1, 2]}))
    by_id = {r.run_id: r for r in spec.runs}
    assert len(spec.runs) == 2 * (8 + 2 * 2 * 2)  # ratios x (compared + the baseline's two other rungs)
    assert _steps(by_id["lion__mini__s1__tpp0.25"]) == 387 and _steps(by_id["lion__mini__s1__tpp0.5"]) == 775
    assert _steps(by_id["adamw__tiny__s2__tpp0.5__dx2"]) == 196 and by_id["adamw__tiny__s2__tpp0.5__dx2"].budget_tpp == 0.5
    assert {r.budget_tpp for r in spec.runs} == {0.25, 0.5} and spec.budget.ratios == (0.25, 0.5)
    assert all("__tpp" in r.run_id for r in spec.runs)
    assert by_id["adamw__tiny__s1__tpp0.25"].env["WANDB_TAGS"].endswith("tokens_per_param:0.25")


@pytest.mark.parametrize("ratio", [0.5, [0.5]])
def test_one_ratio_keeps_the_ids_and_steps_of_before(tmp_path: Path, ratio: object) -> None:
    """A sweep with one ratio (a number, or a list of one) names its runs as before, so its directory resumes."""
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": ratio}, ladder={"multiples": [0.5, 1, 2]}))
    assert "adamw__tiny__s1__dx2" in {r.run_id for r in spec.runs}
    assert all("tpp" not in r.run_id and r.budget_tpp is None for r in spec.runs)
    assert spec.tuned_file_for(None) == spec.tuned_file


def test_a_cell_left_out_of_the_grid_has_no_runs(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": [0.25, 0.5],
                                               "exclude": [{"model_size": "mini", "tokens_per_param": 0.5}]},
                             tune={"lr_multipliers": [0.5, 1, 2], "seed": [0]},
                             overrides={"data_source": "synthetic", "block_size": 64, "tuning_blocks": 8}))
    cells = {(r.model_size, r.budget_tpp) for r in spec.runs}
    assert cells == {("tiny", 0.25), ("tiny", 0.5), ("mini", 0.25)}
    assert {(r.model_size, r.budget_tpp) for r in spec.tuning.runs} == cells  # not tuned either
    assert ("mini", "adamw", 0.5) not in spec.steps and spec.steps[("mini", "adamw", 0.25)] == 387


def test_each_ratios_runs_read_their_own_tuned_file(tmp_path: Path) -> None:
    """Two ratios' runs can share a step count (0.25's x2 rung and 0.5's compared run: 98 steps at tiny) with other
    tuned values, so each ratio has its own tuned file and every compared run points at its own ratio's."""
    from hf_optbench.study.sweep_spec import attach_tuned_file

    spec = load_sweep(_sweep(tmp_path, budget={"tokens_per_param": [0.25, 0.5]}, ladder={"multiples": [0.5, 1, 2]},
                             tune={"lr_multipliers": [0.5, 1, 2], "seed": [0]},
                             overrides={"data_source": "synthetic", "block_size": 64, "tuning_blocks": 8,
                                        "per_device_train_batch_size": 8}))
    attach_tuned_file(spec)
    by_id = {r.run_id: r for r in spec.runs}
    shared = (by_id["adamw__tiny__s1__tpp0.25__dx2"], by_id["adamw__tiny__s1__tpp0.5"])
    assert _steps(shared[0]) == _steps(shared[1]) == 98
    files = [run.args[run.args.index("--tuned_hparams_file") + 1] for run in shared]
    assert files == [str(tmp_path / "out" / "tuned_hparams__tpp0.25.yaml"), str(tmp_path / "out" / "tuned_hparams__tpp0.5.yaml")]


@pytest.mark.parametrize(("budget", "message"), [
    ({"tokens_per_param": []}, "budget.tokens_per_param is an empty list"),
    ({"tokens_per_param": [0.5, 2, 0.5]}, "lists 0.5 twice"),
    ({"tokens_per_param": [0.5, 0.5000001]}, "lists 0.5 twice"),
    ({"tokens_per_param": [0.5, 0]}, "budget.tokens_per_param must be a positive number, got 0"),
    ({"tokens_per_param": [0.5, -2]}, "must be a positive number, got -2"),
    ({"tokens_per_param": [0.5, "2"]}, "must be a positive number, got '2'"),
    ({"tokens_per_param": [0.5, True]}, "must be a positive number, got True"),
    ({"tokens_per_param": 0.5, "exclude": [{"model_size": "mini", "tokens_per_param": 0.5}]}, "has one ratio"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "midi", "tokens_per_param": 2}]}, "not in the grid"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "mini", "tokens_per_param": 4}]}, "not in the grid"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "mini"}]}, "needs model_size and tokens_per_param"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "mini", "tokens_per_param": 2, "x": 1}]},
     "unknown key 'x' in budget.exclude"),
    ({"tokens_per_param": [0.5, 2], "exclude": []}, "budget.exclude must be a non-empty list"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "mini", "tokens_per_param": 2},
                                                 {"model_size": "mini", "tokens_per_param": 2.0}]}, "twice"),
    ({"tokens_per_param": [0.5, 2], "exclude": [{"model_size": "mini", "tokens_per_param": 2},
                                                 {"model_size": "MINI", "tokens_per_param": 0.5}]}, "leaves mini no ratio"),
])
def test_bad_ratio_lists_are_refused_before_any_run(tmp_path: Path, budget: dict, message: str) -> None:
    with pytest.raises(OptBenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_sweep(_sweep(tmp_path, budget=budget))
    assert not (tmp_path / "out").exists()


def test_a_bad_ratio_list_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hf_optbench.cli import main

    assert main(["sweep", str(_sweep(tmp_path, budget={"tokens_per_param": [2, 0.5, 2]})), "--dry_run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "budget.tokens_per_param lists 2 twice" in err and "remove the duplicate" in err


@pytest.mark.parametrize(("name", "cells", "optimizers", "seeds", "ladder", "limit_s"), [
    ("cpu_demo", {("tiny", 0.5), ("tiny", 1.0)}, {"adamw", "lion", "muon", "adafactor"}, {1, 2, 3, 4, 5},
     (0.5, 1.0, 2.0, 4.0), 15 * 60),
    ("cpu_study", {("nano", 2.4), ("nano", 7.6), ("nano", 24.0), ("tiny", 0.76), ("tiny", 2.4), ("tiny", 7.6)},
     {"adamw", "lion", "muon", "adafactor", "soap", "schedule_free_adamw"}, {1, 2, 3, 4, 5, 6},
     (0.5, 1.0, 2.0, 4.0), 120 * 60),
])
def test_the_shipped_grids_past_the_transient(name: str, cells: set, optimizers: set, seeds: set, ladder: tuple,
                                              limit_s: int) -> None:
    """The main job and the CPU study, as shipped: their size x ratio cells, their paired seeds, the ladder with its
    4x rung, no run longer than the synthetic stream (no token seen twice), and notes that give the estimate's
    arithmetic and the measured time, within the promise (15 minutes for `make demo`, 2 hours for the study)."""
    import re

    from hf_optbench.study.budget import ladder_steps

    path = REPO / "recipes" / "sweeps" / f"{name}.yaml"
    spec = load_sweep(path)
    assert {(r.model_size, r.budget_tpp) for r in spec.runs} == cells
    assert {r.optimizer for r in spec.runs} == optimizers and {r.seed for r in spec.runs} == seeds
    assert spec.ladder is not None and spec.ladder.multiples == ladder
    raw = yaml.safe_load(path.read_text())
    batch = {size: int(keys["per_device_train_batch_size"]) for size, keys in raw["per_model_size"].items()}
    longest = max(ladder_steps(steps, 4.0) * batch[size] * 64 for (size, _, _), steps in spec.steps.items())
    assert longest <= spec.overrides["synthetic_num_tokens"]
    header = path.read_text().split("\nname:")[0]
    assert "docs/notes/cpu_sweeps.md" in header  # where its cost arithmetic and measured time are
    notes = (REPO / "docs" / "notes" / "cpu_sweeps.md").read_text()
    section = notes.split(f"({name}.yaml)", 1)[1].split("\n## ", 1)[0]
    assert "stimated wall time" in section and "core-s" in section
    measured = re.search(r"\*\*Measured\*\* \(2026-\d\d-\d\d, [^)]*\):.*?\b(?:(\d+):)?(\d{1,2}):(\d\d)\b", section, re.S)
    assert measured, f"cpu_sweeps.md's {name}.yaml section states no measured time ('**Measured** (date, machine): h:mm:ss')"
    hours, minutes, seconds = (int(g or 0) for g in measured.groups())
    assert 3600 * hours + 60 * minutes + seconds <= limit_s
