"""The sweep's side of the warm worker (:mod:`hf_optbench.study.worker`): when it may be used, starting it, and
running one run through it with the same contract as :func:`hf_optbench.study.processes.execute` (log appended, the
pid handed to ``on_start`` before the run begins, ``on_poll`` while it runs, a timeout, the child's tree stopped
when the sweep is interrupted, the exit code returned).

Used for ``launcher.type: python`` on the local executor only. The plain subprocess stays for accelerate, command
(torchrun, ...) and SLURM launches, on a machine where a GPU is visible (fork and CUDA do not mix), and when turned
off: ``HF_OPTBENCH_WARM_WORKER=0`` in the environment (or in ``launcher.env``), or ``launcher.warm_worker: false``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hf_optbench.machine import gpu_visible
from hf_optbench.publish.redact import redact_argv
from hf_optbench.study.stopping import IN_FLIGHT
from hf_optbench.study.sweep_state import launcher_environ
from hf_optbench.study.worker import Channel

WARM_WORKER_ENV = "HF_OPTBENCH_WARM_WORKER"  # "0"/"false"/"no"/"off": every run in a plain subprocess instead
WORKER_COMMAND = [sys.executable, "-m", "hf_optbench.study.worker"]  # how the sweep starts the worker
_OFF = ("0", "false", "no", "off")


class WorkerUnavailable(Exception):
    """The warm worker cannot run this (or any further) run: the caller starts a plain subprocess instead."""


def unavailable_reason(launcher: dict[str, Any], environ: dict[str, str] | None = None) -> str | None:
    """Why a sweep's runs must start as plain subprocesses (None: the warm worker may run them)."""
    env = launcher_environ(launcher, environ)
    if launcher.get("type") != "python":
        return f"launcher type {launcher.get('type')} (the warm worker serves type python only)"
    if launcher.get("executor", "local") != "local":
        return f"executor {launcher.get('executor')}"
    if launcher.get("warm_worker") is False or env.get(WARM_WORKER_ENV, "").strip().lower() in _OFF:
        return f"turned off (launcher.warm_worker false or {WARM_WORKER_ENV}=0)"
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return "needs Linux (os.fork and /proc/self/clear_refs)"
    if gpu_visible(env):
        return "a GPU is visible (CUDA does not survive fork)"
    return None


