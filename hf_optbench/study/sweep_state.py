"""What one sweep invocation records and shows: its directory lock, each attempt's number and end row, the outcome
of an ended process, and progress on the terminal.

The state file itself (``sweep_state.jsonl``: :func:`~hf_optbench.rundir.append_state`,
:func:`~hf_optbench.rundir.read_state`, :func:`~hf_optbench.rundir.finished_status`) lives in
:mod:`hf_optbench.rundir`, because the report reads it too.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import FINISHED_STATUSES, read_summary
from hf_optbench.study.sweep_spec import RunSpec

OOM_PATTERN = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory", re.I)


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


def classify_outcome(run_dir: Path, returncode: int | None, log_tail: str) -> tuple[str, str | None]:
    """(status, error) of an ended process: summary.json if it says completed/diverged, else failed or oom."""
    summary = read_summary(run_dir) or {}
    status = summary.get("status")
    if status in FINISHED_STATUSES:
        return str(status), None
    oom = status == "oom" or bool(OOM_PATTERN.search(log_tail)) or bool(OOM_PATTERN.search(str(summary.get("error"))))
    error = summary.get("error")
    if not error:
        tail = "\n".join(log_tail.strip().splitlines()[-15:])
        how = f"killed by signal {-returncode}" if returncode is not None and returncode < 0 else \
            f"exit code {returncode}"
        error = f"{how}; no summary.json. Last output:\n{tail}"
    return ("oom" if oom else "failed"), str(error)


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


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Runs done/total, the current run, elapsed and ETA on the terminal (one line per event: logs stay
    readable when the output is a file). ETA: the mean duration of this invocation's runs of the same model
    size (else of all runs) times what is left."""

    def __init__(self, total: int, done: int, stream: Any = None) -> None:
        self.total, self.done, self.stream = total, done, stream or sys.stdout
        self.t0 = time.monotonic()
        self.durations: dict[str, list[float]] = {}

    def eta(self, pending: Sequence[RunSpec]) -> float | None:
        everything = [d for ds in self.durations.values() for d in ds]
        if not everything:
            return None
        mean_all = sum(everything) / len(everything)
        return sum((sum(self.durations[r.model_size]) / len(self.durations[r.model_size]))
                   if r.model_size in self.durations else mean_all for r in pending)

    def say(self, msg: str) -> None:
        print(f"[sweep {self.done}/{self.total} | {_hms(time.monotonic() - self.t0)}] {msg}", file=self.stream,
              flush=True)

    def started(self, run: RunSpec, pending: Sequence[RunSpec], note: str = "") -> None:
        eta = self.eta(pending)
        self.say(f"running {run.run_id}{note} (ETA {_hms(eta) if eta is not None else '?'})")

    def ended(self, run: RunSpec, status: str, duration: float, detail: str = "") -> None:
        self.done += 1
        self.durations.setdefault(run.model_size, []).append(duration)
        self.say(f"{run.run_id}: {status} in {duration:.1f} s{detail}")
