"""The SLURM executor against a running SLURM: munged, slurmctld and slurmd started here on a temporary single-node
configuration (tests/fixtures/slurm_cluster.py, the one docs/SLURM.md gives), no accounting storage (no ``sacct``).

A 4-run sweep (AdamW and Lion at tiny, two seeds, a few steps) runs with the local executor, then with ``executor:
slurm`` as a separate process (the ``hf-optbench sweep`` command). Checked: every run ran as the SLURM job the sweep
recorded for it (the id the run read from its own environment equals the submitted one), its losses equal the local
run's to the last digit, a job ``scancel``-ed while pending is not counted and runs again at the next sweep, the
step-time calibration runs as a job on the node, nothing asks ``sacct`` (no warning per poll); and Ctrl-C of a sweep
cancels its pending jobs and names those that keep running, which the same command re-attaches to.

Skipped, with the reason, only where the SLURM or munge programs are absent (``.ci/run`` installs them)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hf_optbench.report.build import build_report
from hf_optbench.rundir import read_state, read_summary
from hf_optbench.study.processes import marked_processes
from hf_optbench.study.records import load_runs
from hf_optbench.study.sweep import run_sweep

from fixtures.slurm_cluster import Cluster, missing_binaries, new_cluster, start

REPO = Path(__file__).resolve().parents[2]
MISSING = missing_binaries()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"SLURM/munge programs not found on PATH or in sbin "
                                             f"({', '.join(MISSING)}): apt-get install slurm-wlm munge (.ci/run does)"),
]
pytest.importorskip("submitit")

RUN_IDS = ["adamw__tiny__s0", "adamw__tiny__s1", "lion__tiny__s0", "lion__tiny__s1"]
# metrics.jsonl values that depend on what was computed, not on how long it took
COMPUTED = ("loss", "eval_loss", "grad_norm", "lr", "tokens", "step")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The single-node cluster, its clients pointed at it (SLURM_CONF) for the module; stopped at teardown (jobs
    cancelled, daemons and leftover job processes ended)."""
    root = Path(tempfile.mkdtemp(prefix="hfob-slurm-", dir="/tmp"))  # short: munge's socket path lives here
    c = new_cluster(root)
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(c.conf)
    try:
        start(c)
        yield c
    finally:
        c.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        shutil.rmtree(root, ignore_errors=True)


