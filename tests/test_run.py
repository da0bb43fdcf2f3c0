"""One tiny run end to end, in-process, and the bad inputs that must stop before any work."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench.run import train as run_mod

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
FAST = ["--max_steps", "6", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--block_size", "32",
        "--timing_warmup_steps", "1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run; what main() printed is kept beside it in stdout.txt."""
    out = tmp_path_factory.mktemp("quick") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = run_mod.main([QUICK, "--output_dir", str(out), *FAST])
    (out.parent / "stdout.txt").write_text(printed.getvalue())
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
    assert summary["train_segments"] == [{"start_step": 0, "end_step": 6, "runtime_s": summary["train_runtime_s"],
                                          "startup_s": summary["startup_s"]}]
    assert summary["startup_s"] >= 0  # one-time start-up inside train(), timed apart from training
    assert summary["final_tuning_loss"] is None  # no tuning split asked for
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


def test_run_ends_by_saying_where_it_wrote_and_what_to_run_next(finished_run: Path) -> None:
    lines = (finished_run.parent / "stdout.txt").read_text().strip().splitlines()
    result = json.loads(lines[-3])  # the machine-readable line stays, before the two for a person
    assert result["status"] == "completed" and result["steps"] == 6
    assert lines[-2].startswith(f"wrote {finished_run} (") and "summary.json" in lines[-2] \
        and "metrics.jsonl" in lines[-2]
    assert lines[-1].startswith("next: ") and f"cat {finished_run / 'summary.json'}" in lines[-1]
    assert f"hf-optbench run {finished_run / 'config.yaml'} --output_dir {finished_run}_rerun" in lines[-1]


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


def _with_tuning(monkeypatch, pick) -> None:
    """A stand-in for the data side's tuning split: ``pick(bundle)`` becomes ``bundle.tuning`` (before the run
    checks the splits against the batch)."""
    from hf_optbench.data import pipeline

    real = pipeline.prepare_data

    def prepare_data(data_args, **kwargs):
        bundle = real(data_args, **kwargs)
        return dataclasses.replace(bundle, tuning=pick(bundle))

    monkeypatch.setattr(pipeline, "prepare_data", prepare_data)


