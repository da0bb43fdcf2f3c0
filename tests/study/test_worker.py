"""The warm worker (hf_optbench/study/worker.py, worker_client.py and its use in launch.py): a forked run behaves
like a fresh ``python -m`` process (exit codes, log, environment, cwd, losses), a crash is a failed run and not a
failed sweep, its peak RSS is its own, a killed sweep leaves no run behind, and every case that must keep the plain
subprocess does.

Most tests use a light worker (``--imports json``) and a stand-in run script so that they take seconds; the real
``hf_optbench.run`` goes through the fully warm worker in the slow test that compares losses with the subprocess.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psutil
import pytest
import yaml

from hf_optbench.rundir import read_state
from hf_optbench.study import launch, worker_client
from hf_optbench.study.processes import kill_tree
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.worker import fork_hazard
from hf_optbench.study.worker_client import WarmWorker, fork_target, unavailable_reason

from fixtures.fake_sweep import process_gone, wait_for

REPO = Path(__file__).resolve().parents[2]
LIGHT = [sys.executable, "-m", "hf_optbench.study.worker", "--imports", "json"]
FAKE_RUN = r'''
import argparse, json, os, pathlib, sys, time
p = argparse.ArgumentParser()
p.add_argument("recipe")
p.add_argument("--output_dir")
p.add_argument("--optimizer")
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
(out / "started").write_text(str(os.getpid()))
print("fake run", a.optimizer, "marker", os.environ.get("HF_OPTBENCH_SWEEP_RUN_DIR"), "cwd", os.getcwd(), flush=True)
if a.optimizer == "boom":
    raise RuntimeError("boom at step 0")
if a.optimizer == "abort":
    os.abort()
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
(out / "summary.json").write_text(json.dumps({"status": "completed", "optimizer": a.optimizer,
                                              "final_eval_loss": 4.0}))
sys.exit(int(os.environ.get("FAKE_CODE", "0")))
'''


def _fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake_run.py"
    path.write_text(FAKE_RUN)
    return path


def _sweep(tmp_path: Path, optimizers: tuple[str, ...], env: dict | None = None, **launcher) -> Path:
    base = tmp_path / "base.yaml"
    base.write_text("max_steps: 4\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "base": str(base), "output_dir": str(tmp_path / "out"),
        "matrix": {"optimizer": list(optimizers), "model_size": ["tiny"], "seed": [0]},
        "launcher": {"type": "python", "validate": False, "env": env or {}, **launcher}, "calibration": False}))
    return path


def _use_fake(monkeypatch: pytest.MonkeyPatch, fake: Path, worker_command: list[str] = LIGHT) -> None:
    """A python-launcher sweep whose runs are the stand-in script (the worker runs a script like a module)."""
    original = launch.build_command

    def build(spec, run, run_dir, resume):
        return [sys.executable, str(fake), *original(spec, run, run_dir, resume)[3:]]

    monkeypatch.setattr(launch, "build_command", build)
    monkeypatch.setattr(worker_client, "WORKER_COMMAND", worker_command)


# ------------------------------------------------------------------------------------------ when it is used
def test_only_local_python_launches_without_gpu_use_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_client, "gpu_visible", lambda env=None: False)
    env: dict[str, str] = {}
    assert unavailable_reason({"type": "python", "executor": "local"}, env) is None
    assert "accelerate" in unavailable_reason({"type": "accelerate", "executor": "local"}, env)
    assert "command" in unavailable_reason({"type": "command", "executor": "local"}, env)
    assert "slurm" in unavailable_reason({"type": "python", "executor": "slurm"}, env)
    assert "turned off" in unavailable_reason({"type": "python"}, {"HF_OPTBENCH_WARM_WORKER": "0"})
    assert "turned off" in unavailable_reason({"type": "python", "env": {"HF_OPTBENCH_WARM_WORKER": "false"}}, env)
    assert "turned off" in unavailable_reason({"type": "python", "warm_worker": False}, env)
    monkeypatch.setattr(worker_client, "gpu_visible", lambda env=None: True)
    assert "GPU" in unavailable_reason({"type": "python"}, env)


def test_fork_target_accepts_only_this_interpreter_without_flags() -> None:
    py = sys.executable
    assert fork_target([py, "-m", "hf_optbench.run", "r.yaml", "--seed", "1"]) == (
        "module", "hf_optbench.run", ["r.yaml", "--seed", "1"])
    assert fork_target([py, "script.py", "--x"]) == ("path", "script.py", ["--x"])
    assert fork_target([py, "-X", "importtime", "-m", "hf_optbench.run"]) is None
    assert fork_target(["/usr/bin/env", "python", "-m", "hf_optbench.run"]) is None


def test_fork_hazard_names_a_running_python_thread() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="busy-helper", daemon=True)
    thread.start()
    try:
        assert "busy-helper" in (fork_hazard() or "")
    finally:
        stop.set()
        thread.join()
    # a fresh interpreter (this pytest process may hold other tests' threads: tqdm, wandb) has no hazard
    code = "from hf_optbench.study.worker import fork_hazard; print(fork_hazard())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None"


# --------------------------------------------------------------------------------------- the forked child
def test_child_is_a_fresh_process_with_its_own_log_env_cwd_and_exit_code(tmp_path: Path) -> None:
    fake = _fake(tmp_path)
    worker = WarmWorker.start(dict(os.environ), str(REPO), str(tmp_path / "worker.log"), kill_tree, command=LIGHT)
    started: list[int] = []
    try:
        results = {}
        for name, env in (("adamw", {"HF_OPTBENCH_SWEEP_RUN_DIR": "marker-x"}), ("boom", {}), ("abort", {}),
                          ("exit3", {"FAKE_CODE": "3"})):
            out = tmp_path / name
            out.mkdir()
            rc = worker.execute([sys.executable, str(fake), "r.yaml", "--output_dir", str(out), "--optimizer", name],
                                str(out / "stdout.log"), env, str(tmp_path), on_start=lambda c: started.append(c.pid))
            results[name] = (rc, (out / "stdout.log").read_text(), worker.last_cpu_s)
    finally:
        worker.close()
    assert [results[n][0] for n in ("adamw", "boom", "abort", "exit3")] == [0, 1, -signal.SIGABRT, 3]
    assert f"marker marker-x cwd {tmp_path}" in results["adamw"][1]
    assert "RuntimeError: boom at step 0" in results["boom"][1] and "Traceback" in results["boom"][1]
    assert all(isinstance(r[2], float) for r in results.values())  # the child's CPU time, from wait4
    # each run was its own process: a new pid, not the worker's, recorded before the run began
    assert len(set(started)) == 4 and worker.proc.pid not in started
    assert all(int((tmp_path / n / "started").read_text()) == pid for n, pid in zip(
        ("adamw", "boom", "abort", "exit3"), started, strict=True))
    assert worker.proc.returncode == 0  # the worker survived its children's crashes and ended at close()


def test_a_child_can_have_stdout_apart_and_a_whole_environment_of_its_own(tmp_path: Path) -> None:
    """The optional request fields: ``stdout`` (fd 1 in its own file, stderr in the log) and ``environ`` (the
    child's whole environment in place of the worker's: a variable the worker has and ``environ`` lacks is unset)."""
    script = tmp_path / "both.py"
    script.write_text("import os, sys\nprint('to stdout', os.environ.get('ONLY_WORKER'), os.environ.get('MINE'))\n"
                      "print('to stderr', os.environ.get('ADDED'), file=sys.stderr)\nsys.exit(4)\n")
    worker = WarmWorker.start(dict(os.environ, ONLY_WORKER="w"), str(REPO), str(tmp_path / "worker.log"), kill_tree,
                              command=LIGHT)
    try:
        rc = worker.execute([sys.executable, str(script)], str(tmp_path / "err.log"), {"ADDED": "a"}, str(tmp_path),
                            stdout_path=str(tmp_path / "out.log"), environ={**os.environ, "MINE": "m"})
        merged = worker.execute([sys.executable, str(script)], str(tmp_path / "merged.log"), {}, str(tmp_path))
    finally:
        worker.close()
    assert rc == 4 and merged == 4
    assert (tmp_path / "out.log").read_text() == "to stdout None m\n"
    err = (tmp_path / "err.log").read_text()
    assert "to stderr a" in err and "to stdout" not in err
    both = (tmp_path / "merged.log").read_text()  # without them: one log, the worker's environment
    assert "to stdout w None" in both and "to stderr None" in both


BALLAST_WORKER = textwrap.dedent('''
    import json, sys
    ballast = bytearray(512 * 2**20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page: resident
    del ballast  # freed: the worker's RSS drops, its peak (VmHWM, ru_maxrss) stays
    peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    open(sys.argv[1], "w").write(json.dumps({"worker_peak_kib": peak}))
    from hf_optbench.study.worker import main
    main(["--imports", "torch"])
''')
REPORT_PEAK = textwrap.dedent('''
    import json, resource, sys
    from hf_optbench.measure.probe_memory import read_peak_memory, reset_peak_memory
    before = read_peak_memory(None)["peak_memory_bytes"]  # the worker reset it at the child's start
    since = reset_peak_memory(None)  # what the recorder does at train begin
    json.dump({"start": before, "train": read_peak_memory(None)["peak_memory_bytes"], "since": since,
               "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}, open(sys.argv[1], "w"))
''')


def test_peak_rss_of_a_forked_child_is_its_own_not_the_workers(tmp_path: Path) -> None:
    """The worker's peak (512 MiB of freed ballast) must not show up as the run's peak memory."""
    (tmp_path / "ballast.py").write_text(BALLAST_WORKER)
    (tmp_path / "report.py").write_text(REPORT_PEAK)
    worker = WarmWorker.start(dict(os.environ, PYTHONPATH=str(REPO)), str(REPO), str(tmp_path / "worker.log"),
                              kill_tree, command=[sys.executable, str(tmp_path / "ballast.py"),
                                                  str(tmp_path / "worker.json")])
    try:
        rc = worker.execute([sys.executable, str(tmp_path / "report.py"), str(tmp_path / "child.json")],
                            str(tmp_path / "child.log"), {}, str(tmp_path))
    finally:
        worker.close()
    assert rc == 0, (tmp_path / "child.log").read_text()
    worker_peak = json.loads((tmp_path / "worker.json").read_text())["worker_peak_kib"] * 1024
    child = json.loads((tmp_path / "child.json").read_text())
    assert worker_peak > 512 * 2**20
    assert child["since"] == "train_begin"
    for figure in (child["start"], child["train"], child["ru_maxrss_kib"] * 1024):  # inherited, it would be >= peak
        assert figure < worker_peak - 256 * 2**20, (figure, worker_peak)


# ------------------------------------------------------------------------------------------- in a sweep
def test_a_crashing_run_is_a_failed_run_and_the_sweep_goes_on(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _use_fake(monkeypatch, _fake(tmp_path))
    log = io.StringIO()
    counts = run_sweep(_sweep(tmp_path, ("boom", "abort", "adamw")), stream=log)
    assert counts == {"failed": 2, "completed": 1}
    out = tmp_path / "out"
    ends = {r["run_id"]: r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "end"}
    assert {r["launched_via"] for r in ends.values()} == {"warm_worker"}
    assert ends["boom__tiny__s0"]["returncode"] == 1 and "RuntimeError: boom at step 0" in ends["boom__tiny__s0"][
        "error"]
    assert ends["abort__tiny__s0"]["returncode"] == -signal.SIGABRT
    assert "killed by signal 6" in ends["abort__tiny__s0"]["error"]
    assert ends["adamw__tiny__s0"]["status"] == "completed"
    marker = f"marker {out / 'runs' / 'adamw__tiny__s0'}"  # RUN_DIR_ENV reached the forked run
    assert marker in (out / "runs" / "adamw__tiny__s0" / "stdout.log").read_text()
    assert "warm worker ready" in log.getvalue()


def test_a_run_past_the_timeout_is_stopped_and_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_fake(monkeypatch, _fake(tmp_path))
    path = _sweep(tmp_path, ("adamw", "lion"), env={"FAKE_SLEEP": "300"}, timeout_s=2, progress_interval_s=1)
    assert run_sweep(path, stream=io.StringIO()) == {"failed": 2}
    rows = read_state(tmp_path / "out" / "sweep_state.jsonl")
    ends = [r for r in rows if r["event"] == "end"]
    assert [r["returncode"] for r in ends] == [-9, -9] and all("timed out after 2 s" in r["error"] for r in ends)
    assert all(process_gone(r["pid"]) for r in rows if r["event"] == "start")


def test_a_refusing_worker_falls_back_to_a_subprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threaded = [sys.executable, "-c", "import threading; threading.Thread(target=threading.Event().wait, "
                "daemon=True).start(); from hf_optbench.study.worker import main; main(['--imports', 'json'])"]
    _use_fake(monkeypatch, _fake(tmp_path), threaded)
    log = io.StringIO()
    assert run_sweep(_sweep(tmp_path, ("adamw", "lion")), stream=log) == {"completed": 2}
    ends = [r for r in read_state(tmp_path / "out" / "sweep_state.jsonl") if r["event"] == "end"]
    assert [r["launched_via"] for r in ends] == ["subprocess", "subprocess"]
    assert "worker runs Python threads" in log.getvalue()


def test_opt_out_keeps_the_plain_subprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_fake(monkeypatch, _fake(tmp_path))
    monkeypatch.setenv("HF_OPTBENCH_WARM_WORKER", "0")
    assert run_sweep(_sweep(tmp_path, ("adamw",)), stream=io.StringIO()) == {"completed": 1}
    ends = [r for r in read_state(tmp_path / "out" / "sweep_state.jsonl") if r["event"] == "end"]
    assert ends[0]["launched_via"] == "subprocess"


DRIVER = textwrap.dedent('''
    import sys
    from pathlib import Path
    from hf_optbench.study import launch, worker_client
    from hf_optbench.cli.sweep import main
    fake, sweep = sys.argv[1], sys.argv[2]
    original = launch.build_command
    launch.build_command = lambda s, r, d, res: [sys.executable, fake, *original(s, r, d, res)[3:]]
    worker_client.WORKER_COMMAND = [sys.executable, "-m", "hf_optbench.study.worker", "--imports", "json"]
    sys.exit(main([sweep]))
''')


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_killing_the_sweep_stops_the_forked_run(tmp_path: Path, how: str) -> None:
    """SIGTERM: the sweep stops the run's tree and exits 130. SIGKILL of the sweep's whole process group: the
    worker (its own session) sees its input close and stops the run; nothing is left running either way."""
    (tmp_path / "driver.py").write_text(DRIVER)
    path = _sweep(tmp_path, ("adamw",), env={"FAKE_SLEEP": "300"})
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(_fake(tmp_path)), str(path)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    started = tmp_path / "out" / "runs" / "adamw__tiny__s0" / "started"
    wait_for(started.is_file, "the run to start", 120)
    run_pid = int(started.read_text())
    state_pid = next(r["pid"] for r in read_state(tmp_path / "out" / "sweep_state.jsonl") if r["event"] == "start")
    assert state_pid == run_pid  # the state file holds the forked run's pid (how a restart finds an orphan)
    worker_pid = psutil.Process(run_pid).ppid()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, proc.stderr.read()
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for(lambda: process_gone(run_pid), "the run to be stopped", 120)
    wait_for(lambda: process_gone(worker_pid), "the worker to exit", 120)
    proc.stderr.close()


# ------------------------------------------------------------------------------------- the real run
def _summary_and_losses(run_dir: Path) -> tuple[dict, list[float]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, [r["loss"] for r in rows if r.get("kind") == "train"]


@pytest.mark.slow
def test_same_seed_same_losses_through_the_worker_and_a_subprocess(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The same python-launcher sweep (one tiny run of hf_optbench.run), through the warm worker and, opted out,
    through `python -m hf_optbench.run`: identical losses at every step, both completed."""
    sweep = {"base": str(REPO / "recipes/quickstart_cpu.yaml"),
             "overrides": {"max_steps": 4, "eval_steps": 2, "block_size": 32, "data_source": "synthetic",
                           "validation_blocks": 8, "synthetic_num_tokens": 16384},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [3]},
             # one intra-op thread (read by torch at the worker's start): two spin for minutes on a loaded 2-core CPU
             "launcher": {"type": "python", "env": {"OMP_NUM_THREADS": "1"}}, "calibration": False}
    results = {}
    for via in ("warm_worker", "subprocess"):
        if via == "subprocess":
            monkeypatch.setenv("HF_OPTBENCH_WARM_WORKER", "0")
        path = tmp_path / f"{via}.yaml"
        path.write_text(yaml.safe_dump({**sweep, "output_dir": str(tmp_path / via)}))
        assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}
        ends = [r for r in read_state(tmp_path / via / "sweep_state.jsonl") if r["event"] == "end"]
        assert ends[0]["launched_via"] == via
        results[via] = _summary_and_losses(tmp_path / via / "runs" / "adamw__tiny__s3")
    (worker_summary, worker_losses), (sub_summary, sub_losses) = results["warm_worker"], results["subprocess"]
    assert len(worker_losses) == 4 and worker_losses == sub_losses
    for key in ("final_train_loss", "final_eval_loss", "optimizer_state_bytes", "num_params"):
        assert worker_summary[key] == sub_summary[key], key
    assert worker_summary["peak_memory_since"] == "train_begin"


