"""Local sweeps with several runs at once (``launcher.jobs``): runs in flight together, each pinned to
its own cores, the sharing recorded in every summary.json and flagged by the report, a kill or an interrupt with
two runs in flight followed by a restart that loses and duplicates nothing, the slot plan, and bad values.

The runs are a stand-in for ``hf_optbench.run`` (a small script taking the same arguments and writing
metrics.jsonl + summary.json, the sharing record from :func:`hf_optbench.run.summary.sharing`), so the machinery
(threads, processes, state file, kill, restart) runs for real in seconds. Overlap is proved by a barrier, never by
timing: a run waits until the other run has started, so a sweep that ran them one after another would fail them.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench import cli
from hf_optbench.report.noise import by_seed, wallclock_note
from hf_optbench.run.summary import sharing
from hf_optbench.rundir import read_state
from hf_optbench.study import launch, sweep_state, worker_client
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_state import Slot, plan_slots

from fixtures.fake_sweep import fake_sweep_file, process_gone, wait_for

REPO = Path(__file__).resolve().parents[2]
LIGHT = [sys.executable, "-m", "hf_optbench.study.worker", "--imports", "json"]
def _use_worker(monkeypatch: pytest.MonkeyPatch, fake: Path) -> None:
    """Launcher type python through a light warm worker whose forks run the stand-in script."""
    original = launch.build_command
    monkeypatch.setattr(launch, "build_command",
                        lambda spec, run, run_dir, resume: [sys.executable, str(fake),
                                                            *original(spec, run, run_dir, resume)[3:]])
    monkeypatch.setattr(worker_client, "WORKER_COMMAND", LIGHT)


# ------------------------------------------------------------------------------------------ two at once
@pytest.mark.parametrize("via", ["subprocess", "warm_worker"])
def test_jobs_2_runs_two_at_once_each_pinned_to_its_own_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             via: str) -> None:
    if via == "warm_worker":
        path = fake_sweep_file(tmp_path, env={"FAKE_BARRIER": "2"}, type="python")
        _use_worker(monkeypatch, tmp_path / "fake_run.py")
    else:
        path = fake_sweep_file(tmp_path, env={"FAKE_BARRIER": "2"})
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 2}, log.getvalue()
    out = tmp_path / "out"
    rows = read_state(out / "sweep_state.jsonl")
    starts = {r["run_id"]: r for r in rows if r["event"] == "start"}
    ends = {r["run_id"]: r for r in rows if r["event"] == "end"}
    assert set(starts) == set(ends) == {"adamw__tiny__s0", "lion__tiny__s0"}
    assert {r["launched_via"] for r in ends.values()} == {via}
    assert all(r["cpu_s"] is not None for r in ends.values())  # each run's own CPU time, not a sum over both
    summaries = {rid: json.loads((out / "runs" / rid / "summary.json").read_text()) for rid in starts}
    # both were in flight at once: each began before the other ended (the barrier makes it so)
    a, b = summaries.values()
    assert max(a["began"], b["began"]) < min(a["ended"], b["ended"])
    # the sharing, in the state file and in each run's own summary (what the kernel reports, for the cores)
    assert sorted(r["slot"] for r in starts.values()) == [0, 1]
    for rid, summary in summaries.items():
        assert summary["concurrent_runs"] == 2 and starts[rid]["concurrent_runs"] == 2
        assert summary["pinning"]["slot"] == starts[rid]["slot"]
        assert summary["pinning"]["cpus"] == starts[rid]["cpus"]
    if len(os.sched_getaffinity(0)) >= 2:  # one core per run, a different one each
        cores = [tuple(s["pinning"]["cpus"]) for s in summaries.values()]
        assert all(len(c) == 1 for c in cores) and len(set(cores)) == 2
    assert "2 runs at once" in log.getvalue()


# ------------------------------------------------------------------------------------------ kill, restart
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_sweep_killed_with_two_runs_in_flight_reruns_each_run_once(tmp_path: Path, how: str) -> None:
    """SIGKILL of the sweep (its runs, in sessions of their own, outlive it) or SIGTERM (it stops both and exits
    130) while two runs are in flight; the rerun stops what is left, reruns those two, runs the rest: every run
    ends completed exactly once, each run directory holds one clean attempt, nothing is lost or duplicated."""
    hold = tmp_path / "hold"
    hold.write_text("")
    try:
        _kill_and_rerun(tmp_path, hold, how)
    finally:
        hold.unlink(missing_ok=True)  # whatever happened, nothing of this test stays in flight


def _kill_and_rerun(tmp_path: Path, hold: Path, how: str) -> None:
    path = fake_sweep_file(tmp_path, optimizers=("adamw", "lion"), seeds=(0, 1), env={"FAKE_HOLD_WHILE": str(hold)})
    out = tmp_path / "out"
    state = out / "sweep_state.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hf_optbench", "sweep", str(path)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def two_in_flight() -> bool:
        started = [r for r in read_state(state) if r["event"] == "start"]
        return len(started) == 2 and all((out / "runs" / r["run_id"] / "metrics.jsonl").is_file() for r in started)

    try:
        wait_for(two_in_flight, "two runs in flight")
    finally:
        if proc.poll() is None and how == "sigkill":
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep's group: the runs have sessions of their own
        elif proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    killed = [r for r in read_state(state) if r["event"] == "start"]
    if how == "sigterm":
        assert proc.wait(timeout=60) == 130, proc.stderr.read()
        assert all(process_gone(r["pid"]) for r in killed)  # the sweep stopped both before it exited
        assert not [r for r in read_state(state) if r["event"] == "end"]  # unfinished: a restart reruns them
    else:
        proc.wait()
        assert all(not process_gone(r["pid"]) for r in killed)  # orphans, still running
    proc.stderr.close()
    # the rerun's attempts do not hold (the orphans of a SIGKILL still do: the rerun must stop them, not wait)
    fake_sweep_file(tmp_path, optimizers=("adamw", "lion"), seeds=(0, 1))
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 4}, log.getvalue()
    assert all(process_gone(r["pid"]) for r in killed)
    rows = read_state(state)
    run_ids = {"adamw__tiny__s0", "lion__tiny__s0", "adamw__tiny__s1", "lion__tiny__s1"}
    killed_ids = {r["run_id"] for r in killed}
    starts = [r["run_id"] for r in rows if r["event"] == "start"]
    assert {rid: starts.count(rid) for rid in run_ids} == {rid: 2 if rid in killed_ids else 1 for rid in run_ids}
    ends = [r for r in rows if r["event"] == "end"]
    assert sorted(r["run_id"] for r in ends) == sorted(run_ids)  # one end each, none for a killed attempt
    assert all(r["status"] == "completed" for r in ends)
    finals = sorted(d.name for d in (out / "runs").iterdir())
    assert finals == sorted(run_ids | {f"{rid}.incomplete-1" for rid in killed_ids})  # killed attempts kept aside
    for rid in run_ids:  # one attempt's rows each: 4 steps, not the killed attempt's rows plus the new ones
        steps = [json.loads(line)["step"] for line in (out / "runs" / rid / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4]
    csv_ids = [line.split(",")[0] for line in (out / "summary.csv").read_text().splitlines()[1:]]
    assert len(csv_ids) == 4


# ------------------------------------------------------------------------------------------ the slot plan
def test_plan_slots_auto_fills_cores_or_gpus_and_pins_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(sweep_state, "gpu_visible", lambda env: bool(env.get("CUDA_VISIBLE_DEVICES")))
    monkeypatch.setattr(sweep_state, "_memory_cap", lambda: None)
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    python = {"type": "python"}
    assert [s.cpus for s in plan_slots(python, 10, cpu)] == [(0,), (1,), (2,), (3,)]  # OMP_NUM_THREADS default 1
    assert len(plan_slots(python, 3, cpu)) == 3  # never more slots than runs
    two = plan_slots({**python, "env": {"OMP_NUM_THREADS": "2"}}, 10, cpu)
    assert [s.cpus for s in two] == [(0, 1), (2, 3)] and two[1].env()["HF_OPTBENCH_CPUS"] == "2,3"
    assert plan_slots({"type": "command"}, 10, cpu) == [Slot()]  # a wrapper's processes cannot be counted
    assert plan_slots({**python, "jobs": 1}, 10, cpu) == [Slot()]  # one at a time: not pinned
    assert len(plan_slots({"type": "command", "jobs": 3}, 10, cpu)) == 3
    gpu = plan_slots(python, 10, {"CUDA_VISIBLE_DEVICES": "3,5"})
    assert [(s.gpus, s.cpus) for s in gpu] == [(("3",), (0, 1)), (("5",), (2, 3))]
    assert gpu[1].env()["CUDA_VISIBLE_DEVICES"] == "5" and gpu[1].env()["HF_OPTBENCH_CONCURRENT_RUNS"] == "2"
    assert Slot().describe() == "" and "cores 2,3" in two[1].describe()
    monkeypatch.setattr(sweep_state, "_memory_cap", lambda: 2)  # auto starts no more runs than memory holds
    assert len(plan_slots(python, 10, cpu)) == 2 and len(plan_slots({**python, "jobs": 4}, 10, cpu)) == 4


def test_summary_sharing_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_OPTBENCH_CONCURRENT_RUNS", raising=False)
    monkeypatch.delenv("HF_OPTBENCH_SLOT", raising=False)
    alone = sharing()
    assert alone["concurrent_runs"] is None and alone["pinning"]["cpus"] == sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("HF_OPTBENCH_CONCURRENT_RUNS", "2")
    monkeypatch.setenv("HF_OPTBENCH_SLOT", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert sharing()["concurrent_runs"] == 2
    assert sharing()["pinning"] | {"cpus": None} == {"slot": 1, "cpus": None, "cuda_visible_devices": "1"}


def test_report_flags_wall_clock_measured_under_sharing() -> None:
    def rec(opt: str, seed: int, value: float, shared: int | None) -> dict:
        return {"optimizer": opt, "model_size": "tiny", "seed": seed, "step_time_median_s": value,
                "_summary": {"concurrent_runs": shared} if shared else {}}

    alone = [rec("adamw", s, 1.0, None) for s in (1, 2)] + [rec("lion", s, 0.5, 1) for s in (1, 2)]
    shared = alone[:2] + [rec("lion", s, 0.5, 2) for s in (1, 2)]
    note = wallclock_note(*(by_seed(alone, "step_time_median_s", o, "tiny") for o in ("lion", "adamw")))
    assert note == ""
    note = wallclock_note(*(by_seed(shared, "step_time_median_s", o, "tiny") for o in ("lion", "adamw")))
    assert note == "(measured with 2 runs at once sharing the machine)"


# ------------------------------------------------------------------------------------------ bad values
@pytest.mark.parametrize("value", [0, -1, "many", 1.5, True])
def test_bad_jobs_values_exit_2_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               value: object) -> None:
    path = fake_sweep_file(tmp_path, jobs=value)
    assert cli.main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "launcher.jobs must be a positive integer" in err and '"auto"' in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ the real run
@pytest.mark.slow
def test_real_runs_two_at_once_record_the_sharing(tmp_path: Path) -> None:
    """Two real tiny runs of hf_optbench.run through the warm workers, two at once: both complete, and each
    summary.json records the sharing and its own core."""
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump({
        "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "real"),
        "overrides": {"max_steps": 2, "eval_steps": 2, "block_size": 32, "data_source": "synthetic"},
        "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny"], "seed": [0]},
        "launcher": {"type": "python", "jobs": 2, "env": {"OMP_NUM_THREADS": "1"}}, "calibration": False}))
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 2}
    summaries = [json.loads((tmp_path / "real" / "runs" / rid / "summary.json").read_text())
                 for rid in ("adamw__tiny__s0", "lion__tiny__s0")]
    assert [s["concurrent_runs"] for s in summaries] == [2, 2]
    assert sorted(s["pinning"]["slot"] for s in summaries) == [0, 1]
    if len(os.sched_getaffinity(0)) >= 2:
        assert len({tuple(s["pinning"]["cpus"]) for s in summaries}) == 2