def test_final_tuning_loss_is_recorded_and_kept_out_of_the_eval_metrics(tmp_path: Path, monkeypatch) -> None:
    """With the validation blocks as the tuning split, the tuning loss of the final model must equal the final
    eval loss (same weights, same blocks, same batches): that proves what was evaluated. It must appear nowhere
    the eval metrics are reported."""
    _with_tuning(monkeypatch, lambda bundle: bundle.eval)
    out = tmp_path / "run"
    assert run_mod.main([QUICK, "--output_dir", str(out), *FAST, "--save_strategy", "no"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert math.isfinite(summary["final_tuning_loss"])
    assert summary["final_tuning_loss"] == pytest.approx(summary["final_eval_loss"], rel=1e-6)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [3, 6]
    assert not any("tuning" in key for r in rows for key in r)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert not any("tuning" in key for row in history for key in row)


def test_eval_strategy_no_evaluates_nothing_and_every_step_has_its_row(tmp_path: Path) -> None:
    """No final evaluation either (gpu_check's timed headline run relies on it); with a loss log every 4 steps the
    rows still cover every step, and the summary's final train loss is the last step's."""
    out = tmp_path / "run"
    assert run_mod.main([QUICK, "--output_dir", str(out), *FAST, "--save_strategy", "no", "--eval_strategy", "no",
                         "--logging_steps", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["final_eval_loss"] is None and not [r for r in rows if r["kind"] == "eval"]
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 7))
    assert summary["final_train_loss"] == train[-1]["loss"]


@pytest.mark.slow  # a run as a process: ~15 s
def test_a_cpu_run_without_use_cpu_pins_nothing_and_warns_nothing(tmp_path: Path) -> None:
    """A recipe without ``use_cpu: true`` on a machine with no accelerator, run as a user runs it: torch's warning
    "'pin_memory' argument is set as true but no accelerator is found" would print for every DataLoader; the Trainer
    is told there is nothing to pin."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device pins for real")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(line for line in Path(QUICK).read_text().splitlines(keepends=True)
                              if not line.startswith("use_cpu")))
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}  # a user's default: warnings shown
    done = subprocess.run([sys.executable, "-m", "hf_optbench.run", str(recipe), "--output_dir", str(tmp_path / "run"),
                           *FAST], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pin_memory" not in done.stderr


def test_tuning_split_smaller_than_one_eval_batch_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    _with_tuning(monkeypatch, lambda bundle: bundle.eval.select(range(1)))
    rc = run_mod.main([QUICK, "--output_dir", str(tmp_path / "run"), *FAST])
    err = capsys.readouterr().err
    assert rc == 2 and "tuning split holds 1 block" in err and "tuning_blocks" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("accumulation, needle", [
    ("1000", "fewer than one optimizer step"),  # 1000 x 4 blocks of a split of fewer
    ("5", "39 micro-batches per epoch, not a multiple of gradient_accumulation_steps 5"),  # a partial last step
])
def test_a_batch_the_split_cannot_hold_whole_is_refused_before_the_model(accumulation: str, needle: str,
                                                                         tmp_path: Path, monkeypatch,
                                                                         capsys) -> None:
    """Issue 30 item 8: --gradient_accumulation_steps 1000 on a split of a few micro-batches completed, recording
    3,072,000 tokens seen of a 4,992-token split (transformers steps on the micro-batches an epoch holds). Refused
    from the data's size, before the model is built."""
    from hf_optbench import models

    def _boom(*a, **k):
        raise AssertionError("the model must not be built")

    monkeypatch.setattr(models, "build_model", _boom)
    rc = run_mod.main([QUICK, "--output_dir", str(tmp_path / "run"), *FAST, "--max_steps", "200",
                       "--gradient_accumulation_steps", accumulation])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def _has_bf16_device() -> bool:
    from transformers.utils import is_torch_bf16_gpu_available

    return bool(is_torch_bf16_gpu_available())


LARGE = str(ROOT / "recipes" / "lion_gpt2_large.yaml")


@pytest.mark.skipif(_has_bf16_device(), reason="this machine runs bf16: the recipe is valid here")
def test_bf16_recipe_without_a_bf16_device_names_the_hardware_and_the_override(tmp_path, monkeypatch,
                                                                                capsys) -> None:
    def _boom(*a, **k):  # transformers' own bf16 error is raised while parsing; ours must come first
        raise AssertionError("parse_args must not run")

    monkeypatch.setattr(run_mod, "parse_args", _boom)
    assert run_mod.main([LARGE, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "lion_gpt2_large.yaml" in err and "A100" in err
    assert "--bf16 false --torch_compile false" in err and "recipes/quickstart_cpu.yaml" in err
    assert not (tmp_path / "out").exists()


def test_the_suggested_override_passes_the_hardware_check() -> None:
    from hf_optbench.run.preflight import check_hardware, light_settings

    values, where, _ = light_settings([LARGE, "--bf16", "false", "--torch_compile=false"])
    assert values["bf16"] == "false" and where["bf16"] == "the command line"
    check_hardware(values, where)  # no error: bf16 is off whatever the machine


@pytest.mark.skipif(_has_bf16_device(), reason="this machine runs bf16")
def test_precision_flags_are_read_with_the_parsers_precedence() -> None:
    from hf_optbench.errors import OptBenchError
    from hf_optbench.run.preflight import check_hardware, light_settings

    # a bare flag is true, as HfArgumentParser reads it; the command line beats the recipe's use_cpu: true
    values, where, _ = light_settings([QUICK, "--bf16", "--use_cpu", "false"])
    with pytest.raises(OptBenchError, match="the command line sets bf16 true"):
        check_hardware(values, where)
    values, where, _ = light_settings([QUICK, "--bf16", "true"])
    check_hardware(values, where)  # bf16 on the CPU: transformers allows it with the recipe's use_cpu


@pytest.mark.skipif(_has_bf16_device(), reason="this machine runs bf16")
def test_fp16_on_a_cpu_is_refused_with_the_override() -> None:
    import torch

    from hf_optbench.errors import OptBenchError
    from hf_optbench.run.preflight import check_hardware, light_settings

    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    values, where, _ = light_settings([QUICK, "--fp16", "true"])
    with pytest.raises(OptBenchError, match="--fp16 false"):
        check_hardware(values, where)


@pytest.mark.skipif(_has_bf16_device(), reason="this machine runs bf16: the recipe is valid here")
def test_the_gpu_recipe_process_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """What `accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml` starts, as its own process."""
    proc = subprocess.run([sys.executable, "-m", "hf_optbench.run", "recipes/lion_gpt2_large.yaml", "--output_dir",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--bf16 false" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(_has_bf16_device(), reason="this machine runs bf16: the recipe is valid here")
def test_accelerate_launch_quiet_prints_only_our_line(tmp_path: Path) -> None:
    """accelerate's single-process launcher raises CalledProcessError (a traceback) for any non-zero exit of the
    child unless given --quiet (then it exits 1). It warns about defaults it filled in unless they are given: a
    config file (the launch defaults) and OMP_NUM_THREADS (else it sets --num_cpu_threads_per_process)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    proc = subprocess.run([str(accelerate), "launch", "--quiet", "--config_file", "accelerate_configs/cpu.yaml",
                           "-m", "hf_optbench.run", "recipes/lion_gpt2_large.yaml", "--output_dir",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 1
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--bf16 false" in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGINT", "SIGHUP"])
def test_ctrl_c_or_a_closed_terminal_ends_a_run_in_one_line_marked_interrupted(signum: str, tmp_path: Path) -> None:
    """Ctrl-C was a KeyboardInterrupt traceback with summary.json 'failed', error null; SIGHUP an exit 129 with no
    word. Both now: one line, summary.json 'interrupted' (error null); the resume it names finishes the run."""
    import signal

    from fixtures.warm_run import run_python

    out = tmp_path / "run"
    env = {**os.environ, "HF_OPTBENCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "hf_optbench.run", QUICK, "--output_dir", str(out), "--max_steps", "40",
            "--save_steps", "2", "--eval_steps", "20", "--write_model_card", "false"]
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. A pytest-xdist worker ignores SIGINT (an
    # ignored signal stays ignored across exec: a run started from it would never see the signal and finish with
    # exit 0); the warm worker's child starts with SIGINT at its default, as from a shell.
    sent: dict[str, int] = {}

    def signal_after_the_first_checkpoint() -> None:
        if "pid" in sent and "signal" not in sent and list(out.glob("checkpoint-*/trainer_state.json")):
            sent["signal"] = getattr(signal, signum)
            os.kill(sent["pid"], sent["signal"])

    proc = run_python(argv, cwd=tmp_path, env=env, timeout=240, on_start=lambda pid: sent.update(pid=pid),
                      on_poll=signal_after_the_first_checkpoint)
    err = proc.stderr
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("[INFO]", "[hf_optbench]"))]
    assert "signal" in sent and proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("interrupted at step "), err[-3000:]
    assert "--resume_from_checkpoint true" in lines[0], lines[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] is None
    if signum != "SIGINT":  # what a resume reads is the same after either signal: it is run once, after Ctrl-C
        return
    resumed = run_python(argv[:-4] + ["--resume_from_checkpoint", "true"], cwd=tmp_path, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