def _sweep_file(tmp_path: Path, name: str, executor: str, calibration: Any = False) -> Path:
    sweep = {
        "name": name,
        "base": str(REPO / "recipes/quickstart_cpu.yaml"),
        "output_dir": str(tmp_path / name),
        "overrides": {"data_source": "synthetic", "block_size": 32, "per_device_train_batch_size": 4,
                      "per_device_eval_batch_size": 4, "validation_blocks": 4, "max_steps": 6, "eval_steps": 3,
                      "save_strategy": "no"},
        "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny"], "seed": [0, 1]},
        "calibration": calibration,
        "launcher": {"type": "python", "jobs": 1, "env": {"OMP_NUM_THREADS": "1"}, "executor": executor,
                     **({"slurm": {"partition": "cpu", "cpus_per_task": 1, "timeout_min": 10}}
                        if executor == "slurm" else {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _start_sweep(path: Path, log: Path) -> subprocess.Popen[bytes]:
    """``hf-optbench sweep`` as its own process (its output in ``log``: never a pipe nobody reads)."""
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "hf_optbench", "sweep", str(path)], stdout=fh,
                                stderr=subprocess.STDOUT, cwd=REPO)


def _wait(what: str, check: Callable[[], Any], timeout_s: float, proc: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> Any:
    """Poll ``check`` until it returns something true (returned); fail naming ``what`` after ``timeout_s`` or when
    ``proc`` ended first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        ended = proc is not None and proc.poll() is not None
        if ended or time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-4000:] if log is not None and log.is_file() else ""
            pytest.fail(f"{what}: {'the sweep exited first' if ended else f'not after {timeout_s:.0f} s'}\n{text}")
        time.sleep(0.2)


def _submitted(out: Path, n: int) -> list[dict[str, Any]]:
    rows = [r for r in read_state(out / "sweep_state.jsonl") if r.get("event") == "submitted"]
    return rows if len(rows) >= n else []


def _computed(run_dir: Path) -> tuple[list[dict[str, Any]], Any, Any]:
    """What a run computed: every metrics row's computed values, its final train and eval losses."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = read_summary(run_dir) or {}
    return ([{k: r[k] for k in COMPUTED if k in r} | {"kind": r.get("kind")} for r in rows],
            summary.get("final_train_loss"), summary.get("final_eval_loss"))


def test_a_sweep_runs_as_slurm_jobs_equal_to_local_and_a_cancelled_job_runs_again(tmp_path: Path,
                                                                                   cluster: Cluster) -> None:
    t0 = time.monotonic()
    assert run_sweep(_sweep_file(tmp_path, "local", "local"), stream=io.StringIO()) == {"completed": 4}
    local_s = time.monotonic() - t0

    # first SLURM sweep: one of its pending jobs is scancel-ed
    path, out, log1 = _sweep_file(tmp_path, "slurm", "slurm", {"rounds": 1, "steps_per_round": 3}), \
        tmp_path / "slurm", tmp_path / "sweep1.log"
    t1 = time.monotonic()
    proc = _start_sweep(path, log1)
    submitted = _wait("4 jobs submitted", lambda: _submitted(out, 4), 120, proc, log1)
    jobs = {r["run_id"]: r["job_id"] for r in submitted}
    pending = _wait("a pending job", lambda: [r for r in RUN_IDS if cluster.queue().get(jobs[r]) == "PENDING"],
                    30, proc, log1)
    victim = pending[-1]
    assert cluster.run("scancel", jobs[victim]).returncode == 0
    assert proc.wait(timeout=300) == 0, log1.read_text()
    first_s = time.monotonic() - t1
    text1 = log1.read_text()
    assert f"{victim}: job {jobs[victim]} left the queue without a result" in text1, text1
    assert "finished: completed 3, pending 1" in text1, text1

    # the next sweep runs the cancelled one again (a new job), then the calibration as a job of the cluster
    log2 = tmp_path / "sweep2.log"
    t2 = time.monotonic()
    proc = _start_sweep(path, log2)
    assert proc.wait(timeout=300) == 0, log2.read_text()
    second_s = time.monotonic() - t2
    text2 = log2.read_text()
    assert "3 already finished, 1 to run" in text2, text2
    for text in (text1, text2):
        assert "sacct" not in text and "Bypassing" not in text, text  # never asked: no warning per poll

    rows = read_state(out / "sweep_state.jsonl")
    records = {r["run_id"]: r for r in load_runs(out)}
    assert sorted(records) == RUN_IDS and {r["status"] for r in records.values()} == {"completed"}
    ran_as = {}
    for rid in RUN_IDS:
        end = [r for r in rows if r["run_id"] == rid and r["event"] == "end"]
        assert len(end) == 1 and end[0]["status"] == "completed", end
        summary = read_summary(out / "runs" / rid) or {}
        # the id the run read from its own environment: it ran as that job, the one the sweep recorded
        ran_as[rid] = summary["env"]["slurm_job_id"]
        assert ran_as[rid] == end[0]["job_id"] == records[rid]["job_id"], (rid, summary["env"], end)
        assert _computed(out / "runs" / rid) == _computed(tmp_path / "local" / "runs" / rid), rid
    cancelled = [r for r in rows if r["event"] == "cancelled"]
    assert [(r["run_id"], r["job_id"]) for r in cancelled] == [(victim, jobs[victim])]
    assert ran_as[victim] != jobs[victim]  # run again as a new job
    assert len(set(ran_as.values())) == 4

    calibration = json.loads((out / "step_calibration.json").read_text())
    assert calibration["machine"]["slurm_job_id"] and calibration["machine"]["slurm_job_id"] not in ran_as.values()
    assert f"submitted as job {calibration['machine']['slurm_job_id']} to slurm" in text2, text2
    assert {e["optimizer"] for e in calibration["entries"]} == {"adamw", "lion"}
    evidence = build_report(out)["evidence.md"].read_text()  # the report's time section reads the node's steps
    assert "Step times measured alone after the sweep on " in evidence, evidence
    print(f"\n[slurm test] jobs the runs ran as: {ran_as}; scancel-ed pending job {jobs[victim]} ({victim}), run "
          f"again as job {ran_as[victim]}; calibration job {calibration['machine']['slurm_job_id']} on "
          f"{calibration['machine']['host']}; wall time: local sweep {local_s:.1f} s, first SLURM sweep "
          f"{first_s:.1f} s, second (1 run + calibration) {second_s:.1f} s; losses and metrics rows equal to the "
          f"local executor's for all 4 runs: {[_computed(out / 'runs' / r)[2] for r in RUN_IDS]}")


def test_ctrl_c_cancels_the_pending_jobs_and_names_the_running_ones(tmp_path: Path, cluster: Cluster) -> None:
    path, out, log = _sweep_file(tmp_path, "interrupted", "slurm"), tmp_path / "interrupted", tmp_path / "sweep.log"
    proc = _start_sweep(path, log)
    jobs = {r["run_id"]: r["job_id"] for r in _wait("4 jobs submitted", lambda: _submitted(out, 4), 120, proc, log)}

    def split() -> tuple[list[str], list[str]] | None:
        queue = cluster.queue()
        running = [r for r in RUN_IDS if queue.get(jobs[r]) == "RUNNING"]
        pending = [r for r in RUN_IDS if queue.get(jobs[r]) == "PENDING"]
        return (running, pending) if running and pending and len(running) + len(pending) == 4 else None

    running, pending = _wait("2 jobs running, 2 pending", split, 60, proc, log)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, log.read_text()
    text = log.read_text()
    assert f"cancelled {len(pending)} pending job(s): " + ", ".join(f"{r} (job {jobs[r]})" for r in pending) in text, \
        text
    assert f"{len(running)} job(s) keep running: " in text and all(f"{r} (job {jobs[r]}, RUNNING)" in text
                                                                    for r in running), text
    # the sweep's last line says so too (not "no run was in flight")
    assert f"{len(running)} SLURM job(s) keep running" in text.strip().splitlines()[-1], text
    queue = cluster.queue()
    assert not [r for r in pending if jobs[r] in queue], queue  # cancelled: gone from the queue at once
    assert [r for r in running if jobs[r] in queue] == running, queue  # left running, as said
    rows = read_state(out / "sweep_state.jsonl")
    assert sorted(r["run_id"] for r in rows if r["event"] == "cancelled") == sorted(pending)

    # the same command re-attaches to the jobs left running and submits the cancelled runs again; the running jobs
    # are suspended first (they stay in the queue, their CPUs held), so however fast they would have finished,
    # they are still there when it looks, and its new jobs pend
    assert cluster.run("scontrol", "suspend", *(jobs[r] for r in running)).returncode == 0
    # and the node drained: a suspended job's CPUs were seen given to the new jobs on a loaded machine (they ran at
    # once instead of pending); a draining node starts nothing new, whatever its CPUs
    node = socket.gethostname().split(".")[0]
    assert cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test").returncode == 0
    log2 = tmp_path / "restart.log"
    proc = _start_sweep(path, log2)
    again = _wait("the cancelled runs submitted again", lambda: _submitted(out, 6)[4:], 120, proc, log2)
    text2 = log2.read_text()
    assert all(f"re-attached to job {jobs[r]} of {r}" in text2 for r in running), text2
    assert sorted(r["run_id"] for r in again) == sorted(pending), again
    _wait("its new jobs pending", lambda: all(cluster.queue().get(r["job_id"]) == "PENDING" for r in again), 30,
          proc, log2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, log2.read_text()
    assert not [r for r in again if r["job_id"] in cluster.queue()]

    assert cluster.run("scontrol", "update", f"nodename={node}", "state=resume").returncode == 0
    # the jobs left running are the user's to stop: scancel ends their runs' processes too (no orphan)
    assert cluster.run("scancel", *(jobs[r] for r in running)).returncode == 0
    dirs = {str(out / "runs" / r) for r in running}
    _wait("the scancel-ed runs' processes gone", lambda: not (dirs & set(marked_processes())), 60)
    print(f"\n[slurm test] Ctrl-C: cancelled pending {[(r, jobs[r]) for r in pending]}, left running "
          f"{[(r, jobs[r]) for r in running]} (named on the console: {text.strip().splitlines()[-1]!r}); the same "
          f"command re-attached to those and submitted the cancelled runs again as "
          f"{[(r['run_id'], r['job_id']) for r in again]}")
