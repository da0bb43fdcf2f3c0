"""Optimizers that cannot run on DeepSpeed's flat ZeRO partitions are refused at validation (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_optbench.config.checks import zero_stage
from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart_cpu.yaml")


def test_zero_stage_from_a_file_a_dict_and_accelerates_environment(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    class Args:
        deepspeed = None

    assert zero_stage(Args()) == 0
    Args.deepspeed = {"zero_optimization": {"stage": 3}}
    assert zero_stage(Args()) == 3
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    Args.deepspeed = str(path)
    assert zero_stage(Args()) == 1
    Args.deepspeed = None
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert zero_stage(Args()) == 2


@pytest.mark.parametrize("optimizer", ["muon", "soap", "sophia"])
def test_an_optimizer_that_cannot_run_under_zero_is_refused(optimizer: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    with pytest.raises(OptBenchError, match=optimizer):
        parse_args([RECIPE, "--optimizer", optimizer, "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_the_same_optimizers_pass_without_zero(tmp_path: Path) -> None:
    assert parse_args([RECIPE, "--optimizer", "muon", "--output_dir", str(tmp_path / "o")]).optim.optimizer == "muon"
