"""One run's process and its tree: start it in its own session with its output appended to a log, wait and reap it
(with its own CPU seconds), stop the whole tree, find the processes a killed sweep left behind (they carry
:data:`RUN_DIR_ENV`), and read a log's tail. The sweep executors (:mod:`hf_optbench.study.launch`, the SLURM one)
build on these; a SLURM job runs :func:`execute` on its node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_optbench.publish.redact import redact_argv

RUN_DIR_ENV = "HF_OPTBENCH_SWEEP_RUN_DIR"  # marks a run's processes, so a restart finds its orphans


# Seconds a stopped run is given to end on SIGTERM before SIGKILL. A run (hf_optbench.run, accelerate launch) keeps
# SIGTERM's default action and ends at once; the grace only covers a launcher of the user's that traps it. An
# interrupted sweep has 5 s to stop (docs/RELIABILITY.md): 3 s of grace leave room for the rest of its unwinding.
STOP_GRACE_S = 3.0


def _tree(pid: int, create_time: float | None) -> list[Any]:
    """The process ``pid`` (when it is still the one started at ``create_time``) and all its descendants."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return []
        return [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal(procs: list[Any], sig: int) -> None:
    """``sig`` to each process, and to the process group each leads (a run's session: what it started and then
    left behind, reparented where ``children`` no longer finds it)."""
    import psutil

    for p in procs:
        try:
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, sig)
            p.send_signal(sig)
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            pass


def _running(procs: list[Any]) -> list[Any]:
    """The processes of ``procs`` still running. A zombie has ended: its parent (the sweep's reaper thread, the
    warm worker, or init) collects it, so it is not waited for (psutil.wait_procs would, for a process that is not
    our child, until its grace ran out)."""
    import psutil

    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def stop_trees(targets: list[tuple[int, float | None]], grace_s: float = STOP_GRACE_S) -> int:
    """Stop several process trees at once: SIGTERM to all of them, then one wait of at most ``grace_s`` for them
    together, then SIGKILL to what is left. ``targets``: (pid, create_time or None: pids are reused, so a pid whose
    process started at another time is left alone). Returns the number of processes signalled."""
    procs = [p for pid, create_time in targets for p in _tree(pid, create_time)]
    _signal(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (alive := _running(procs)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive:
        _signal(alive, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while _running(alive) and time.monotonic() < deadline:
            time.sleep(0.02)
    return len(procs)


def kill_tree(pid: int, create_time: float | None = None, grace_s: float = STOP_GRACE_S) -> bool:
    """Terminate a run's process tree (SIGTERM, then SIGKILL after ``grace_s``). With ``create_time``, only if
    ``pid`` is still the process we started (pids are reused). Returns True when something was killed."""
    return stop_trees([(pid, create_time)], grace_s) > 0


def terminate_tree(pid: int, create_time: float | None = None) -> None:
    """SIGTERM to a run's tree and process group, without waiting (several runs are stopped at once: the caller
    waits for them together with :func:`stop_trees`)."""
    _signal(_tree(pid, create_time), signal.SIGTERM)


def kill_now(pid: int) -> None:
    """SIGKILL to the process group ``pid`` leads (a run's or a warm worker's session), without waiting: the second
    interrupt of a sweep stops everything at once."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def marked_processes() -> dict[str, list[int]]:
    """{run directory: pids} of this user's processes that carry the environment marker (one process-table scan)."""
    import psutil

    found: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != os.getuid():
                continue
            marker = proc.environ().get(RUN_DIR_ENV) if proc.pid != os.getpid() else None
            if marker:
                found.setdefault(marker, []).append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _reap(proc: subprocess.Popen, timeout: float) -> tuple[int, float | None] | None:
    """Wait up to ``timeout`` for ``proc`` to end and reap it with ``wait4``: (exit code as subprocess reports it,
    its user + system CPU seconds), or None while it runs. Why not RUSAGE_CHILDREN: with several runs in flight
    (``launcher.jobs``) that is the sum over all of them. A child reaped elsewhere (kill_tree) has no CPU figure."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            proc.returncode = -9 if proc.returncode is None else proc.returncode
            return proc.returncode, None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def execute(cmd: list[str], log_path: str, env_extra: dict[str, str], cwd: str,
            timeout_s: float | None = None, on_start: Callable[[Any], None] | None = None,
            on_poll: Callable[[], None] | None = None, poll_s: float = 1.0,
            on_exit: Callable[[float | None], None] | None = None) -> int:
    """Run one command with stdout+stderr appended to ``log_path``; the run gets its own session so that its
    whole tree can be stopped (and so that a terminal's Ctrl-C reaches it only through the sweep). ``on_exit``
    receives the process's own CPU seconds. The child inherits the calling thread's CPU affinity (a slot's cores).
    Also the function a SLURM job runs on its node (it must be a picklable top-level function)."""
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(redact_argv(cmd))}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env_extra}, cwd=cwd,
                                start_new_session=True)
        started = time.monotonic()
        try:
            if on_start:
                on_start(proc)
            while (ended := _reap(proc, poll_s)) is None:
                if timeout_s and time.monotonic() - started > timeout_s:
                    kill_tree(proc.pid, grace_s=5)
                    log.write(f"\n===== sweep: timed out after {timeout_s:g} s, killed\n".encode())
                    _reap(proc, 30.0)
                    return -9
                if on_poll:
                    on_poll()
            if on_exit:
                on_exit(ended[1])
            return ended[0]
        except BaseException:
            kill_tree(proc.pid)  # interrupted sweep: leave no run behind
            _reap(proc, 1.0)
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
