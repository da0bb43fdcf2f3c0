"""Running a sweep's runs as processes on this machine: the command line, the environment, the child process and its
whole tree, the orphans of a killed sweep, and the local executor (one run after another).

Every run gets its own session (``start_new_session``) and an environment marker (:data:`RUN_DIR_ENV`), so that an
interrupted sweep can stop the run's whole tree, and a restarted one can find processes an earlier, SIGKILLed
sweep left behind before it reuses their directory.

With ``launcher.type: python`` the local executor runs each run in a fresh fork of a warm worker that imported
torch/transformers/datasets once (:mod:`hf_optbench.study.worker`), instead of paying the imports per run; same
log, session, pid record, timeout and exit code. A forked run's environment marker is not visible in
``/proc/PID/environ`` (that shows the environment the worker started with), so its orphans are found through the
pid and start time in the state file's start row, which the sweep writes before the child begins, and the worker
stops its child when the sweep's pipe closes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.rundir import FINISHED_STATUSES, append_state, read_summary
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, mapping
from hf_optbench.study.sweep_state import Progress, attempt_number, classify_outcome, end_row
from hf_optbench.study.worker_client import WarmWorker, WorkerUnavailable, unavailable_reason

RUN_DIR_ENV = "HF_OPTBENCH_SWEEP_RUN_DIR"  # marks a run's processes, so a restart finds its orphans


# ---------------------------------------------------------------------------------------------- processes
def kill_tree(pid: int, create_time: float | None = None, grace_s: float = 10.0) -> bool:
    """Terminate a run's process tree (SIGTERM, then SIGKILL). With ``create_time``, only if ``pid`` is still
    the process we started (pids are reused). Returns True when something was killed."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return True


def find_orphans(run_dir: Path) -> list[int]:
    """Processes of an earlier sweep still working in ``run_dir`` (found by the environment marker)."""
    import psutil

    found = []
    target = str(run_dir)
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != os.getuid():
                continue
            if proc.pid != os.getpid() and proc.environ().get(RUN_DIR_ENV) == target:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def build_command(spec: SweepSpec, run: RunSpec, run_dir: Path, resume: bool) -> list[str]:
    """The argv that starts one run."""
    args = list(run.args) + ["--output_dir", str(run_dir)]
    if resume:
        args += ["--resume_from_checkpoint", "true"]
    kind = spec.launcher["type"]
    if kind == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                spec.launcher["accelerate_config"], "-m", "hf_optbench.run", *args]
    if kind == "python":
        return [sys.executable, "-m", "hf_optbench.run", *args]
    prefix = [sys.executable if str(c) == "{python}" else str(c) for c in spec.launcher["command"]]
    return prefix + args


def run_env(spec: SweepSpec, run_dir: Path) -> dict[str, str]:
    """Variables added to the environment where the run starts (a SLURM node keeps its own SLURM_*/CUDA_*)."""
    env = {str(k): str(v) for k, v in mapping(spec.launcher.get("env"), "launcher.env").items()}
    env["PYTHONUNBUFFERED"] = "1"
    env[RUN_DIR_ENV] = str(run_dir)
    return env


def execute(cmd: list[str], log_path: str, env_extra: dict[str, str], cwd: str,
            timeout_s: float | None = None, on_start: Callable[[Any], None] | None = None,
            on_poll: Callable[[], None] | None = None, poll_s: float = 1.0) -> int:
    """Run one command with stdout+stderr appended to ``log_path``; the run gets its own session so that its
    whole tree can be stopped (and so that a terminal's Ctrl-C reaches it only through the sweep).
    Also the function a SLURM job runs on its node (it must be a picklable top-level function)."""
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env_extra}, cwd=cwd,
                                start_new_session=True)
        if on_start:
            on_start(proc)
        started = time.monotonic()
        try:
            while True:
                try:
                    return proc.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    if timeout_s and time.monotonic() - started > timeout_s:
                        kill_tree(proc.pid, grace_s=5)
                        log.write(f"\n===== sweep: timed out after {timeout_s:g} s, killed\n".encode())
                        proc.wait()
                        return -9
                    if on_poll:
                        on_poll()
        except BaseException:
            kill_tree(proc.pid, grace_s=10)  # interrupted sweep: leave no run behind
            raise


