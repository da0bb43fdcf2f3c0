"""A run's command line before parsing (issue 33 item 5): `--config RECIPE` anywhere on the line, `--help` after a
recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hf_optbench import cli
from hf_optbench.config.argv import attach_negative_values, help_requested, recipe_first
from hf_optbench.errors import OptBenchError
from hf_optbench.run import train as run_mod

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")


def test_config_moves_to_the_front_from_anywhere() -> None:
    assert recipe_first(["--max_steps", "3", "--config", "r.yaml", "--seed", "1"]) == ["r.yaml", "--max_steps", "3",
                                                                                      "--seed", "1"]
    assert recipe_first(["--config=r.yaml", "--seed", "1"]) == ["r.yaml", "--seed", "1"]
    assert recipe_first(["r.yaml", "--seed", "1"]) == ["r.yaml", "--seed", "1"]  # the positional form, untouched
    assert recipe_first(["--config_file", "x"]) == ["--config_file", "x"]  # another key, not --config


@pytest.mark.parametrize("argv", [["a.yaml", "--config", "b.yaml"], ["--config", "a.yaml", "--config", "b.yaml"],
                                  ["--seed", "1", "--config"], ["--config", "--seed", "1"]])
def test_two_recipes_or_none_after_config_are_refused(argv: list[str]) -> None:
    with pytest.raises(OptBenchError, match="recipe"):
        recipe_first(argv)


def test_help_is_found_anywhere() -> None:
    assert help_requested(["r.yaml", "--help"]) == "short"
    assert help_requested(["r.yaml", "--seed", "1", "-h"]) == "short"
    assert help_requested(["--help-all", "r.yaml"]) == "full"
    assert help_requested(["r.yaml", "--seed", "1"]) is None


def test_python_m_run_prints_help_after_a_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    # before: "error: unknown key 'help' in the command line", exit 2
    assert run_mod.main([QUICK, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m hf_optbench.run ") and "--model_size" in out


def test_validate_takes_config_anywhere(capsys: pytest.CaptureFixture[str]) -> None:
    # before: "unknown key 'config' ... Did you mean 'fsdp_config'?", exit 2
    assert cli.main(["validate", "--max_steps", "3", "--config", QUICK]) == 0
    assert f"ok: {QUICK}" in capsys.readouterr().out
    assert cli.main(["validate", "--max_steps", "3", "--config", QUICK, "--full"]) == 0


class _Parsed(Exception):
    pass


def test_run_takes_config_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(cfg: Any, lock: Any = None) -> None:
        raise _Parsed(cfg)

    monkeypatch.setattr(run_mod, "train", stop)
    with pytest.raises(_Parsed) as got:
        cli.main(["run", "--max_steps", "3", "--config", QUICK, "--output_dir", str(tmp_path / "o")])
    cfg = got.value.args[0]
    assert cfg.recipe_path == QUICK and cfg.training.max_steps == 3 and cfg.model.model_size == "tiny"


def test_a_negative_value_argparse_would_take_for_an_option_is_attached_to_its_key() -> None:
    """Issue 41: ``--weight_decay -inf`` failed with "expected one argument" instead of reaching the check that says
    the value must be finite; ``-1e-3`` likewise (argparse reads only ``-1`` and ``-.5`` as numbers)."""
    assert attach_negative_values(["--weight_decay", "-inf", "--learning_rate", "-1e-3", "--seed", "-1"]) == [
        "--weight_decay=-inf", "--learning_rate=-1e-3", "--seed=-1"]
    kept = ["--report_to", "none", "--x=-1", "-h", "--run_name", "-name"]
    assert attach_negative_values(kept) == kept
