"""One run's process and its tree: start it in its own session with its output appended to a log, wait and reap it
(with its own CPU seconds), stop the whole tree, find the processes a killed sweep left behind (they carry
:data:`RUN_DIR_ENV`), and read a log's tail. The sweep executors (:mod:`hf_optbench.study.launch`, the SLURM one)
build on these; a SLURM job runs :func:`execute` on its node.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_optbench.publish.redact import redact_argv

RUN_DIR_ENV = "HF_OPTBENCH_SWEEP_RUN_DIR"  # marks a run's processes, so a restart finds its orphans


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
