"""Running a sweep's runs as processes on this machine: the command line, the environment, the child process and its
whole tree, the orphans of a killed sweep, and the local executor (up to ``launcher.jobs`` runs at once, each in a
slot of its own cores or GPU: :func:`hf_optbench.study.sweep_state.plan_slots`).

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
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.publish.redact import redact_argv
from hf_optbench.rundir import (
    FINISHED_STATUSES,
    METRICS_FILE,
    STDOUT_FILE,
    SUMMARY_FILE,
    append_state,
    read_summary,
)
from hf_optbench.study.processes import (
    RUN_DIR_ENV,
    STOP_GRACE_S,
    execute,
    kill_now,
    kill_tree,
    marked_processes,
    stop_trees,
    tail,
    terminate_tree,
)
from hf_optbench.study.stopping import IN_FLIGHT
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, mapping
from hf_optbench.study.sweep_state import (
    Flight,
    Progress,
    Slot,
    SweepStopping,
    attempt_number,
    check_run_dir_free,
    classify_outcome,
    end_row,
    plan_slots,
    started_here,
    sweep_identity,
)
from hf_optbench.study.worker_client import WarmWorker, WorkerPool, WorkerUnavailable, unavailable_reason


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


def _last_step(run_dir: Path) -> int | None:
    for line in reversed(tail(run_dir / METRICS_FILE, 4000).splitlines()):
        try:
            return int(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return None


# ------------------------------------------------------------------------------------------ run directory
def stop_earlier(spec: SweepSpec, runs: Sequence[RunSpec], rows: list[dict[str, Any]], progress: Progress) -> None:
    """Stop what an earlier, killed sweep left running for ``runs``: the pid of a run's last start row without an
    end (checked against its start time: pids are reused), and every process carrying a run's directory marker.
    A parallel sweep calls it for all its runs before starting any: a kill leaves every run that was in flight."""
    marked, me = marked_processes(), sweep_identity(spec.output_dir)
    for run in runs:
        for row in reversed(rows):  # the last start of this run, if it has no end
            if row.get("run_id") == run.run_id and row.get("event") in ("start", "end"):
                if row["event"] == "start" and row.get("pid") and row.get("host") == socket.gethostname():
                    if started_here(row, me) is False:  # a copied (or moved) directory: another sweep's process
                        progress.say(f"{run.run_id}: process {row['pid']} was started by the sweep in "
                                     f"'{row['sweep_dir']}', not this one: left alone")
                    elif kill_tree(int(row["pid"]), row.get("pid_create_time")):
                        progress.say(f"stopped a process of an earlier sweep still running {run.run_id}")
                break
        for pid in marked.get(str(spec.run_dir(run)), []):
            kill_tree(pid)


def _resumable(run_dir: Path) -> bool:
    """Whether ``--resume_from_checkpoint true`` would find a checkpoint to load in ``run_dir``: a complete one (its
    trainer_state.json, which the Trainer writes last) that is readable. A run stopped while saving its first
    checkpoint (a sweep interrupted then) keeps only a torn one: resumed, the run would refuse and count as failed,
    so it starts over from step 0 instead (its directory moved aside, nothing deleted)."""
    if not any(run_dir.glob("checkpoint-*")):
        return False
    # imports transformers: only here, where a checkpoint exists
    from hf_optbench.run.identity import newest_loadable_checkpoint

    return newest_loadable_checkpoint(run_dir) is not None


def prepare_run_dir(spec: SweepSpec, run: RunSpec, state: Path, rows: list[dict[str, Any]],
                    progress: Progress) -> bool:
    """Make ``run_dir`` ready for a new attempt; returns whether to resume from a checkpoint.
    Orphaned processes of a killed sweep are stopped first; a directory is moved aside, never deleted."""
    run_dir = spec.run_dir(run)
    stop_earlier(spec, [run], rows, progress)
    if not run_dir.exists():
        return False
    check_run_dir_free(run_dir, run.run_id)  # a live process of someone else's: never moved, never written into
    status = (read_summary(run_dir) or {}).get("status")
    if status in FINISHED_STATUSES:  # never renamed away as "incomplete": a finished result stays where it is
        raise OptBenchError(f"run {run.run_id}: '{run_dir}' already holds a finished run ({status}), which the sweep "
                            "never moves aside or overwrites. Give the sweep another output_dir, or move that "
                            "directory away yourself.")
    if status not in FINISHED_STATUSES and _resumable(run_dir):
        if status is not None:  # a failed attempt's summary must not mark the resumed run as finished
            n = 1
            while (old := run_dir / f"summary.{status}-{n}.json").exists():
                n += 1
            (run_dir / SUMMARY_FILE).rename(old)
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


def start_worker(spec: SweepSpec, progress: Progress, pool: WorkerPool | None = None,
                 flight: Flight | None = None) -> WarmWorker | None:
    """The warm worker for this sweep's runs, or None (plain subprocesses) with the reason said once. With a
    ``pool`` (a whole sweep), an idle worker of an earlier phase or round is taken when one fits. A worker killed
    during its imports because ``flight`` is stopping is no reason to say anything."""
    reason = unavailable_reason(spec.launcher)
    if reason is None:
        env = {**os.environ, **{str(k): str(v) for k, v in mapping(spec.launcher.get("env"), "launcher.env").items()},
               "PYTHONUNBUFFERED": "1"}
        if pool is not None and (worker := pool.take(env, os.getcwd())) is not None:
            return worker
        log = pool.log_path if pool is not None else str(spec.output_dir / WORKER_LOG)
        try:
            worker = WarmWorker.start(env, os.getcwd(), log, kill_tree)
            progress.say(f"warm worker ready (pid {worker.proc.pid}, imports {worker.info.get('import_s')} s): "
                         "each run is a fresh fork of it" + (", for the whole sweep" if pool is not None else ""))
            return worker
        except WorkerUnavailable as exc:
            reason = str(exc)
    if spec.launcher.get("type") == "python" and not (flight is not None and flight.stopping):
        progress.say(f"each run starts its own interpreter: {reason}")
    return None


def _slot_loop(spec: SweepSpec, slot: Slot, queue: deque[RunSpec], state: Path, rows: list[dict[str, Any]],
               progress: Progress, flight: Flight, after_each: Callable[[], None],
               pool: WorkerPool | None = None) -> None:
    """One slot's runs, one after another, taken from the queue the slots share. The calling thread is pinned to
    the slot's cores first, so its warm worker, the worker's forks and the run subprocesses inherit them (a worker
    taken from ``pool`` was started on the same cores). The worker goes back to ``pool`` (when given) for the next
    phase, else it ends with the slot."""
    slot.pin()
    worker = start_worker(spec, progress, pool, flight)
    try:
        while True:
            with flight.lock:
                if flight.stopping or not queue:
                    return
                run = queue.popleft()
                pending = [run, *queue]
            run_one_local(spec, run, pending, state, rows, progress, worker, slot, flight)
            if flight.stopping:  # a stopped run changes no record: leave summary.csv to the next invocation
                return
            with flight.refresh_lock:
                after_each()
    finally:
        if worker is not None and pool is not None:
            pool.give(worker)
        elif worker is not None:
            worker.close()


def _run_slots(spec: SweepSpec, slots: list[Slot], queue: deque[RunSpec], state: Path, rows: list[dict[str, Any]],
               progress: Progress, flight: Flight, after_each: Callable[[], None],
               pool: WorkerPool | None = None) -> None:
    """Each slot in a thread of its own; this (the main) thread waits, and it is where Ctrl-C and SIGTERM arrive:
    then, or when a slot fails, every run in flight is stopped, the slots end, and the exception goes on up."""
    def guarded(slot: Slot) -> None:
        try:
            _slot_loop(spec, slot, queue, state, rows, progress, flight, after_each, pool)
        except SweepStopping:
            pass
        except BaseException as exc:  # handed to the main thread, which re-raises it
            flight.stop(exc)

    threads = [threading.Thread(target=guarded, args=(slot,), name=f"sweep-slot-{slot.index}", daemon=True)
               for slot in slots]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads) and flight.error is None:
            time.sleep(0.1)
    except BaseException:
        flight.stop()
        raise
    finally:
        if flight.stopping:
            _stop_slots(threads, flight)
        else:
            for thread in threads:
                thread.join()
    if flight.error is not None:
        raise flight.error


def _stop_slots(threads: list[threading.Thread], flight: Flight) -> None:
    """The slots of a stopping sweep, ended within seconds: every run still in flight (Flight.stop sent SIGTERM to
    each, not waiting) waited for together, SIGKILL after the grace; a slot still starting its warm worker (its
    imports take seconds) has that worker killed. A slot thread stuck past that is a daemon, left behind: the
    sweep must not hang on it (docs/RELIABILITY.md: stopped within 5 s)."""
    stop_trees(list(flight.pids.values()))
    deadline = time.monotonic() + 0.5
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        for pid in dict(IN_FLIGHT.workers):
            kill_now(pid)
        deadline = time.monotonic() + STOP_GRACE_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def run_local(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]], progress: Progress,
              after_each: Callable[[], None] = lambda: None, pool: WorkerPool | None = None) -> None:
    """The runs on this machine, up to ``launcher.jobs`` at once (:func:`plan_slots`: each slot pinned to its own
    cores or GPU); ``after_each`` (the sweep's summary.csv refresh) after each run. One slot runs in this thread,
    as a sequential sweep always has. What a killed sweep left running is stopped before anything starts. ``pool``:
    the sweep's warm workers, kept across its phases (else each call starts and ends its own)."""
    if not todo:
        return
    slots = plan_slots(spec.launcher, len(todo))
    progress.jobs = len(slots)
    stop_earlier(spec, todo, rows, progress)
    for run in todo:  # before any run starts: a directory another live process holds stops the sweep here
        check_run_dir_free(spec.run_dir(run), run.run_id)
    queue, flight = deque(todo), Flight(terminate_tree)  # SIGTERM to all at once; _stop_slots waits for them
    if len(slots) == 1:
        _slot_loop(spec, slots[0], queue, state, rows, progress, flight, after_each, pool)
        return
    progress.say(f"{len(slots)} runs at once:" + ",".join(slot.describe() for slot in slots))
    _run_slots(spec, slots, queue, state, rows, progress, flight, after_each, pool)


def _launch(worker: WarmWorker | None, cmd: list[str], log: str, env: dict[str, str], timeout_s: float | None,
            on_start: Callable[[Any], None], on_poll: Callable[[], None], progress: Progress,
            on_exit: Callable[[float | None], None]) -> tuple[int, str]:
    """Run ``cmd`` through the warm worker when there is one (else, or when it gives up, as a subprocess);
    returns (exit code, "warm_worker" or "subprocess")."""
    if worker is not None and worker.alive:
        try:
            return worker.execute(cmd, log, env, os.getcwd(), timeout_s, on_start, on_poll), "warm_worker"
        except WorkerUnavailable as exc:
            progress.say(f"warm worker unavailable ({exc}): runs start their own interpreter from now on")
    return execute(cmd, log, env, os.getcwd(), timeout_s, on_start, on_poll, on_exit=on_exit), "subprocess"


def run_one_local(spec: SweepSpec, run: RunSpec, pending: Sequence[RunSpec], state: Path,
                  rows: list[dict[str, Any]], progress: Progress, worker: WarmWorker | None = None,
                  slot: Slot | None = None, flight: Flight | None = None) -> None:
    """One attempt of one run in a child process (a fork of ``worker`` when given) in ``slot``, with its start and
    end recorded in the state file (no end when ``flight`` stopped it: a restart runs it again)."""
    slot = slot or Slot()
    timeout_s = spec.launcher.get("timeout_s")
    interval = float(spec.launcher.get("progress_interval_s") or 60)
    resume = prepare_run_dir(spec, run, state, rows, progress)
    run_dir = spec.run_dir(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = build_command(spec, run, run_dir, resume)
    attempt = attempt_number(rows, run.run_id)
    progress.started(run, pending, (" (resuming from its last checkpoint)" if resume else "") + slot.describe())
    t0 = time.monotonic()
    last_note, cpu = [t0], [None]

    def on_start(proc: Any) -> None:
        import psutil

        row = {"event": "start", "run_id": run.run_id, "attempt": attempt, "pid": proc.pid,
               "pid_create_time": psutil.Process(proc.pid).create_time(), "command": redact_argv(cmd), "resume": resume,
               "host": socket.gethostname(), "time": time.time(), **slot.record(), **sweep_identity(spec.output_dir)}
        append_state(state, row)
        rows.append(row)
        IN_FLIGHT.run_started(run.run_id, proc.pid, run_dir)
        if flight is not None:
            flight.started(run.run_id, proc.pid, row["pid_create_time"])

    def on_poll() -> None:
        now = time.monotonic()
        if now - last_note[0] >= interval:
            last_note[0] = now
            step = _last_step(run_dir)
            of = f"/{run.max_steps}" if run.max_steps else ""
            progress.say(f"  {run.run_id}: step {step if step is not None else '?'}{of}, {now - t0:.0f} s")

    env = {**run_env(spec, run_dir), **run.env, **slot.env()}
    try:
        rc, via = _launch(worker, cmd, str(run_dir / STDOUT_FILE), env, timeout_s, on_start, on_poll, progress,
                          on_exit=lambda cpu_s: cpu.__setitem__(0, cpu_s))
    finally:
        IN_FLIGHT.run_ended(run.run_id)
    if flight is not None:
        flight.ended(run.run_id)
        if flight.stopping and (read_summary(run_dir) or {}).get("status") not in FINISHED_STATUSES:
            progress.say(f"{run.run_id}: stopped with the sweep (a restart runs it again)")
            return
    status, error = classify_outcome(run_dir, rc, tail(run_dir / STDOUT_FILE))
    if timeout_s and rc == -9 and status == "failed":
        error = f"timed out after {timeout_s} s (launcher.timeout_s). " + (error or "")
    row = end_row(run, attempt, status, error, rc, time.monotonic() - t0, run_dir)
    # user + sys of the run's own processes: wait4 of that child (in the worker, or here), never a sum over runs
    cpu_s = worker.last_cpu_s if via == "warm_worker" and worker is not None else cpu[0]
    row["cpu_s"] = round(cpu_s, 2) if cpu_s is not None else None
    row["launched_via"] = via
    append_state(state, row)
    rows.append(row)
    loss = row.get("final_eval_loss")
    progress.ended(run, status, time.monotonic() - t0,
                   f", final eval loss {loss:.4f}" if isinstance(loss, (int, float)) else
                   (f": {error.splitlines()[0][:400]}" if error else ""))
