"""The tuned file's entries beyond the learning rate: a parameter group's tuned ratio (a constructor argument), and
the ladder's rungs, each with its own tuned learning rate (issue 29), as a run reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.tuned import lookup_tuned
from hf_optbench.run.plan import resolve_hyperparameters

REPO = Path(__file__).resolve().parents[2]
ENTRY = {"learning_rate": 0.008, "nonmatrix_lr_ratio": 0.5,
         "ladder": [{"budget_multiple": 4.0, "max_steps": 120, "learning_rate": 0.004, "nonmatrix_lr_ratio": 0.5},
                    {"budget_multiple": 0.25, "max_steps": 8, "learning_rate": 0.016}]}


def _file(tmp_path: Path, entry: dict) -> Path:
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump({"adamw": {"tiny": entry}}))
    return path


def test_a_rung_run_reads_its_own_rate(tmp_path: Path) -> None:
    path = str(_file(tmp_path, ENTRY))
    assert lookup_tuned(path, "adamw", "tiny")["learning_rate"] == 0.008  # no max_steps: the x1 entry
    assert lookup_tuned(path, "adamw", "tiny", max_steps=30)["learning_rate"] == 0.008  # the x1 run's steps
    assert lookup_tuned(path, "adamw", "tiny", max_steps=120)["learning_rate"] == 0.004
    assert lookup_tuned(path, "adamw", "tiny", max_steps=8)["learning_rate"] == 0.016


def test_a_ratio_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match="nonmatrix_lr_ratio is 0"):
        lookup_tuned(str(_file(tmp_path, {"learning_rate": 0.008, "nonmatrix_lr_ratio": 0})), "adamw", "tiny")
    bad_rung = {"learning_rate": 0.008, "ladder": [{"max_steps": 120, "learning_rate": -1.0}]}
    with pytest.raises(OptBenchError, match="learning_rate is -1"):
        lookup_tuned(str(_file(tmp_path, bad_rung)), "adamw", "tiny", max_steps=120)


def _cfg(tmp_path: Path, path: Path, *extra: str):  # noqa: ANN202 - a RunConfig
    return parse_args([str(REPO / "recipes/quickstart_cpu.yaml"), "--output_dir", str(tmp_path / "run"),
                       "--tuned_hparams_file", str(path), "--max_steps", "120", *extra])


def test_the_tuned_ratio_reaches_the_constructor_with_its_source(tmp_path: Path) -> None:
    path = _file(tmp_path, ENTRY)
    cfg = _cfg(tmp_path, path)
    chosen = resolve_hyperparameters(cfg)
    assert chosen["learning_rate"] == {"value": 0.004, "source": f"tuned: {path.name}"}  # the 4x rung's steps
    assert chosen["nonmatrix_lr_ratio"] == {"value": 0.5, "source": f"tuned: {path.name}"}
    assert cfg.optim.kwargs() == {}  # nothing written back into the arguments: the plan holds it (run.plan)
    # the user's own value wins, and without a tuned value the citation speaks
    cfg = _cfg(tmp_path, path, "--optimizer_kwargs", '{"nonmatrix_lr_ratio": 2.0}')
    assert resolve_hyperparameters(cfg)["nonmatrix_lr_ratio"] == {"value": 2.0, "source": "user"}
    cfg = _cfg(tmp_path, _file(tmp_path, {"learning_rate": 0.008}))
    assert resolve_hyperparameters(cfg)["nonmatrix_lr_ratio"]["source"].startswith("Brown et al. 2020")
