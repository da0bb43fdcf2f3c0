"""Sweeps: matrix expansion, validation before launch, failure/OOM records, resume after a real SIGKILL without
duplicates, checkpoint resume, the submitit (SLURM) executor on submitit's local stand-in, and one real sweep.

Most tests launch a stand-in for ``hf_optbench.run`` (``launcher.type: command``): a small script that takes the same
arguments and writes metrics.jsonl + summary.json as run.py does, so the sweep machinery (processes, state file,
resume, kill) is exercised for real in seconds. The slow test runs the real thing.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from hf_optbench.cli.sweep import main as cli_main
from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import append_state, read_state, run_id_for
from hf_optbench.study.processes import RUN_DIR_ENV
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_spec import load_sweep
from hf_optbench.study.sweep_state import classify_outcome, sweep_lock

REPO = Path(__file__).resolve().parents[2]
FAKE_RUN = r'''
import argparse, json, os, pathlib, sys, time
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--run_name", "--resume_from_checkpoint"):
    p.add_argument(k)
p.add_argument("--seed", type=int)
p.add_argument("--learning_rate", type=float)
p.add_argument("--max_steps", type=int, default=4)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
with open(out / "invocations.txt", "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
print("fake run", a.optimizer, a.model_size, a.seed, flush=True)
if a.optimizer == "boom":
    print("Traceback (most recent call last):\nRuntimeError: boom at step 0", file=sys.stderr)
    sys.exit(1)
if a.optimizer == "oom":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
    sys.exit(1)
sleep = float(os.environ.get("FAKE_SLEEP", "0"))
with open(out / "metrics.jsonl", "a") as fh:
    for step in range(1, a.max_steps + 1):
        fh.write(json.dumps({"kind": "train", "step": step, "loss": 5.0 - 0.1 * step, "tokens": 64 * step,
                             "elapsed_s": 0.1 * step, "lr": 1e-3, "grad_norm": 1.0}) + "\n")
        fh.flush()
        if step == 2 and os.environ.get("FAKE_CHECKPOINT"):
            (out / "checkpoint-2").mkdir(exist_ok=True)
        time.sleep(sleep / a.max_steps)
summary = {"status": "diverged" if a.optimizer == "nan" else "completed", "optimizer": a.optimizer,
           "model_size": a.model_size, "seed": a.seed, "num_params": 1000, "steps": a.max_steps,
           "learning_rate": a.learning_rate, "final_eval_loss": 4.0, "error": None}
(out / "summary.json").write_text(json.dumps(summary))
'''


def _sweep_file(tmp_path: Path, *, optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1), env=None,
                extra: dict | None = None, launcher: dict | None = None) -> Path:
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    base = tmp_path / "base.yaml"
    base.write_text("max_steps: 4\n")
    sweep = {
        "base": str(base),
        "output_dir": str(tmp_path / "out"),
        "overrides": {"max_steps": 4},
        "matrix": {"optimizer": list(optimizers), "model_size": list(sizes), "seed": list(seeds)},
        "launcher": {"type": "command", "command": ["{python}", str(fake)], "validate": False,
                     "env": env or {}, **(launcher or {})},
        **(extra or {}),
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _argmap(args: list[str]) -> dict[str, str]:
    """{key: value} of ``--key value`` / ``--key=value`` tokens (config's YAML-to-CLI form may use either)."""
    out, tokens = {}, list(args[1:])
    while tokens:
        tok = tokens.pop(0)
        if "=" in tok:
            key, value = tok[2:].split("=", 1)
        else:
            key, value = tok[2:], tokens.pop(0)
        out[key] = value
    return out


def _csv(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(out / "summary.csv", encoding="utf-8")))


def test_matrix_expansion_and_arguments(tmp_path: Path) -> None:
    path = _sweep_file(tmp_path, optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0, 1),
                       extra={"per_optimizer": {"lion": {"weight_decay": 1.0}}})
    spec = load_sweep(path)
    ids = [r.run_id for r in spec.runs]
    assert len(ids) == 8 == len(set(ids))
    # seeds outermost: a half-finished sweep already holds a full seed of every optimizer x size
    assert ids[:4] == ["adamw__tiny__s0", "lion__tiny__s0", "adamw__mini__s0", "lion__mini__s0"]
    lion = spec.runs[1]
    assert lion.args[0] == str(tmp_path / "base.yaml")
    assert _argmap(lion.args)["weight_decay"] == "1.0" and _argmap(lion.args)["max_steps"] == "4"
    assert _argmap(lion.args)["optimizer"] == "lion" and _argmap(lion.args)["run_name"] == "lion__tiny__s0"
    assert "weight_decay" not in _argmap(spec.runs[0].args)
    assert run_id_for("lion", "mini", 1, 0.5) == "lion__mini__s1__lrx0.5"


