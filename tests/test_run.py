"""One tiny run end to end, in-process, and the bad inputs that must stop before any work."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from hf_optbench import run as run_mod

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
FAST = ["--max_steps", "6", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--block_size", "32",
        "--timing_warmup_steps", "1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("quick") / "run"
    rc = run_mod.main([QUICK, "--output_dir", str(out), *FAST])
    assert rc == 0
    return out


def test_run_directory_holds_the_promised_files(finished_run: Path) -> None:
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "trainer_state.json", "README.md"):
        assert (finished_run / name).is_file(), name
    summary = json.loads((finished_run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["optimizer"] == "adamw" and summary["model_size"] == "tiny"
    assert summary["steps"] == 6
    assert summary["tokens_per_step"] == 4 * 1 * 1 * 32
    assert summary["tokens_seen"] == 6 * 128
    assert 0 < summary["num_params"] < 2_000_000
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["final_eval_loss"])
    assert summary["train_runtime_s"] > 0
    assert summary["optimizer_state_bytes"] > 0
    assert summary["env"]["packages"]["transformers"]
    assert summary["env"]["glibc_tunables"] == os.environ.get("GLIBC_TUNABLES")
    assert "commit" in summary["git"] and "dirty" in summary["git"]
    assert summary["hyperparameter_sources"]["learning_rate"] != "user"
    rows = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert train_steps == list(range(1, 7))
    assert any(r["kind"] == "eval" for r in rows)
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert config["max_steps"] == 6 and config["optimizer"] == "adamw"


def test_finished_run_is_not_overwritten(finished_run: Path, capsys) -> None:
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in finished_run.iterdir() if p.is_file()}
    rc = run_mod.main([QUICK, "--output_dir", str(finished_run), *FAST])
    assert rc == 2
    assert "overwrite_output_dir" in capsys.readouterr().err
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in finished_run.iterdir() if p.is_file()}
    assert before == after


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--lerning_rate", "1e-3"], "lerning_rate"),
        (["--learning_rate", "fast"], "learning_rate"),
        (["--optimizer", "adamq"], "adamq"),
        (["--model_size", "gpt5"], "gpt5"),
        (["--learning_rate", "0"], "learning_rate"),
    ],
)
def test_bad_input_exits_2_before_any_work(tmp_path: Path, monkeypatch, capsys, args, needle) -> None:
    def _boom(*a, **k):  # any model/data work would be a bug
        raise AssertionError("prepare() must not run for bad input")

    monkeypatch.setattr(run_mod, "prepare", _boom)
    rc = run_mod.main([QUICK, "--output_dir", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and needle in err
    assert len(err.splitlines()) <= 3  # one clear message, not an argparse usage dump
    assert not (tmp_path / "out").exists()


def test_missing_recipe_exits_2(tmp_path: Path, capsys) -> None:
    assert run_mod.main([str(tmp_path / "missing.yaml")]) == 2
    assert "recipe file not found" in capsys.readouterr().err


def test_tuned_learning_rate_file_drives_the_run_unless_the_user_sets_one(tmp_path: Path) -> None:
    tuned = tmp_path / "tuned_hparams.yaml"
    tuned.write_text(yaml.safe_dump({"adamw": {"tiny": {"learning_rate": 0.0123, "multiplier": 2.0}}}))
    fast = ["--max_steps", "2", "--eval_steps", "2", "--per_device_train_batch_size", "2", "--block_size", "32",
            "--save_strategy", "no", "--tuned_hparams_file", str(tuned)]
    assert run_mod.main([QUICK, "--output_dir", str(tmp_path / "a"), *fast]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["learning_rate"] == 0.0123
    assert "tuned" in summary["hyperparameter_sources"]["learning_rate"]
    assert run_mod.main([QUICK, "--output_dir", str(tmp_path / "b"), *fast, "--learning_rate", "0.002"]) == 0
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["learning_rate"] == 0.002 and summary["hyperparameter_sources"]["learning_rate"] == "user"
