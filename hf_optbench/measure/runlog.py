"""A run's ``metrics.jsonl``: buffered appends by one writer, and the cut that keeps a resumed run free of
duplicated steps.

Rows are strict JSON (``allow_nan=False``: callers pass non-finite floats as ``None``). Only the world process
zero writes; the other ranks' rows are dropped. Appends are buffered and written on :meth:`RunLog.flush`, which
the recorder calls on eval, save, stop and train end, every ``flush_every`` rows and at least every 30 s, so a
hard kill loses little and a killed run's file is still readable (a torn last line is skipped on reading).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hf_optbench.rundir import write_text_atomic

FLUSH_SECONDS = 30.0  # an hours-long run loses at most this much of its rows to a hard kill


def rows_up_to(path: Path, step: int) -> list[dict[str, Any]]:
    """The rows of ``path`` with an integer ``step <= step``, in file order; [] when the file is missing."""
    kept: list[dict[str, Any]] = []
    if not path.exists():
        return kept
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill mid-write
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(row)
    return kept


class RunLog:
    """The metrics.jsonl sink of one run (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], flush_every: int = 1) -> None:
        self.path = Path(path)
        self.flush_every = flush_every
        self.writer = True  # False on ranks other than the world process zero: rows are dropped
        self._buffer: list[str] = []
        self._last_flush = time.perf_counter()

    def start(self, resume_step: int | None) -> list[dict[str, Any]]:
        """Begin a train() call; returns the rows kept for replay.

        ``resume_step`` None (a fresh run): a previous run's file is removed, since its rows would duplicate
        steps. Otherwise the rows with ``step <= resume_step`` are kept (the file is rewritten with only them)
        and returned, so the steps that follow are appended exactly once.
        """
        self._buffer.clear()
        if resume_step is None:
            if self.writer and self.path.exists():
                self.path.unlink()
            return []
        kept = rows_up_to(self.path, resume_step)
        if self.writer and self.path.exists():
            write_text_atomic(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))
        return kept

    def emit(self, row: dict[str, Any], flush: bool = False) -> None:
        """Buffer one row; ``flush`` writes it (and the buffer) at once."""
        if self.writer:
            self._buffer.append(json.dumps(row, allow_nan=False))
        if flush or len(self._buffer) >= self.flush_every or time.perf_counter() - self._last_flush > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Append the buffered rows to the file (world process zero only; no fsync)."""
        self._last_flush = time.perf_counter()
        if not self._buffer or not self.writer:
            self._buffer.clear()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(self._buffer) + "\n")
        self._buffer.clear()
