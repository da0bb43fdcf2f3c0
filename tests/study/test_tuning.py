"""Tuning: the best learning-rate multiplier per optimizer and size, the file run.py reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hf_optbench.cli.tune import main as cli_main
from hf_optbench.errors import OptBenchError
from hf_optbench.study.tuning_phase import select_best, write_tuned

from fixtures.sweep_fixture import build_fixture_sweep


def _rec(opt: str, mult: float, seed: int, loss: float | None, status: str = "completed",
         size: str = "tiny", eval_loss: float = 1.0) -> dict:
    """A run record as analysis.load_runs makes it: summary.json's figures, the whole summary under _summary."""
    return {"optimizer": opt, "model_size": size, "lr_multiplier": mult, "seed": seed, "status": status,
            "final_eval_loss": eval_loss, "learning_rate": 1e-3 * mult, "run_id": f"{opt}__{size}__s{seed}__lrx{mult:g}",
            "_summary": {"final_tuning_loss": loss}}


def test_best_mean_tuning_loss_wins_and_diverged_loses() -> None:
    recs = [_rec("adamw", 0.5, 0, 5.0), _rec("adamw", 0.5, 1, 5.2),  # mean 5.1
            _rec("adamw", 1.0, 0, 5.0), _rec("adamw", 1.0, 1, 5.1),  # mean 5.05 <- best
            _rec("adamw", 2.0, 0, 4.0), _rec("adamw", 2.0, 1, None, "diverged")]  # one seed diverged: loses
    best, warnings = select_best(recs)
    entry = best[None]["adamw"]["tiny"]
    assert (entry["learning_rate"], entry["multiplier"], entry["tuning_loss"]) == (1e-3, 1.0, 5.05)
    assert entry["metric"] == "final_tuning_loss"
    assert [(c["multiplier"], c["tuning_loss"], c["seeds"]) for c in entry["curve"]] == [
        (0.5, 5.1, 2), (1.0, 5.05, 2), (2.0, None, 2)]
    assert warnings == []


def test_selection_ignores_the_reported_eval_loss() -> None:
    """x2 has the best final_eval_loss, x1 the best final_tuning_loss: the tuning split decides."""
    recs = [_rec("lion", 1.0, 0, 4.0, eval_loss=6.0), _rec("lion", 2.0, 0, 5.0, eval_loss=1.0),
            _rec("lion", 0.5, 0, 4.5, eval_loss=2.0)]
    assert select_best(recs)[0][None]["lion"]["tiny"]["multiplier"] == 1.0


def test_a_tuning_run_without_a_tuning_split_is_an_error() -> None:
    recs = [_rec("adamw", 1.0, 0, 5.0), _rec("adamw", 2.0, 0, None)]  # completed, but no final_tuning_loss
    with pytest.raises(OptBenchError, match="adamw__tiny__s0__lrx2.*final_tuning_loss.*tuning_blocks"):
        select_best(recs)


def test_ties_prefer_the_default_and_edges_warn() -> None:
    best, _ = select_best([_rec("lion", 0.5, 0, 5.0), _rec("lion", 1.0, 0, 5.0), _rec("lion", 2.0, 0, 5.0)])
    assert best[None]["lion"]["tiny"]["multiplier"] == 1.0
    best, warnings = select_best([_rec("lion", 0.5, 0, 4.0), _rec("lion", 1.0, 0, 5.0)])
    assert best[None]["lion"]["tiny"]["multiplier"] == 0.5 and "lower edge of [x0.5, x1]" in warnings[0]


def test_all_diverged_writes_nothing_and_no_grid_is_an_error() -> None:
    best, warnings = select_best([_rec("sgd", 1.0, 0, None, "diverged"), _rec("sgd", 2.0, 0, None, "failed")])
    assert best == {None: {}} and "nothing written" in warnings[0]
    with pytest.raises(OptBenchError, match="lr_multipliers"):
        select_best([{"optimizer": "adamw", "model_size": "tiny", "lr_multiplier": None}])


def _add_tuning_loss(root: Path, losses: dict[str, float]) -> None:
    """The fixture's runs predate the tuning split: give each completed one a final_tuning_loss (its eval loss,
    or the one named in ``losses``)."""
    for summary in (root / "runs").glob("*/summary.json"):
        data = json.loads(summary.read_text())
        data["final_tuning_loss"] = losses.get(summary.parent.name, data.get("final_eval_loss"))
        summary.write_text(json.dumps(data))


