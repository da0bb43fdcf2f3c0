"""Tuning: the best learning-rate multiplier per optimizer and size, the file run.py reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.tuning import cli_main, select_best, write_tuned

from fixtures.sweep_fixture import build_fixture_sweep


def _rec(opt: str, mult: float, seed: int, loss: float | None, status: str = "completed",
         size: str = "tiny") -> dict:
    return {"optimizer": opt, "model_size": size, "lr_multiplier": mult, "seed": seed, "status": status,
            "final_eval_loss": loss, "learning_rate": 1e-3 * mult}


def test_best_mean_eval_loss_wins_and_diverged_loses() -> None:
    recs = [_rec("adamw", 0.5, 0, 5.0), _rec("adamw", 0.5, 1, 5.2),  # mean 5.1
            _rec("adamw", 1.0, 0, 5.0), _rec("adamw", 1.0, 1, 5.1),  # mean 5.05 <- best
            _rec("adamw", 2.0, 0, 4.0), _rec("adamw", 2.0, 1, None, "diverged")]  # one seed diverged: loses
    best, warnings = select_best(recs)
    assert best == {"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "eval_loss": 5.05}}}
    assert warnings == []


def test_ties_prefer_the_default_and_edges_warn() -> None:
    best, _ = select_best([_rec("lion", 0.5, 0, 5.0), _rec("lion", 1.0, 0, 5.0), _rec("lion", 2.0, 0, 5.0)])
    assert best["lion"]["tiny"]["multiplier"] == 1.0
    best, warnings = select_best([_rec("lion", 0.5, 0, 4.0), _rec("lion", 1.0, 0, 5.0)])
    assert best["lion"]["tiny"]["multiplier"] == 0.5 and "edge of the grid" in warnings[0]


def test_all_diverged_writes_nothing_and_no_grid_is_an_error() -> None:
    best, warnings = select_best([_rec("sgd", 1.0, 0, None, "diverged"), _rec("sgd", 2.0, 0, None, "failed")])
    assert best == {} and "nothing written" in warnings[0]
    with pytest.raises(OptBenchError, match="lr_multipliers"):
        select_best([{"optimizer": "adamw", "model_size": "tiny", "lr_multiplier": None}])


def test_write_merges_and_keeps_format(tmp_path: Path) -> None:
    path = tmp_path / "tuned.yaml"
    write_tuned({"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "eval_loss": 5.0}}}, path, "first")
    write_tuned({"lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "eval_loss": 4.9}}}, path, "second",
                ["lion/tiny: edge"])
    data = yaml.safe_load(path.read_text())
    assert data == {"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "eval_loss": 5.0, "source": "first"}},
                    "lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "eval_loss": 4.9, "source": "second"}}}
    assert "# warning: lion/tiny: edge" in path.read_text()


def test_tune_cli_on_a_fixture_sweep(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "tune", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1),
                               steps=20, lr_multipliers=(0.5, 1.0, 2.0),
                               eval_loss={"lion__tiny__s0__lrx2": 3.0, "lion__tiny__s1__lrx2": 3.2,
                                          "adamw__tiny__s0__lrx0.5": 3.5, "adamw__tiny__s1__lrx0.5": 3.5})
    out = tmp_path / "tuned_hparams.yaml"
    assert cli_main([str(root), "--output", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["lion"]["tiny"]["multiplier"] == 2.0
    assert data["lion"]["tiny"]["learning_rate"] == pytest.approx(2e-4)  # the fixture's lion lr x 2
    assert data["lion"]["tiny"]["eval_loss"] == pytest.approx(3.1)
    assert data["adamw"]["tiny"]["multiplier"] == 0.5
    assert data["adamw"]["tiny"]["source"].startswith(f"tuned by {root} on ")


def test_lookup_reads_what_tune_writes(tmp_path: Path) -> None:
    """The optimizer registry's reader (optimizers.lookup_tuned) understands this file."""
    lookup_tuned = pytest.importorskip("hf_optbench.optimizers").lookup_tuned
    path = write_tuned({"lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "eval_loss": 4.9}}},
                       tmp_path / "t.yaml", "test")
    assert lookup_tuned(str(path), "lion", "tiny")["learning_rate"] == pytest.approx(1e-4)
