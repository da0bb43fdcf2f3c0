"""The report compares only comparable runs: a directory whose runs differ in anything but optimizer, size, seed and
the tuned learning rate / weight decay (steps, world size, a constructor value, ...) is refused with exit 2 and one
line naming the setting and the runs, before anything is written; a clean sweep, and the baseline's ladder runs at
other budgets, still report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hf_optbench import cli
from hf_optbench.errors import OptBenchError
from hf_optbench.report.analysis import analyse
from hf_optbench.rundir import IDENTITY_FILE

from fixtures.sweep_fixture import build_fixture_sweep


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1, 2),
                               steps=30)


def _edit(run_dir: Path, **changes) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(changes)
    path.write_text(json.dumps(summary))


def test_runs_with_other_max_steps_are_refused_naming_the_key_and_runs(sweep: Path, capsys) -> None:
    _edit(sweep / "runs" / "adamw__tiny__s2", max_steps=600)
    before = sorted(p.relative_to(sweep) for p in sweep.rglob("*"))
    assert cli.main(["report", str(sweep)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tiny runs differ in max_steps"), err
    assert "600: adamw__tiny__s2" in lines[0] and "30: adamw__tiny__s0" in lines[0]
    assert "Report one sweep's directory" in lines[0]
    assert sorted(p.relative_to(sweep) for p in sweep.rglob("*")) == before  # no report written


@pytest.mark.parametrize("change, key", [
    ({"world_size": 2}, "world_size"),
    ({"precision": "bf16"}, "precision"),
    ({"tokens_per_step": 512}, "tokens_per_step"),
    ({"hyperparameters": {"betas": {"value": [0.9, 0.5], "source": "user"}}}, "betas"),
    ({"learning_rate": 5e-3}, "learning_rate"),
], ids=["world_size", "precision", "tokens_per_step", "beta2", "learning_rate-within-a-group"])
def test_one_run_that_differs_is_refused(sweep: Path, change: dict, key: str) -> None:
    if key == "betas":  # the others record theirs: beta2 0.99
        for run_dir in (sweep / "runs").glob("adamw__*"):
            _edit(run_dir, hyperparameters={"betas": {"value": [0.9, 0.99], "source": "cited"}})
    _edit(sweep / "runs" / "adamw__tiny__s1", **change)
    with pytest.raises(OptBenchError, match=rf"runs differ in {key} \(.*adamw__tiny__s1"):
        analyse(sweep)


def test_zero_stage_from_the_run_identity_is_compared(sweep: Path) -> None:
    for run_dir in (sweep / "runs").iterdir():
        stage = 2 if run_dir.name == "lion__tiny__s0" else 0
        (run_dir / IDENTITY_FILE).write_text(json.dumps({"schema": 1, "identity": {"zero_stage": stage}}))
    with pytest.raises(OptBenchError, match=r"runs differ in zero_stage \(0: .*; 2: lion__tiny__s0\)"):
        analyse(sweep)


def test_a_clean_sweep_and_its_ladder_still_report(sweep: Path) -> None:
    """The tuned learning rate differs between optimizers, and the baseline's ladder runs (``__dx``) run other
    step counts: neither is a reason to refuse; a ladder run that differs in anything else is."""
    runs = sweep / "runs"
    for multiple, steps in (("0.5", 15), ("2", 60)):
        ladder = runs / f"adamw__tiny__s0__dx{multiple}"
        shutil.copytree(runs / "adamw__tiny__s0", ladder)
        _edit(ladder, max_steps=steps)
    an = analyse(sweep)
    assert len(an.ladder) == 2 and len(an.records) == 6
    _edit(runs / "adamw__tiny__s0__dx2", world_size=2)  # a ladder run differs in its budget only
    with pytest.raises(OptBenchError, match=r"runs differ in world_size \(1: .*; 2: adamw__tiny__s0__dx2\)"):
        analyse(sweep)


def test_sizes_at_one_budget_in_tokens_per_parameter_are_comparable(tmp_path: Path) -> None:
    """Across sizes: other max_steps are fine when the budget in tokens per parameter is the same (within one
    step's rounding), and refused when it is not."""
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw",), sizes=("tiny", "mini"), seeds=(0,), steps=30)
    _edit(root / "runs" / "adamw__tiny__s0", max_steps=30, tokens_per_param=0.15)
    _edit(root / "runs" / "adamw__mini__s0", max_steps=232, tokens_per_param=0.1502)
    analyse(root)
    _edit(root / "runs" / "adamw__mini__s0", max_steps=600, tokens_per_param=0.39)
    with pytest.raises(OptBenchError, match="budget across model sizes"):
        analyse(root)


# -------------------------------------------- issue 32 item 3: the pairs across optimizers share the protocol
def _identity(run_dir: Path, **values) -> None:
    (run_dir / IDENTITY_FILE).write_text(json.dumps({"schema": 1, "identity": values}))


def _lion_differs(sweep: Path, **lion_values) -> None:
    """Identities as an edited sweep that kept its old adamw runs leaves them: each optimizer's own learning rate,
    and ``lion_values`` only on the lion runs (adamw's are the old ones)."""
    for run_dir in (sweep / "runs").iterdir():
        lion = run_dir.name.startswith("lion")
        old = {"dropout": 0.0, "warmup_steps": 0.1, "block_size": 32}
        _identity(run_dir, optimizer="lion" if lion else "adamw", learning_rate=1e-4 if lion else 1e-3,
                  **{**old, **(lion_values if lion else {})})


def test_runs_of_other_optimizers_at_other_dropout_or_warmup_are_not_paired(sweep: Path, capsys) -> None:
    """Before: lion at dropout 0.3 was paired with adamw at dropout 0 without a word."""
    _lion_differs(sweep, dropout=0.3)
    assert cli.main(["report", str(sweep)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tiny runs differ in dropout (0.0: adamw__tiny__s0"), lines
    assert "0.3: lion__tiny__s0" in lines[0] and not (sweep / "report").exists()
    _lion_differs(sweep, warmup_steps=2)
    with pytest.raises(OptBenchError, match=r"tiny runs differ in warmup_steps \(0.1: adamw__tiny__s0.*2: lion"):
        analyse(sweep)


def test_what_the_sweep_file_sets_per_optimizer_may_differ(sweep: Path) -> None:
    _lion_differs(sweep, warmup_steps=2)
    manifest = sweep / "sweep_manifest.json"
    data = json.loads(manifest.read_text()) if manifest.is_file() else {"runs": []}
    manifest.write_text(json.dumps({**data, "per_optimizer": {"lion": {"warmup_steps": 2}}}))
    assert len(analyse(sweep).records) == 6  # set on purpose, per optimizer: the learning rate's kind of difference


def test_one_seed_counted_twice_is_refused(sweep: Path) -> None:
    """Before: ``model_size: [tiny, TINY]`` ran seed 0 twice and the report pooled the two runs as two samples."""
    shutil.copytree(sweep / "runs" / "adamw__tiny__s0", sweep / "runs" / "adamw__TINY__s0")
    with pytest.raises(OptBenchError, match="adamw/tiny runs adamw__TINY__s0 and adamw__tiny__s0 both have seed 0"):
        analyse(sweep)


def test_each_ladder_rung_has_its_own_tuned_rate_shared_by_its_seeds(sweep: Path) -> None:
    """Issue 29: every rung is tuned at its own budget, so a rung's rate differs from the compared runs' (which
    refused the report before); its seeds must still share it."""
    runs = sweep / "runs"
    for seed in (0, 1, 2):
        rung = runs / f"adamw__tiny__s{seed}__dx4"
        shutil.copytree(runs / f"adamw__tiny__s{seed}", rung)
        _edit(rung, max_steps=120, learning_rate=5e-4)
    an = analyse(sweep)
    assert len(an.ladder) == 3
    _edit(runs / "adamw__tiny__s2__dx4", learning_rate=2.5e-4)
    with pytest.raises(OptBenchError, match=r"adamw/tiny x4 budget runs differ in learning_rate .*adamw__tiny__s2__dx4"):
        analyse(sweep)


def test_a_rungs_own_rate_is_its_groups_rates_too(sweep: Path) -> None:
    """A real run's identity lists each parameter group with its rate (``param_groups``): a rung tuned to another rate
    differs there too, which refused every sweep whose rungs were tuned to other rates than x1's (issue 31's check
    run: the 0.25x rung at x4 against x2). Its groups' decay must still match, and its seeds share its rates."""
    runs = sweep / "runs"

    def groups(lr: float, wd: float = 0.1) -> list[dict]:
        return [{"name": "decay", "lr": lr, "weight_decay": wd}, {"name": "no_decay", "lr": lr, "weight_decay": 0.0}]

    for seed in (0, 1, 2):
        rung = runs / f"adamw__tiny__s{seed}__dx4"
        shutil.copytree(runs / f"adamw__tiny__s{seed}", rung)
        _edit(rung, max_steps=120, learning_rate=5e-4)
        for run_dir, lr in ((rung, 5e-4), (runs / f"adamw__tiny__s{seed}", 1e-3)):
            (run_dir / IDENTITY_FILE).write_text(json.dumps({"schema": 1, "identity": {"param_groups": groups(lr)}}))
    assert len(analyse(sweep).ladder) == 3
    (runs / "adamw__tiny__s1__dx4" / IDENTITY_FILE).write_text(
        json.dumps({"schema": 1, "identity": {"param_groups": groups(5e-4, wd=0.3)}}))
    with pytest.raises(OptBenchError, match=r"adamw/tiny runs differ in param_groups .*adamw__tiny__s1__dx4"):
        analyse(sweep)