@pytest.mark.gpu
def test_a_gpu_machine_keeps_the_plain_subprocess() -> None:
    """fork after CUDA is broken: where a GPU is visible the sweep never forks a run."""
    assert "GPU" in (unavailable_reason({"type": "python", "executor": "local"}) or "")


TUNED_RUN = r'''
import argparse, json, math, os, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--tuned_hparams_file"):
    p.add_argument(k)
p.add_argument("--seed", type=int)
p.add_argument("--learning_rate", type=float)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
print("fake run", a.optimizer, flush=True)
lr = a.learning_rate
if lr is None:
    import yaml
    lr = yaml.safe_load(open(a.tuned_hparams_file))[a.optimizer][a.model_size]["learning_rate"]
best = float(os.environ["FAKE_BEST_LR"])
(out / "summary.json").write_text(json.dumps({
    "status": "completed", "optimizer": a.optimizer, "model_size": a.model_size, "seed": a.seed, "num_params": 1000,
    "steps": 4, "learning_rate": lr, "final_eval_loss": 4.0, "error": None,
    "final_tuning_loss": 3.0 + math.log2(lr / best) ** 2 if a.learning_rate is not None else None,
    "hyperparameter_sources": {"learning_rate": "user"}}))
'''


def test_one_warm_worker_serves_every_round_and_phase_and_one_count_runs_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune, then compare: the best rate sits at the first grid's edge, so the tuner adds a round; the worker the
    first round started forks every run of every round and of the comparison (before: one worker per round, each
    paying the imports again), it ends with the sweep, and the progress count and ETA run on across the phases
    (before: "[sweep 0/6 ...] ... (ETA ?)" again at each round)."""
    from hf_optbench.optim.registry import optimizer_defaults

    fake = tmp_path / "tuned_run.py"
    fake.write_text(TUNED_RUN)
    _use_fake(monkeypatch, fake)
    best = optimizer_defaults("adamw", "tiny")["learning_rate"] * 2
    path = _sweep(tmp_path, ("adamw",), env={"FAKE_BEST_LR": str(best)}, jobs=1)  # as recipes/sweeps/smoke_cpu.yaml
    spec = yaml.safe_load(path.read_text())
    spec["matrix"]["seed"] = [1, 2]
    spec["tune"] = {"lr_multipliers": [0.5, 1, 2], "seed": [0], "confirm_seeds": [], "nonmatrix_multipliers": []}
    path.write_text(yaml.safe_dump(spec))
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 4 + 2}  # x0.5, x1, x2, then x4; two compared seeds
    text = log.getvalue()
    out = tmp_path / "out"
    assert text.count("warm worker ready") == 1, text
    rows = read_state(out / "tuning" / "sweep_state.jsonl") + read_state(out / "sweep_state.jsonl")
    assert {r["launched_via"] for r in rows if r["event"] == "end"} == {"warm_worker"}
    workers = {line.rsplit("[warm worker ", 1)[1].rstrip("]") for log_file in out.glob("**/stdout.log")
               for line in log_file.read_text().splitlines() if "[warm worker " in line}
    assert len(workers) == 1 and all(process_gone(int(pid)) for pid in workers)  # one worker, ended with the sweep
    counts = [line.split("]")[0] for line in text.splitlines() if line.startswith("[sweep ") and "running " in line]
    assert counts[0].startswith("[sweep 0/5 ")  # the first grid (3) and the comparison (2): the whole sweep
    first = text.splitlines()[0]  # the prediction: the runs known then, the worker's start counted in it
    assert first.startswith("[sweep 0/5 ") and "the warm worker's start ~" in first, first
    done = [int(c.split()[1].split("/")[0]) for c in counts]
    assert done == list(range(6)), counts  # 0..5 across the tuning rounds and the comparison: never reset
    assert text.count("ETA ?") == 1  # only before the first run of the sweep
    assert "[sweep 3/6 " in text and "[sweep 4/6 " in text  # the added round grew the whole sweep's total
    assert (out / "worker.log").is_file() and not (out / "tuning" / "worker.log").exists()
