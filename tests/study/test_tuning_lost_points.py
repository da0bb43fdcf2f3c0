"""A tuning point lost to a run that failed (after the sweep's one retry) is never lost silently: the choice made
without it lists it under ``missing_points`` in tuned_hparams.yaml, warns, and the report repeats it.

Made-up results on disk, as in test_tuning_bracket.py: a sweep with a ``tune:`` section is loaded and each tuning
run it asks for gets a summary.json (a known loss bowl with its minimum at x1), except the best point, which fails.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import yaml

from hf_optbench.report.build import build_report
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, load_sweep, resolve_grid
from hf_optbench.study.tuning_phase import tune_phase, tuning_additions

from fixtures.sweep_fixture import build_fixture_sweep

REPO = Path(__file__).resolve().parents[2]
LOST = "adamw__tiny__s0__lrx1"


def _spec(tmp_path: Path) -> SweepSpec:
    sweep = {"name": "lost", "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 4, "tuning_blocks": 4},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [1]},
             "tune": {"lr_multipliers": [0.5, 1, 2], "seed": [0], "confirm_seeds": []},
             "launcher": {"type": "command", "command": ["true"], "validate": False}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    spec = load_sweep(tmp_path / "sweep.yaml")
    assert spec.tuning is not None
    resolve_grid(spec.tuning)
    return spec


def _finish(spec: SweepSpec, run: RunSpec) -> None:
    assert spec.tuning is not None
    d = spec.tuning.run_dir(run)
    d.mkdir(parents=True)
    lost = run.run_id == LOST
    loss = None if lost else 4.0 + 0.1 * math.log2(float(run.lr_multiplier or 1)) ** 2
    (d / "summary.json").write_text(json.dumps({
        "status": "failed" if lost else "completed", "optimizer": run.optimizer, "model_size": run.model_size,
        "seed": run.seed, "learning_rate": run.learning_rate, "final_tuning_loss": loss,
        "error": "RuntimeError: worker killed" if lost else None}))


def test_a_choice_made_without_a_failed_point_says_so_in_the_tuned_file_and_the_report(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.tuning is not None
    new = list(spec.tuning.runs)
    while new:  # what the sweep's tuning loop does: finish every pending run, ask for more
        for run in new:
            if not spec.tuning.run_dir(run).exists():
                _finish(spec, run)
        new = tuning_additions(spec, print)
        spec.tuning.runs.extend(new)
    (path,), warnings = tune_phase(spec)
    entry = yaml.safe_load(path.read_text())["adamw"]["tiny"]
    assert entry["multiplier"] != 1.0  # the lost best point moved the choice: which is why it must be said
    assert entry["missing_points"] == [{"run_id": LOST, "status": "failed"}]
    assert any(LOST in w and "missing_points" in w for w in warnings), warnings
    assert "# warning: adamw/tiny: 1 tuning run(s) failed" in path.read_text()
    # the report of the comparison reads the same file
    root = build_fixture_sweep(tmp_path / "cmp", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1))
    shutil.copy(path, root / "tuned_hparams.yaml")
    md = build_report(root)["report.md"].read_text(encoding="utf-8")
    assert f"tuning points lost to failed runs: adamw/tiny: {LOST} (failed)" in md