def fork_target(cmd: list[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, module or script, argv)`` for ``[python, -m, MODULE, ...]`` or ``[python, SCRIPT, ...]`` run by this
    interpreter; None for any other command (interpreter flags, another executable)."""
    if len(cmd) < 2 or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    if cmd[1] == "-m" and len(cmd) >= 3:
        return "module", cmd[2], list(cmd[3:])
    if not cmd[1].startswith("-"):
        return "path", cmd[1], list(cmd[2:])
    return None


@dataclass
class StartedChild:
    """What ``on_start`` receives (the subprocess path hands it a Popen): the run's pid."""

    pid: int


def _note(log_path: str, text: str) -> None:
    with open(log_path, "ab") as log:
        log.write(f"\n===== sweep: {text}\n".encode())


class WarmWorker:
    """One worker process for a sweep; runs are sent to it one at a time."""

    def __init__(self, proc: subprocess.Popen, kill_tree: Callable[..., Any]) -> None:
        self.proc, self.kill_tree = proc, kill_tree
        self.chan = Channel(proc.stdout.fileno(), proc.stdin.fileno())  # type: ignore[union-attr]
        self.info: dict[str, Any] = {}
        self.last_cpu_s: float | None = None
        self.key: tuple[Any, ...] = ()  # what it was started with (WorkerPool.key)

    @classmethod
    def start(cls, env: dict[str, str], cwd: str, stderr_path: str, kill_tree: Callable[..., Any],
              command: list[str] | None = None, ready_timeout_s: float = 900.0) -> WarmWorker:
        """Start the worker and wait until its imports are done. Raises WorkerUnavailable when it cannot serve
        (its imports failed: see ``stderr_path``; no way to reset the peak-RSS counter)."""
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen(command or WORKER_COMMAND,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd,
                                    start_new_session=True)  # terminal signals reach the sweep, which stops runs
        IN_FLIGHT.worker_started(proc.pid)  # a second Ctrl-C kills it at once, imports or not
        worker = cls(proc, kill_tree)
        worker.key = WorkerPool.key(env, cwd)
        try:
            msg = worker.chan.recv(ready_timeout_s)
            if not msg or msg.get("event") != "ready":
                raise WorkerUnavailable(f"the warm worker was not ready after {ready_timeout_s:g} s")
            if not msg.get("clear_refs"):
                raise WorkerUnavailable("the warm worker cannot reset the peak-RSS counter (/proc/self/clear_refs), "
                                        "so a forked run's peak memory would not be its own")
            worker.info = msg
            return worker
        except EOFError:
            worker.close()
            raise WorkerUnavailable(f"the warm worker exited during its imports (see {stderr_path})") from None
        except BaseException:
            worker.close()
            raise

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self.chan.eof

    def _send(self, msg: dict[str, Any]) -> None:
        try:
            self.chan.send(msg)
        except (BrokenPipeError, ValueError):
            raise EOFError("the warm worker has exited") from None

    def execute(self, cmd: list[str], log_path: str, env_extra: dict[str, str], cwd: str,
                timeout_s: float | None = None, on_start: Callable[[Any], None] | None = None,
                on_poll: Callable[[], None] | None = None, poll_s: float = 1.0, *, stdout_path: str | None = None,
                environ: dict[str, str] | None = None) -> int:
        """Run ``cmd`` (a ``python -m``/``python SCRIPT`` command) in a fresh child of the worker; see
        :func:`hf_optbench.study.processes.execute`. ``stdout_path``: the child's stdout there, its stderr in
        ``log_path``; ``environ``: its whole environment (``env_extra`` added), in place of the worker's. Raises
        WorkerUnavailable before anything started."""
        target = fork_target(cmd)
        if target is None or not self.alive:
            raise WorkerUnavailable("the warm worker is gone" if target else f"not a python command: {cmd[:3]}")
        with open(log_path, "ab") as log:
            log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(redact_argv(cmd))} [warm worker "
                      f"{self.proc.pid}]\n".encode())
        try:
            self._send({"kind": target[0], "target": target[1], "argv": target[2], "log": log_path,
                        "env": env_extra, "cwd": cwd, **({"stdout": stdout_path} if stdout_path else {}),
                        **({"environ": environ} if environ is not None else {})})
            reply = self.chan.recv()
        except EOFError:
            self.close()
            raise WorkerUnavailable("the warm worker has exited") from None
        if not reply or reply.get("event") != "started":
            self.close()
            raise WorkerUnavailable(f"the warm worker refused: {(reply or {}).get('reason')}")
        return self._follow(int(reply["pid"]), log_path, timeout_s, on_start, on_poll, poll_s)

    def _follow(self, pid: int, log_path: str, timeout_s: float | None, on_start: Callable[[Any], None] | None,
                on_poll: Callable[[], None] | None, poll_s: float) -> int:
        """Start the child (after ``on_start`` recorded it) and wait for its end, with the timeout and polling."""
        self.last_cpu_s, killed, started = None, False, time.monotonic()
        try:
            if on_start:
                on_start(StartedChild(pid))
            self._send({"go": True})
            while True:
                msg = self.chan.recv(poll_s)
                if msg is not None and msg.get("event") == "ended":
                    self.last_cpu_s = msg.get("cpu_s")
                    return -9 if killed else int(msg["returncode"])
                if msg is None and timeout_s and not killed and time.monotonic() - started > timeout_s:
                    self.kill_tree(pid, grace_s=5)
                    _note(log_path, f"timed out after {timeout_s:g} s, killed")
                    killed = True
                elif msg is None and on_poll:
                    on_poll()
        except EOFError:  # the worker died mid-run (OOM killer, a kill): the run is lost, the sweep goes on
            self.kill_tree(pid, grace_s=5)
            _note(log_path, f"the warm worker (pid {self.proc.pid}) died during the run; run stopped")
            self.close()
            return -9
        except BaseException:
            self.kill_tree(pid)  # interrupted sweep: leave no run behind
            raise

    def close(self, timeout_s: float = 30.0) -> None:
        """End the worker: end of its input makes it exit (and stop a child still running). A worker still doing
        its imports reads no input: it is killed instead of waited for (an interrupted sweep stops in seconds)."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe:
                    pipe.close()
            except OSError:
                pass
        self.chan.eof = True
        try:
            if not self.info:
                raise subprocess.TimeoutExpired(self.proc.args, 0)
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        IN_FLIGHT.worker_ended(self.proc.pid)


class WorkerPool:
    """The warm workers of one whole sweep: a slot takes a worker started with the same environment, directory and
    cores when one is idle, and gives it back after its runs, so the tuning rounds and the comparison all fork from
    the worker the first round started. Why: each round used to start (and pay the imports of) its own worker, six
    times in the smoke sweep; a worker holds nothing of a run (each run is a fresh fork of it), so one
    that served a round serves the next the same. ``close`` ends every worker (``with WorkerPool(...) as pool``)."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path  # every worker's stderr, in the sweep's top directory
        self._idle: dict[tuple[Any, ...], list[WarmWorker]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(env: dict[str, str], cwd: str) -> tuple[Any, ...]:
        """What a worker was started with: environment, directory and the cores of the thread that started it
        (a fork inherits them, and the torch thread count a fresh process there would take: a worker of a slot
        pinned to one core cannot serve an unpinned run). A sweep whose phases run at the same number of runs at
        once (``jobs: 1``; or every round with at least ``jobs`` runs) keeps its first workers to the end."""
        cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        return tuple(sorted(env.items())), cwd, cpus

    def take(self, env: dict[str, str], cwd: str) -> WarmWorker | None:
        """An idle, live worker started with ``env`` and ``cwd`` on this thread's cores, or None."""
        with self._lock:
            idle = self._idle.get(self.key(env, cwd), [])
            while idle:
                worker = idle.pop()
                if worker.alive:
                    return worker
                worker.close()
        return None

    def give(self, worker: WarmWorker) -> None:
        """Back into the pool; a worker that died is closed instead."""
        if not worker.alive:
            worker.close()
            return
        with self._lock:
            self._idle.setdefault(worker.key, []).append(worker)

    def close(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            workers = [w for idle in self._idle.values() for w in idle]
            self._idle.clear()
        for worker in workers:
            worker.close(timeout_s)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # an interrupted sweep kills its idle workers rather than wait for their exit: a worker holds nothing of a
        # run, and an interpreter with torch and transformers loaded takes 5-6 s to tear down on a busy 2-core machine
        self.close(30.0 if exc_type is None else 0.0)