@pytest.mark.parametrize("change, match", [
    ({"matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seeds": [0]}}, "unknown key 'seeds'.*seed"),
    ({"launcher": {"type": "mpirun"}}, "launcher.type 'mpirun'"),
    ({"launcher": {"type": "accelerate"}}, "accelerate_config"),
    ({"overrides": {"optimizer": "lion"}}, "'optimizer' cannot be an override"),
    ({"per_optimizer": {"lino": {"weight_decay": 1.0}}}, "unknown key 'lino'"),
    ({"matrix": {"optimizer": ["adamw", "adamw"], "model_size": ["tiny"]}}, "twice"),
    ({"matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "lr_multipliers": [0]}}, "positive"),
    ({"base": "missing.yaml"}, "base 'missing.yaml'.*not found"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_bad_sweep_files_fail_before_launch(tmp_path: Path, change: dict, match: str) -> None:
    path = _sweep_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data.update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(OptBenchError, match=match):
        run_sweep(path, stream=io.StringIO())
    assert not (tmp_path / "out").exists()


def test_validation_parses_every_run_before_launching(tmp_path: Path) -> None:
    """An unknown optimizer or size in the matrix is caught by hf_optbench.config.parse.parse_args in-process."""
    for matrix, match in (({"optimizer": ["adamw", "lino"], "model_size": ["tiny"]}, "lino__tiny__s0.*lion"),
                          ({"optimizer": ["adamw"], "model_size": ["tiny", "gpt5"]}, "gpt5")):
        path = tmp_path / "v.yaml"
        path.write_text(yaml.safe_dump({"base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "v"),
                                        "matrix": matrix, "launcher": {"type": "python"}}))
        with pytest.raises(OptBenchError, match=match):
            run_sweep(path, stream=io.StringIO())
        assert not (tmp_path / "v").exists()


def test_failures_and_oom_are_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    path = _sweep_file(tmp_path, optimizers=("boom", "oom", "adamw", "nan"), seeds=(0,))
    log = io.StringIO()
    counts = run_sweep(path, stream=log)
    assert counts == {"failed": 1, "oom": 1, "completed": 1, "diverged": 1}
    out = tmp_path / "out"
    rows = {r["run_id"]: r for r in _csv(out)}
    assert rows["boom__tiny__s0"]["status"] == "failed" and "boom" in rows["boom__tiny__s0"]["error"]
    assert rows["oom__tiny__s0"]["status"] == "oom"
    assert rows["nan__tiny__s0"]["status"] == "diverged"
    ends = [r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "end"]
    boom = next(r for r in ends if r["run_id"] == "boom__tiny__s0")
    assert boom["returncode"] == 1 and "RuntimeError: boom at step 0" in boom["error"]
    assert "fake run boom" in (out / "runs" / "boom__tiny__s0" / "stdout.log").read_text()
    text = log.getvalue()
    assert "[sweep 4/4" in text and "ETA" in text and "running adamw__tiny__s0" in text
    # a restart skips everything (failed runs are final) unless asked to retry them
    assert run_sweep(path, stream=io.StringIO()) == counts
    assert sum(1 for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start") == 4
    run_sweep(path, stream=io.StringIO(), retry_failed=True)
    starts = [r["run_id"] for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start"]
    assert sorted(starts[4:]) == ["boom__tiny__s0", "oom__tiny__s0"]
    assert (out / "runs" / "boom__tiny__s0.incomplete-1").is_dir()  # moved aside, never deleted
    assert len(_csv(out)) == 4


def test_killed_sweep_resumes_without_duplicates(tmp_path: Path) -> None:
    path = _sweep_file(tmp_path, optimizers=("adamw", "lion"), seeds=(0, 1), env={"FAKE_SLEEP": "3"})
    out = tmp_path / "out"
    state = out / "sweep_state.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hf_optbench", "sweep", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the second run is under way
        starts = [r for r in read_state(state) if r["event"] == "start"]
        if len(starts) == 2 and (out / "runs" / starts[1]["run_id"] / "metrics.jsonl").is_file():
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the sweep did not reach its second run")
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep's whole process group, mid-run
    proc.wait()
    killed = starts[1]
    orphan = psutil.Process(killed["pid"])  # the run has its own session: it outlived the sweep
    assert orphan.is_running() and orphan.environ().get(RUN_DIR_ENV) == str(out / "runs" / killed["run_id"])

    log = io.StringIO()
    counts = run_sweep(path, stream=log)
    assert counts == {"completed": 4}
    assert not psutil.pid_exists(killed["pid"]) or orphan.status() == psutil.STATUS_ZOMBIE
    rows = _csv(out)
    assert sorted(r["run_id"] for r in rows) == sorted({r["run_id"] for r in rows}) == sorted(
        ["adamw__tiny__s0", "lion__tiny__s0", "adamw__tiny__s1", "lion__tiny__s1"])
    assert all(r["status"] == "completed" for r in rows)
    events = read_state(state)
    starts_by_run = {}
    for r in events:
        if r["event"] == "start":
            starts_by_run[r["run_id"]] = starts_by_run.get(r["run_id"], 0) + 1
    assert starts_by_run == {"adamw__tiny__s0": 1, killed["run_id"]: 2, "adamw__tiny__s1": 1, "lion__tiny__s1": 1}
    assert sum(1 for r in events if r["event"] == "end" and r["status"] == "completed") == 4
    assert (out / "runs" / f"{killed['run_id']}.incomplete-1" / "metrics.jsonl").is_file()
    # the rerun's metrics start clean: 4 steps, not the killed attempt's rows plus the new ones
    assert len((out / "runs" / killed["run_id"] / "metrics.jsonl").read_text().splitlines()) == 4
    assert "1 already finished, 3 to run" in log.getvalue()


def test_sigterm_stops_the_running_run(tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C) to the sweep stops the run's process tree too and exits 130; nothing is left running."""
    path = _sweep_file(tmp_path, optimizers=("adamw",), seeds=(0,), env={"FAKE_SLEEP": "30"})
    state = tmp_path / "out" / "sweep_state.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hf_optbench", "sweep", str(path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [r for r in read_state(state) if r["event"] == "start"]:
        time.sleep(0.05)
    run_pid = next(r["pid"] for r in read_state(state) if r["event"] == "start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert "start the same command again" in proc.stderr.read()
    assert not psutil.pid_exists(run_pid) or psutil.Process(run_pid).status() == psutil.STATUS_ZOMBIE
    assert not [r for r in read_state(state) if r["event"] == "end"]  # unfinished: the next start reruns it


def test_unfinished_run_with_checkpoint_resumes(tmp_path: Path) -> None:
    path = _sweep_file(tmp_path, optimizers=("adamw",), seeds=(0,))
    out = tmp_path / "out"
    run_dir = out / "runs" / "adamw__tiny__s0"
    (run_dir / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')  # complete: written last
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.0}\n')
    append_state(out / "sweep_state.jsonl", {"event": "start", "run_id": "adamw__tiny__s0", "attempt": 1,
                                             "pid": 2**22 + 12345, "host": "elsewhere", "time": 1.0})
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}
    invocation = (run_dir / "invocations.txt").read_text()
    assert "--resume_from_checkpoint true" in invocation
    assert not list((out / "runs").glob("*.incomplete-*"))
    # a failed attempt with a checkpoint, retried: resumed, and its failed summary kept aside (not read as final)
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error": "NCCL timeout"}))
    assert run_sweep(path, stream=io.StringIO()) == {"failed": 1}
    assert run_sweep(path, stream=io.StringIO(), retry_failed=True) == {"completed": 1}
    assert json.loads((run_dir / "summary.failed-1.json").read_text())["error"] == "NCCL timeout"
    assert (run_dir / "invocations.txt").read_text().count("--resume_from_checkpoint true") == 2


def test_a_run_stopped_while_saving_its_first_checkpoint_starts_over(tmp_path: Path) -> None:
    """A sweep interrupted while a run wrote its first checkpoint leaves it torn (no trainer_state.json, which the
    Trainer writes last). Resumed, the run refused ("no complete checkpoint") and counted as failed; it starts over
    from step 0 now, its directory moved aside."""
    path = _sweep_file(tmp_path, optimizers=("adamw",), seeds=(0,))
    out = tmp_path / "out"
    run_dir = out / "runs" / "adamw__tiny__s0"
    (run_dir / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoint-2" / "model.safetensors").write_bytes(b"\x00" * 8)
    append_state(out / "sweep_state.jsonl", {"event": "start", "run_id": "adamw__tiny__s0", "attempt": 1,
                                             "pid": 2**22 + 12345, "host": "elsewhere", "time": 1.0})
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}
    assert "--resume_from_checkpoint" not in (run_dir / "invocations.txt").read_text()
    assert (out / "runs" / "adamw__tiny__s0.incomplete-1" / "checkpoint-2" / "model.safetensors").is_file()


def test_dry_run_max_runs_and_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep_file(tmp_path, optimizers=("adamw", "lion"), seeds=(0,))
    assert cli_main([str(path), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "adamw__tiny__s0" in text and "pending" in text and "fake_run.py" in text
    assert not (tmp_path / "out" / "runs").exists()
    assert cli_main([str(path), "--max-runs", "1"]) == 0
    assert [r["run_id"] for r in _csv(tmp_path / "out")] == ["adamw__tiny__s0"]
    with sweep_lock(tmp_path / "out"):
        with pytest.raises(OptBenchError, match="another sweep process"):
            run_sweep(path, stream=io.StringIO())
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 2}


def test_classify_outcome(tmp_path: Path) -> None:
    assert classify_outcome(tmp_path, -9, "")[0] == "failed"
    assert "killed by signal 9" in classify_outcome(tmp_path, -9, "")[1]
    assert classify_outcome(tmp_path, 1, "RuntimeError: CUDA out of memory.")[0] == "oom"
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert classify_outcome(tmp_path, -6, "SIGABRT at exit") == ("completed", None)  # summary.json decides


def test_submitit_executor_runs_jobs(tmp_path: Path) -> None:
    """launcher.executor slurm through submitit; cluster 'local' is submitit's own stand-in for SLURM."""
    pytest.importorskip("submitit")
    path = _sweep_file(tmp_path, optimizers=("adamw", "boom"), seeds=(0,),
                       launcher={"executor": "slurm", "slurm": {"cluster": "local", "timeout_min": 5,
                                                                "partition": "ignored-by-local"}})
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 1, "failed": 1}
    events = read_state(tmp_path / "out" / "sweep_state.jsonl")
    assert [r["event"] for r in events].count("submitted") == 2
    assert all(r.get("job_id") for r in events if r["event"] == "submitted")
    assert "submitted 2 job(s) to local" in log.getvalue()
    assert (tmp_path / "out" / "submitit").is_dir()


@pytest.mark.slow
def test_real_sweep_with_accelerate_and_report(tmp_path: Path) -> None:
    """Two real runs of hf_optbench.run on the tiny model, through `accelerate launch`, then the report."""
    sweep = {
        "base": str(REPO / "recipes/quickstart_cpu.yaml"),
        "output_dir": str(tmp_path / "real"),
        "overrides": {"max_steps": 6, "eval_steps": 3, "block_size": 32},
        "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny"], "seed": [0]},
        "launcher": {"type": "accelerate", "accelerate_config": str(REPO / "accelerate_configs/cpu.yaml")},
        "calibration": False,  # the step-time calibration has tests of its own (tests/study/test_calibration.py)
    }
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 2}
    rows = {r["run_id"]: r for r in _csv(tmp_path / "real")}
    assert set(rows) == {"adamw__tiny__s0", "lion__tiny__s0"}
    assert int(rows["adamw__tiny__s0"]["optimizer_state_bytes"]) == 2 * int(rows["lion__tiny__s0"][
        "optimizer_state_bytes"]) + 4 * 28  # AdamW: two moments + a 4-byte step for each of tiny's 28 tensors
    assert "accelerate.commands.launch" in read_state(tmp_path / "real" / "sweep_state.jsonl")[0]["command"]
    from hf_optbench.report.build import build_report

    files = build_report(tmp_path / "real")
    assert "lion" in files["report.md"].read_text()


def test_a_finished_run_is_never_moved_aside(tmp_path: Path) -> None:
    """Issue 32 item 4: with two matrix points under one id, the second launch moved the first's completed run to
    ``*.incomplete-1``. Ids are unique now (tests/cli/test_bad_inputs.py), and the launcher refuses to move a finished
    run whatever led there."""
    import io

    from hf_optbench.study.launch import prepare_run_dir
    from hf_optbench.study.sweep_state import Progress

    spec = load_sweep(_sweep_file(tmp_path))
    run = spec.runs[0]
    spec.run_dir(run).mkdir(parents=True)
    (spec.run_dir(run) / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(OptBenchError, match="already holds a finished run"):
        prepare_run_dir(spec, run, spec.output_dir / "sweep_state.jsonl", [], Progress(1, 0, io.StringIO()))
    assert (spec.run_dir(run) / "summary.json").is_file() and len(list(spec.runs_dir.iterdir())) == 1
