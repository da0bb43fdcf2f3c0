"""What one sweep invocation records and shows: its directory lock, each attempt's number and end row, the outcome
of an ended process, progress on the terminal, and, for the local executor, the slots its runs occupy (how many
at once, pinned to which cores or GPU: :func:`plan_slots`) and the runs in flight (:class:`Flight`).

The state file itself (``sweep_state.jsonl``: :func:`~hf_optbench.rundir.append_state`,
:func:`~hf_optbench.rundir.read_state`, :func:`~hf_optbench.rundir.finished_status`) lives in
:mod:`hf_optbench.rundir`, because the report reads it too.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.machine import gpu_visible
from hf_optbench.run.lock import check_not_busy
from hf_optbench.run.summary import CONCURRENT_RUNS_ENV, CPUS_ENV, SLOT_ENV
from hf_optbench.rundir import FINISHED_STATUSES, MANIFEST_FILE, OOM_PATTERN, RUN_LOCK_FILE, read_summary
from hf_optbench.study.budget import world_size
from hf_optbench.study.sweep_spec import RunSpec


@contextmanager
def sweep_lock(output_dir: Path) -> Iterator[None]:
    """One sweep process per directory: an flock, released by the kernel even on SIGKILL."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fh = open(output_dir / "sweep.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise OptBenchError(f"another sweep process ({holder}) is running in '{output_dir}'. Wait for it, or "
                            "stop it, before starting this sweep again.") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    fh.flush()
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