def tail(path: Path, nbytes: int = 8000) -> str:
    """The last ``nbytes`` of a log as text ("" when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - nbytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_step(run_dir: Path) -> int | None:
    for line in reversed(tail(run_dir / "metrics.jsonl", 4000).splitlines()):
        try:
            return int(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return None


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------------------------ run directory
def prepare_run_dir(spec: SweepSpec, run: RunSpec, state: Path, rows: list[dict[str, Any]],
                    progress: Progress) -> bool:
    """Make ``run_dir`` ready for a new attempt; returns whether to resume from a checkpoint.
    Orphaned processes of a killed sweep are stopped first; a directory is moved aside, never deleted."""
    run_dir = spec.run_dir(run)
    for row in reversed(rows):  # the last start of this run, if it has no end
        if row.get("run_id") == run.run_id and row.get("event") in ("start", "end"):
            if row["event"] == "start" and row.get("pid") and row.get("host") == socket.gethostname():
                if kill_tree(int(row["pid"]), row.get("pid_create_time")):
                    progress.say(f"stopped a process of an earlier sweep still running {run.run_id}")
            break
    for pid in find_orphans(run_dir):
        kill_tree(pid)
    if not run_dir.exists():
        return False
    status = (read_summary(run_dir) or {}).get("status")
    if any(run_dir.glob("checkpoint-*")) and status not in FINISHED_STATUSES:
        if status is not None:  # a failed attempt's summary must not mark the resumed run as finished
            n = 1
            while (old := run_dir / f"summary.{status}-{n}.json").exists():
                n += 1
            (run_dir / "summary.json").rename(old)
        return True
    n = 1
    while (aside := run_dir.with_name(f"{run.run_id}.incomplete-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    append_state(state, {"event": "moved", "run_id": run.run_id, "from": str(run_dir), "to": str(aside),
                         "time": time.time()})
    return False


# ------------------------------------------------------------------------------------------ local executor
WORKER_LOG = "worker.log"  # the warm worker's own stderr, in the sweep directory


def start_worker(spec: SweepSpec, progress: Progress) -> WarmWorker | None:
    """The warm worker for this sweep's runs, or None (plain subprocesses) with the reason said once."""
    reason = unavailable_reason(spec.launcher)
    if reason is None:
        env = {**os.environ, **{str(k): str(v) for k, v in mapping(spec.launcher.get("env"), "launcher.env").items()},
               "PYTHONUNBUFFERED": "1"}
        try:
            worker = WarmWorker.start(env, os.getcwd(), str(spec.output_dir / WORKER_LOG), kill_tree)
            progress.say(f"warm worker ready (pid {worker.proc.pid}, imports {worker.info.get('import_s')} s): "
                         "each run is a fresh fork of it")
            return worker
        except WorkerUnavailable as exc:
            reason = str(exc)
    if spec.launcher.get("type") == "python":
        progress.say(f"each run starts its own interpreter: {reason}")
    return None


def run_local(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]], progress: Progress,
              after_each: Callable[[], None] = lambda: None) -> None:
    """The runs one after another on this machine; ``after_each`` (the sweep's summary.csv refresh) between them."""
    worker = start_worker(spec, progress) if todo else None
    try:
        for i, run in enumerate(todo):
            run_one_local(spec, run, todo[i:], state, rows, progress, worker)
            after_each()
    finally:
        if worker is not None:
            worker.close()


def _launch(worker: WarmWorker | None, cmd: list[str], log: str, env: dict[str, str], timeout_s: float | None,
            on_start: Callable[[Any], None], on_poll: Callable[[], None], progress: Progress) -> tuple[int, str]:
    """Run ``cmd`` through the warm worker when there is one (else, or when it gives up, as a subprocess);
    returns (exit code, "warm_worker" or "subprocess")."""
    if worker is not None and worker.alive:
        try:
            return worker.execute(cmd, log, env, os.getcwd(), timeout_s, on_start, on_poll), "warm_worker"
        except WorkerUnavailable as exc:
            progress.say(f"warm worker unavailable ({exc}): runs start their own interpreter from now on")
    return execute(cmd, log, env, os.getcwd(), timeout_s, on_start, on_poll), "subprocess"


def run_one_local(spec: SweepSpec, run: RunSpec, pending: Sequence[RunSpec], state: Path,
                  rows: list[dict[str, Any]], progress: Progress, worker: WarmWorker | None = None) -> None:
    """One attempt of one run in a child process (a fork of ``worker`` when given), with its start and end
    recorded in the state file."""
    timeout_s = spec.launcher.get("timeout_s")
    interval = float(spec.launcher.get("progress_interval_s") or 60)
    resume = prepare_run_dir(spec, run, state, rows, progress)
    run_dir = spec.run_dir(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = build_command(spec, run, run_dir, resume)
    attempt = attempt_number(rows, run.run_id)
    progress.started(run, pending, " (resuming from its last checkpoint)" if resume else "")
    t0 = time.monotonic()
    cpu0 = _children_cpu_s()
    last_note = [t0]

    def on_start(proc: Any) -> None:
        import psutil

        row = {"event": "start", "run_id": run.run_id, "attempt": attempt, "pid": proc.pid,
               "pid_create_time": psutil.Process(proc.pid).create_time(), "host": socket.gethostname(),
               "command": cmd, "resume": resume, "time": time.time()}
        append_state(state, row)
        rows.append(row)

    def on_poll() -> None:
        now = time.monotonic()
        if now - last_note[0] >= interval:
            last_note[0] = now
            step = _last_step(run_dir)
            of = f"/{run.max_steps}" if run.max_steps else ""
            progress.say(f"  {run.run_id}: step {step if step is not None else '?'}{of}, {now - t0:.0f} s")

    rc, via = _launch(worker, cmd, str(run_dir / "stdout.log"), {**run_env(spec, run_dir), **run.env}, timeout_s, on_start,
                      on_poll, progress)
    status, error = classify_outcome(run_dir, rc, tail(run_dir / "stdout.log"))
    if timeout_s and rc == -9 and status == "failed":
        error = f"timed out after {timeout_s} s (launcher.timeout_s). " + (error or "")
    row = end_row(run, attempt, status, error, rc, time.monotonic() - t0, run_dir)
    # user + sys of the run's processes: wait4 of the forked child in the worker, else this process's children
    cpu_s = worker.last_cpu_s if via == "warm_worker" and worker is not None else _children_cpu_s() - cpu0
    row["cpu_s"] = round(cpu_s, 2) if cpu_s is not None else None
    row["launched_via"] = via
    append_state(state, row)
    rows.append(row)
    loss = row.get("final_eval_loss")
    progress.ended(run, status, time.monotonic() - t0,
                   f", final eval loss {loss:.4f}" if isinstance(loss, (int, float)) else
                   (f": {error.splitlines()[0][:160]}" if error else ""))
