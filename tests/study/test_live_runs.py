"""A sweep never touches what another live process owns: a run directory whose run.lock a live process holds is
neither moved aside nor written into (the sweep stops with one line naming the holder), and a sweep started on a
copy of a live sweep's directory leaves the original's runs running (it stops only processes it started itself).

The runs are a stand-in for ``hf_optbench.run`` (``launcher.type: command``) that writes a completed summary.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.run.lock import acquire_run_lock
from hf_optbench.rundir import RUN_LOCK_FILE, append_state, read_summary
from hf_optbench.study.sweep import run_sweep

STAND_IN = r'''
import argparse, json, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--seed", "--resume_from_checkpoint"):
    p.add_argument(k)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
with open(out / "invocations.txt", "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
(out / "summary.json").write_text(json.dumps({"status": "completed", "optimizer": a.optimizer,
                                              "model_size": a.model_size, "seed": int(a.seed), "steps": 4}))
'''
# A process that is no child of any sweep and holds a run directory's lock, as a live run does.
HOLDER = "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"
RUN_ID = "adamw__tiny__s0"


def _sweep_file(tmp_path: Path, out: Path) -> Path:
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    base = tmp_path / "base.yaml"
    base.write_text("max_steps: 4\n")
    sweep = {"base": str(base), "output_dir": str(out), "overrides": {"max_steps": 4},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [0]},
             "launcher": {"type": "command", "command": ["{python}", str(stand_in)], "validate": False}}
    path = tmp_path / f"sweep_{out.name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("checkpoint", [False, True], ids=["unfinished", "with-checkpoint"])
def test_a_run_directory_held_by_a_live_process_is_left_alone(tmp_path: Path, checkpoint: bool) -> None:
    out = tmp_path / "out"
    run_dir = out / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.0}\n')
    if checkpoint:
        (run_dir / "checkpoint-2").mkdir()
    path = _sweep_file(tmp_path, out)
    lock = acquire_run_lock(run_dir)  # this test process is the live run that owns the directory
    try:
        before = _snapshot(run_dir)
        with pytest.raises(OptBenchError, match=f"run {RUN_ID}: its directory .* is held by a live process") as err:
            run_sweep(path, stream=io.StringIO())
        assert f"pid {os.getpid()}" in str(err.value)
        assert not list((out / "runs").glob("*.incomplete-*"))  # not moved aside
        assert _snapshot(run_dir) == before  # not written into, and no run of the sweep started in it
    finally:
        lock.release()
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}  # once the owner has gone, the sweep goes on


def test_a_sweep_on_a_copied_directory_stops_none_of_the_originals_runs(tmp_path: Path) -> None:
    """The original sweep's run is live (a process of the original, not of the copy's sweep, holding its run
    directory's lock); the copy's state file names its pid. The copy's sweep leaves it running, touches nothing of
    the original, and runs its own copy of the run."""
    original = tmp_path / "original"
    run_dir = original / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.0}\n')
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / RUN_LOCK_FILE)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (original / "sweep_manifest.json").write_text(json.dumps({"name": "x", "runs": [], "sweep_id": "abc123"}))
        append_state(original / "sweep_state.jsonl", {
            "event": "start", "run_id": RUN_ID, "attempt": 1, "pid": holder.pid,
            "pid_create_time": psutil.Process(holder.pid).create_time(), "host": socket.gethostname(),
            "time": 1.0, "sweep_id": "abc123", "sweep_dir": str(original.resolve())})
        copy = tmp_path / "copy"
        shutil.copytree(original, copy)
        before = _snapshot(original)
        log = io.StringIO()
        assert run_sweep(_sweep_file(tmp_path, copy), stream=log) == {"completed": 1}
        assert holder.poll() is None, "the original sweep's run was stopped"
        assert f"process {holder.pid} was started by the sweep in '{original.resolve()}'" in log.getvalue()
        assert _snapshot(original) == before
        assert (read_summary(copy / "runs" / RUN_ID) or {}).get("status") == "completed"
    finally:
        holder.kill()
        holder.wait()


def test_start_rows_name_the_sweep_that_wrote_them(tmp_path: Path) -> None:
    """Each start row carries the sweep's id (kept in its manifest across restarts) and directory."""
    out = tmp_path / "out"
    path = _sweep_file(tmp_path, out)
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}
    sweep_id = json.loads((out / "sweep_manifest.json").read_text())["sweep_id"]
    assert run_sweep(path, stream=io.StringIO(), retry_failed=True) == {"completed": 1}
    assert json.loads((out / "sweep_manifest.json").read_text())["sweep_id"] == sweep_id
    rows = [json.loads(line) for line in (out / "sweep_state.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r["event"] == "start"]
    assert starts and all(r["sweep_id"] == sweep_id and r["sweep_dir"] == str(out.resolve()) for r in starts)