def test_write_merges_and_keeps_format(tmp_path: Path) -> None:
    path = tmp_path / "tuned.yaml"
    write_tuned({"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "tuning_loss": 5.0}}}, path, "first")
    write_tuned({"lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "tuning_loss": 4.9}}}, path, "second",
                ["lion/tiny: edge"], provenance={"grid": [0.5, 1.0, 2.0]})
    data = yaml.safe_load(path.read_text())
    assert data == {"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "tuning_loss": 5.0, "source": "first"}},
                    "lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "tuning_loss": 4.9, "source": "second",
                                      "grid": [0.5, 1.0, 2.0]}}}
    assert "# warning: lion/tiny: edge" in path.read_text()


def test_tune_cli_on_a_fixture_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_fixture_sweep(tmp_path / "tune", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1),
                               steps=20, lr_multipliers=(0.5, 1.0, 2.0))
    out = tmp_path / "tuned_hparams.yaml"
    with pytest.raises(OptBenchError, match="final_tuning_loss.*tuning_blocks"):  # no tuning split in these runs
        cli_main([str(root), "--output", str(out)])
    assert not out.exists()
    _add_tuning_loss(root, {"lion__tiny__s0__lrx2": 3.0, "lion__tiny__s1__lrx2": 3.2,
                            "adamw__tiny__s0__lrx0.5": 3.5, "adamw__tiny__s1__lrx0.5": 3.5})
    capsys.readouterr()
    assert cli_main([str(root), "--output", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"  # one line: the file is on disk, not on the screen
    data = yaml.safe_load(out.read_text())
    assert data["lion"]["tiny"]["multiplier"] == 2.0
    assert data["lion"]["tiny"]["learning_rate"] == pytest.approx(2e-4)  # the fixture's lion lr x 2
    assert data["lion"]["tiny"]["tuning_loss"] == pytest.approx(3.1)
    assert data["adamw"]["tiny"]["multiplier"] == 0.5
    assert data["adamw"]["tiny"]["source"].startswith(f"tuned by {root.name} on ")  # relative: no local path (issue 39)
    # provenance: where, which grid and seeds, selected by what
    assert data["adamw"]["tiny"]["tuning_dir"] == root.name  # relative to the tuned file
    assert data["adamw"]["tiny"]["grid"] == [0.5, 1.0, 2.0] and data["adamw"]["tiny"]["seeds"] == [0, 1]
    assert data["adamw"]["tiny"]["metric"] == "final_tuning_loss"


def test_lookup_reads_what_tune_writes(tmp_path: Path) -> None:
    """The tuned-file reader (hf_optbench.optim.tuned.lookup_tuned) understands this file."""
    lookup_tuned = pytest.importorskip("hf_optbench.optim.tuned").lookup_tuned
    path = write_tuned({"lion": {"tiny": {"learning_rate": 1e-4, "multiplier": 0.5, "tuning_loss": 4.9}}},
                       tmp_path / "t.yaml", "test")
    assert lookup_tuned(str(path), "lion", "tiny")["learning_rate"] == pytest.approx(1e-4)


def test_weight_decay_runs_stay_out_of_the_learning_rate_selection() -> None:
    """A weight-decay grid run (``__wdx`` in its id) has the tuned learning rate's multiplier but answers another
    question: it is neither a point of the learning-rate curve nor a reason to pick that rate."""
    recs = [_rec("lion", 0.5, 0, 5.0), _rec("lion", 1.0, 0, 4.9), _rec("lion", 2.0, 0, 5.1)]
    wd_run = {**_rec("lion", 0.5, 0, 1.0), "run_id": "lion__tiny__s0__lrx0.5__wdx3"}
    best, warnings = select_best(recs + [wd_run])
    assert best[None]["lion"]["tiny"]["multiplier"] == 1.0 and best[None]["lion"]["tiny"]["lr_bracketed"] is True
    assert [c["tuning_loss"] for c in best[None]["lion"]["tiny"]["curve"]] == [5.0, 4.9, 5.1]
    # its weight-decay grid belongs at the tuned rate (x1), where none ran: said, never read from x0.5's run
    assert "weight_decay" not in best[None]["lion"]["tiny"] and any("not finished" in w for w in warnings)
    edge, _ = select_best([_rec("lion", 0.5, 0, 4.0), _rec("lion", 1.0, 0, 5.0), _rec("lion", 2.0, 0, 5.0)])
    assert edge[None]["lion"]["tiny"]["bracketed"] is False
