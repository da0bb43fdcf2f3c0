"""Stopping a sweep when asked: SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed), the same way.

The first signal unwinds the sweep (a ``KeyboardInterrupt`` in its main thread): every run in flight is stopped
(SIGTERM to its process tree and session, SIGKILL after :data:`~hf_optbench.study.processes.STOP_GRACE_S`), gets
no end row in ``sweep_state.jsonl`` and so runs again when the same command runs again (from its last checkpoint,
or from step 0 when it kept none: ``launch.prepare_run_dir``); one line says which runs those are. Under the SLURM
executor the sweep cancels its pending jobs and leaves the running ones running (:mod:`hf_optbench.study.slurm`):
the line names those instead. A second signal stops at once: SIGKILL to every run's and warm worker's session, one
line, exit 130.

Why the handlers are installed whatever was there before: a sweep started in the background of a script (``cmd &``
in a shell without job control) inherits SIGINT *ignored*, so Python installs no handler of its own, and
``kill -INT`` used to leave the sweep running every run to the end and exit 0. Runs and warm workers live in
sessions of their own (a terminal's Ctrl-C reaches only the sweep), so the sweep stops them itself: :data:`IN_FLIGHT`
knows their process ids.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hf_optbench.rundir import TRAINER_STATE_FILE
from hf_optbench.study.processes import kill_now

# SIGHUP too: a closed terminal or a dropped ssh session ended the sweep with exit 129, no line, and the
# calibration's temporary folder left behind; now it unwinds like Ctrl-C (its temporary folders removed on the way).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


class InFlight:
    """The runs and warm workers this process started and has not seen end, by process id (each leads a session of
    its own). Read by a signal handler, which runs in the main thread between two bytecodes and may interrupt a
    writer: it only copies the dicts (one C call under the GIL), never takes the lock."""

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, Path]] = {}  # run id -> (pid, run directory)
        self.workers: dict[int, str] = {}  # pid -> what it is
        # run id -> SLURM job id: jobs an interrupted sweep left running on the cluster (study.slurm), for its last line
        self.left_running: dict[str, str] = {}
        self._lock = threading.Lock()

    def run_started(self, run_id: str, pid: int, run_dir: Path) -> None:
        with self._lock:
            self.runs = {**self.runs, run_id: (pid, Path(run_dir))}

    def run_ended(self, run_id: str) -> None:
        with self._lock:
            self.runs = {k: v for k, v in self.runs.items() if k != run_id}

    def worker_started(self, pid: int) -> None:
        with self._lock:
            self.workers = {**self.workers, pid: "warm worker"}

    def worker_ended(self, pid: int) -> None:
        with self._lock:
            self.workers = {k: v for k, v in self.workers.items() if k != pid}


IN_FLIGHT = InFlight()


def _resume_point(run_dir: Path) -> str:
    """Where a stopped run starts again: its newest complete checkpoint (its trainer_state.json written: the Trainer
    writes it last; one torn by the stop is not), or step 0. Read from the files alone: a signal handler's line
    must not wait on an import."""
    steps = []
    for path in run_dir.glob("checkpoint-*"):
        try:
            if (path / TRAINER_STATE_FILE).is_file():
                steps.append(int(path.name.split("-", 1)[1]))
        except ValueError:
            continue
    return f"from checkpoint-{max(steps)}" if steps else "from step 0"


def rerun_line(signame: str, stopped: dict[str, tuple[int, Path]], seconds: float | None = None,
               left: dict[str, str] | None = None) -> str:
    """The one line an interrupted sweep ends with: which runs were stopped in flight and where each restarts, or
    (the SLURM executor) which jobs keep running on the cluster (``left``: run id -> job id)."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    if not stopped and left:
        jobs = ", ".join(f"{run_id} (job {job})" for run_id, job in sorted(left.items()))
        return (f"[sweep] stopped on {signame}{took}: {len(left)} SLURM job(s) keep running, {jobs}; start the same "
                "command again to re-attach to them and run what is not finished")
    if not stopped:
        return (f"[sweep] stopped on {signame}{took}, no run was in flight: start the same command again to run "
                "what is not finished")
    runs = ", ".join(f"{run_id} ({_resume_point(run_dir)})" for run_id, (_pid, run_dir) in sorted(stopped.items()))
    n = len(stopped)
    return (f"[sweep] stopped on {signame}{took}: {n} run{'s' if n > 1 else ''} in flight stopped, {runs}; start the "
            f"same command again to rerun {'them' if n > 1 else 'it'} and the runs not yet started")


def _hard_stop(signame: str, stopped: dict[str, tuple[int, Path]]) -> None:
    """The second signal: SIGKILL to every run's and worker's session, one line, exit 130 (no unwinding)."""
    runs, workers = dict(IN_FLIGHT.runs), dict(IN_FLIGHT.workers)
    for pid, _run_dir in runs.values():
        kill_now(pid)
    for pid in workers:
        kill_now(pid)
    line = rerun_line(signame, {**stopped, **runs}).replace("stopped on", "stopped at once on a second", 1)
    os.write(2, (line + "\n").encode())
    os._exit(130)


class SignalStop:
    """What the first signal found: its name, when it came and the runs then in flight (none yet: no signal)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.t0: float | None = None
        self.runs: dict[str, tuple[int, Path]] = {}

    def handler(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.name is not None:
            _hard_stop(name, self.runs)
        self.name, self.t0, self.runs = name, time.monotonic(), dict(IN_FLIGHT.runs)
        raise KeyboardInterrupt(name)

    @staticmethod
    def exit_now(code: int) -> None:
        """End the process after a signal stopped the sweep: stdio flushed, the interpreter's teardown skipped. Its
        files are all written by then (atomic writes, O_APPEND state rows); the teardown of an interpreter with torch
        and transformers loaded takes 5-6 s on a busy 2-core machine, past the 5 s an interrupted sweep has."""
        import sys

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    def line(self) -> str:
        """The one line to end with (:func:`rerun_line`); a KeyboardInterrupt of other origin counts as SIGINT."""
        if self.name is None:
            return rerun_line("SIGINT", dict(IN_FLIGHT.runs), left=dict(IN_FLIGHT.left_running))
        return rerun_line(self.name, self.runs, time.monotonic() - self.t0 if self.t0 is not None else None,
                          dict(IN_FLIGHT.left_running))


@contextmanager
def stop_on_signals() -> Iterator[SignalStop]:
    """Within the block, SIGINT, SIGTERM and SIGHUP stop the sweep as the module says: the first raises KeyboardInterrupt in
    the main thread (the block's owner prints :meth:`SignalStop.line` and exits 130), a second one kills and exits
    at once. Installed only in the main thread (the only one Python delivers signals to), whatever handler was
    there (an inherited SIG_IGN included); the previous ones are restored after the block."""
    stop = SignalStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, stop.handler) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