# ------------------------------------------------------------------------------ what belongs to this sweep
def sweep_identity(output_dir: Path) -> dict[str, Any]:
    """Who a start row belongs to: the sweep id in the directory's manifest (``sweep.py`` keeps it across restarts)
    and the directory's resolved path. A copy of a sweep directory carries the id but not the path; a restart of the
    same sweep carries both. Start rows record it, so a restart stops only the processes this directory started."""
    try:
        sid = json.loads((output_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("sweep_id")
    except (OSError, ValueError, AttributeError):
        sid = None
    return {"sweep_id": sid, "sweep_dir": str(output_dir.resolve())}


def started_here(row: dict[str, Any], identity: dict[str, Any]) -> bool | None:
    """Whether a start row was written by this sweep directory's own sweep; None for a row from before sweeps
    recorded their identity (its pid is then trusted as before, with its start time)."""
    if "sweep_dir" not in row:
        return None
    return row.get("sweep_dir") == identity["sweep_dir"] and row.get("sweep_id") == identity["sweep_id"]


def check_run_dir_free(run_dir: Path, run_id: str) -> None:
    """Refuse to move aside or write into a run directory whose run.lock a live process holds. Called once this
    sweep has stopped its own earlier processes: a holder left is someone else's run (a copied sweep's original, a
    run started by hand), and moving its directory would split its results between two places."""
    try:
        check_not_busy(run_dir)
    except OptBenchError:
        try:
            holder = (run_dir / RUN_LOCK_FILE).read_text(encoding="utf-8").strip() or "pid not written yet"
        except OSError:
            holder = "pid unknown"
        raise OptBenchError(
            f"run {run_id}: its directory '{run_dir}' is held by a live process this sweep did not start "
            f"({holder}); the sweep neither moves nor writes into it. Wait for that process to end (or stop it) and "
            "start the sweep again, or give the sweep another output_dir."
        ) from None


def classify_outcome(run_dir: Path, returncode: int | None, log_tail: str) -> tuple[str, str | None]:
    """(status, error) of an ended process: summary.json if it says completed/diverged, else failed or oom."""
    summary = read_summary(run_dir) or {}
    status = summary.get("status")
    if status in FINISHED_STATUSES:
        return str(status), None
    oom = status == "oom" or bool(OOM_PATTERN.search(log_tail)) or bool(OOM_PATTERN.search(str(summary.get("error"))))
    error = summary.get("error")
    refused = _refusal(log_tail) if returncode == 2 and not error else None
    if refused:  # the run refused its arguments before any work (a changed config on resume, a bad value)
        error = f"refused by the run (exit code 2): {refused}"
    if not error:
        tail = "\n".join(log_tail.strip().splitlines()[-15:])
        how = f"killed by signal {-returncode}" if returncode is not None and returncode < 0 else \
            f"exit code {returncode}"
        error = f"{how}; no summary.json. Last output:\n{tail}"
    return ("oom" if oom else "failed"), str(error)


def _refusal(log_tail: str) -> str | None:
    """The run's one-line ``error: ...`` (the CLI's form of an OptBenchError), the last one in its log, or None."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip().startswith("error: ")]
    return lines[-1][len("error: "):] if lines else None


def attempt_number(rows: Sequence[dict[str, Any]], run_id: str) -> int:
    """The number of the next attempt of ``run_id``: 1 + its earlier starts and submissions."""
    return 1 + sum(1 for r in rows if r.get("run_id") == run_id and r.get("event") in ("start", "submitted"))


def end_row(run: RunSpec, attempt: int, status: str, error: str | None, rc: int | None, duration: float,
            run_dir: Path) -> dict[str, Any]:
    """The state file's "end" event of one attempt (with the run's final eval loss, for the progress line)."""
    summary = read_summary(run_dir) or {}
    return {"event": "end", "run_id": run.run_id, "attempt": attempt, "status": status, "error": error,
            "returncode": rc, "duration_s": round(duration, 3), "time": time.time(),
            "final_eval_loss": summary.get("final_eval_loss")}


# ------------------------------------------------------------------------------------------------ slots
@dataclass(frozen=True)
class Slot:
    """Where one run of a local sweep runs: slot ``index`` of ``of`` (the runs at once), its cores (None: not
    pinned, the sweep runs one at a time) and its CUDA devices (None: CUDA_VISIBLE_DEVICES left as it is)."""

    index: int = 0
    of: int = 1
    cpus: tuple[int, ...] | None = None
    gpus: tuple[str, ...] | None = None

    def env(self) -> dict[str, str]:
        """What the run's environment gets: the sharing (recorded in its summary.json) and its devices."""
        env = {CONCURRENT_RUNS_ENV: str(self.of), SLOT_ENV: str(self.index)}
        if self.cpus:
            env[CPUS_ENV] = ",".join(map(str, self.cpus))  # the warm worker's fork pins itself to these
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env

    def record(self) -> dict[str, Any]:
        """The slot in the state file's start row."""
        return {"slot": self.index, "concurrent_runs": self.of, "cpus": list(self.cpus) if self.cpus else None,
                "cuda_visible_devices": ",".join(self.gpus) if self.gpus is not None else None}

    def describe(self) -> str:
        if self.of == 1:
            return ""
        where = [f"cores {','.join(map(str, self.cpus))}"] if self.cpus else []
        where += [f"CUDA {','.join(self.gpus)}"] if self.gpus is not None else []
        return f" [slot {self.index + 1}/{self.of}: {', '.join(where)}]"

    def pin(self) -> None:
        """Pin the calling thread to the slot's cores; processes it starts (and their forks) inherit the mask."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)


def visible_gpus(env: dict[str, str]) -> list[str]:
    """The CUDA devices a run could use, without initialising CUDA: CUDA_VISIBLE_DEVICES's entries when it is set,
    else one per /dev/nvidiaN; [] where none is visible (or only a GPU this cannot count, e.g. ROCm's /dev/kfd)."""
    if not gpu_visible(env):
        return []
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return sorted((p[len("/dev/nvidia"):] for p in glob.glob("/dev/nvidia[0-9]*")), key=int)


def processes_per_run(launcher: dict[str, Any]) -> int | None:
    """Processes one run starts: 1 for type python, the accelerate config's num_processes, None (not known) for
    type command (a torchrun or wrapper command line)."""
    return None if launcher.get("type") == "command" else world_size(launcher)


def _threads(env: dict[str, str]) -> int:
    try:
        return max(1, int(env.get("OMP_NUM_THREADS") or 1))
    except ValueError:
        return 1


# Memory one run of a CPU sweep needs at once: its process peaks at ~500-600 MiB RSS (the Python/torch runtime: README,
# "What the main job found") and its warm worker holds about as much; so "auto" starts no more runs than GiB available.
RUN_MEMORY_BYTES = 2**30


def _memory_cap() -> int | None:
    """How many runs the available memory holds (MemAvailable / RUN_MEMORY_BYTES); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
        return max(1, kib * 1024 // RUN_MEMORY_BYTES)
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def launcher_environ(launcher: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a sweep's run sees: ``environ`` (default: this process's) with ``launcher.env`` on top."""
    return {**(dict(os.environ) if environ is None else environ),
            **{str(k): str(v) for k, v in (launcher.get("env") or {}).items()}}


def plan_slots(launcher: dict[str, Any], n_runs: int, environ: dict[str, str] | None = None) -> list[Slot]:
    """The slots of a local sweep with ``n_runs`` to run. ``launcher.jobs`` "auto" (the default): one run per
    visible GPU (per accelerate process group); without a GPU, the cores this process may use (sched_getaffinity)
    divided by the cores a run uses (OMP_NUM_THREADS of launcher.env or the environment, default 1, x its
    processes), at most one per GiB of available memory; 1 for type command, whose process count the sweep cannot
    know. Slot i gets core block i of that width (GPU machines: an equal share of the cores) and GPU block i;
    blocks wrap when ``jobs`` asks for more than there are. One slot is not pinned: a sweep run one at a time stays
    as it always was."""
    env = launcher_environ(launcher, environ)
    cores = sorted(os.sched_getaffinity(0))
    gpus, procs = visible_gpus(env), processes_per_run(launcher)
    jobs = launcher.get("jobs", "auto")
    if jobs == "auto":
        if procs is None or (gpu_visible(env) and not gpus):
            jobs = 1
        else:
            jobs = len(gpus) // procs if gpus else len(cores) // (_threads(env) * procs)
            jobs = min(jobs, _memory_cap() or jobs)
    jobs = max(1, min(int(jobs), n_runs))
    if jobs == 1:
        return [Slot()]
    per = procs or 1
    width = min(len(cores), max(1, len(cores) // jobs) if gpus else _threads(env) * per)
    return [Slot(i, jobs, tuple(cores[(i * width + k) % len(cores)] for k in range(width)),
                 tuple(gpus[(i * per + k) % len(gpus)] for k in range(min(per, len(gpus)))) if gpus else None)
            for i in range(jobs)]


class SweepStopping(Exception):
    """A slot was about to start a run while the sweep is being stopped: that run is stopped at once."""


class Flight:
    """The runs in flight of a local sweep, and whether it is being stopped. An interrupt (Ctrl-C, SIGTERM) or a
    failure in one slot stops every run in flight; a run stopped that way gets no end row, so a restart runs it
    again (an end row would make its "failed" final)."""

    def __init__(self, kill_tree: Callable[..., Any]) -> None:
        self.kill_tree = kill_tree  # processes.kill_tree: (pid, create_time) -> stops that process's tree
        self.lock = threading.Lock()
        self.refresh_lock = threading.Lock()  # summary.csv is rewritten by one slot at a time
        self.pids: dict[str, tuple[int, float | None]] = {}
        self.stopping = False
        self.error: BaseException | None = None

    def started(self, run_id: str, pid: int, create_time: float | None) -> None:
        with self.lock:
            if self.stopping:
                raise SweepStopping(run_id)
            self.pids[run_id] = (pid, create_time)

    def ended(self, run_id: str) -> None:
        with self.lock:
            self.pids.pop(run_id, None)

    def stop(self, error: BaseException | None = None) -> None:
        """Mark the sweep as stopping (no slot starts another run) and stop every run in flight."""
        with self.lock:
            self.stopping = True
            self.error = self.error or error
            pids = list(self.pids.values())
        for pid, create_time in pids:
            self.kill_tree(pid, create_time)


def hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class NoPredictor:
    """The ETA predictor of a progress count made without one (tests, a phase run on its own): told of every run
    and phase like :class:`hf_optbench.study.eta.Predictor`, it does nothing and predicts nothing, so that nothing
    that tells it has to ask whether there is one."""

    jobs = 1

    def begin_phase(self, runs: Sequence[RunSpec], finished: Sequence[RunSpec]) -> None:
        del runs, finished

    def begin_draw(self) -> None:
        pass

    def started(self, run: RunSpec) -> None:
        del run

    def ended(self, run: RunSpec, duration: float, summary: Any) -> None:
        del run, duration, summary

    def settle(self, phase: str) -> None:
        del phase

    def remaining(self) -> float | None:
        return None


class Progress:
    """Runs done/total, the current run, elapsed and ETA on the terminal (one line per event: logs stay
    readable when the output is a file). One for the whole sweep: the count, the clock and the ETA run on across
    its phases (every tuning round, then the comparison) instead of starting again at each. ETA: the sweep's
    ``predictor`` (:class:`hf_optbench.study.eta.Predictor`: its structure, known and expected runs, times what a
    step and a run cost here), told of every run that starts and ends; without one, the mean duration of this
    invocation's runs of the same model size times the runs known to be left, over the runs at once."""

    def __init__(self, total: int, done: int, stream: Any = None, predictor: Any = None,
                 t0: float | None = None) -> None:
        self.total, self.done, self.stream = total, done, stream or sys.stdout
        self.t0 = time.monotonic() if t0 is None else t0  # the sweep command's start: its clock counts start-up
        self.durations: dict[str, list[float]] = {}
        self.later: list[RunSpec] = []  # runs of later phases still to run: counted in the ETA
        self._jobs = 1  # runs at once (the local executor's slots): the ETA divides by it
        self.predicts = predictor is not None  # else: the ETA of the mean run, no ETA on the end lines
        self.predictor = predictor if predictor is not None else NoPredictor()
        self.runs_dir: Path | None = None  # the current phase's run directories (summary.json of a run that ended)
        self._lock = threading.Lock()  # slots report from threads of their own: one whole line at a time

    @property
    def jobs(self) -> int:
        return self._jobs

    @jobs.setter
    def jobs(self, value: int) -> None:
        self._jobs = value
        self.predictor.jobs = value

    def begin_phase(self, before: int, done: int, total: int, later: Sequence[RunSpec] = (),
                    phase: Any = None, finished: Sequence[RunSpec] = ()) -> None:
        """A phase (or a tuning round) starts: ``before`` runs of earlier phases, all finished; ``done`` of this
        phase's ``total`` finished already; ``later``: the runs of later phases still to run. ``phase``: its
        SweepSpec (its runs and where they write), ``finished``: its runs finished before it began."""
        with self._lock:
            self.done, self.total, self.later = before + done, before + total + len(later), list(later)
            if phase is not None:
                self.runs_dir = phase.runs_dir
                self.predictor.begin_phase(phase.runs, finished)

    def eta(self, pending: Sequence[RunSpec]) -> float | None:
        if self.predicts:
            return self.predictor.remaining()
        with self._lock:
            durations = {k: list(v) for k, v in self.durations.items()}
            left = [*pending, *self.later]
        everything = [d for ds in durations.values() for d in ds]
        if not everything:
            return None
        mean_all = sum(everything) / len(everything)
        return sum((sum(durations[r.model_size]) / len(durations[r.model_size]))
                   if r.model_size in durations else mean_all for r in left) / max(1, self.jobs)

    def say(self, msg: str) -> None:
        with self._lock:
            self.stream.write(f"[sweep {self.done}/{self.total} | {hms(time.monotonic() - self.t0)}] {msg}\n")
            self.stream.flush()

    def _eta_text(self, pending: Sequence[RunSpec]) -> str:
        eta = self.eta(pending)
        return f"sweep ETA {hms(eta) if eta is not None else '?'}"

    def started(self, run: RunSpec, pending: Sequence[RunSpec], note: str = "") -> None:
        self.predictor.started(run)
        self.say(f"running {run.run_id}{note} ({self._eta_text(pending)})")

    def ended(self, run: RunSpec, status: str, duration: float, detail: str = "") -> None:
        summary = read_summary(self.runs_dir / run.run_id) \
            if self.predicts and self.runs_dir is not None else None  # only the predictor reads it
        with self._lock:
            self.done += 1
            self.durations.setdefault(run.model_size, []).append(duration)
        self.predictor.ended(run, duration, (summary or {}) if status in FINISHED_STATUSES else None)
        self.say(f"{run.run_id}: {status} in {duration:.1f} s{detail}" +
                 (f" ({self._eta_text([])})" if self.predicts else ""))
