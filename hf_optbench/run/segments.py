"""A run's training time over every process that trained it, not only the last one.

A run killed and resumed trains in segments, one per process. Trainer's ``train_runtime`` covers only the
current ``train()`` call, so a resumed run's summary would report the last segment alone (3.8 s of a 7.7 s run).
:class:`SegmentRecorder` writes ``output_dir/train_segments.json`` (atomically, main process) after every
checkpoint and at the end of training, so a segment cut short by a kill is on disk up to its last complete
checkpoint: exactly the work its successor resumes from. Time after that checkpoint is lost with the kill, as the
steps are. ``summary.json`` then records ``train_segments`` ([{start_step, end_step, runtime_s}]) and
``train_runtime_s``, their sum. One-time start-up inside ``train()`` before the first step can run (DeepSpeed's
engine and its op builds, ~80 s the first time a CPU ZeRO op compiles; loading a checkpoint to resume) is timed
on its own: each segment's ``startup_s``, summed as ``startup_s`` in the summary, never part of
``train_runtime_s``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from hf_optbench.rundir import SEGMENTS_FILE, read_segments, write_json_atomic

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments


class SegmentRecorder(TrainerCallback):
    """Records this process's segment of training beside the earlier ones read back from ``output_dir``.

    ``resume``: this process continues the run (also inferred when the Trainer starts at a step > 0); a fresh run
    ignores, then replaces, a file left by an earlier run in the directory.
    """

    def __init__(self, output_dir: str | Path, *, resume: bool = False) -> None:
        self.path = Path(output_dir) / SEGMENTS_FILE
        self.resume = resume
        self.earlier: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self._called: float | None = None  # when train() was entered
        self._started: float | None = None  # when training could start (on_train_begin)

    def start_clock(self) -> None:
        """Call just before ``trainer.train()``: the time from here to ``on_train_begin`` is the segment's
        ``startup_s`` (without this call it is not measured, and is 0)."""
        self._called = time.perf_counter()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self._started = time.perf_counter()
        startup = round(self._started - self._called, 6) if self._called is not None else 0.0
        resumed = self.resume or state.global_step > 0
        self.earlier = read_segments(self.path.parent) if resumed else []
        self.current = {"start_step": state.global_step, "end_step": state.global_step, "runtime_s": 0.0,
                        "startup_s": startup}

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.close(state, write=bool(state.is_world_process_zero))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.close(state, write=bool(state.is_world_process_zero))

    def close(self, state: TrainerState, *, write: bool) -> None:
        """Bring the current segment up to ``state.global_step`` and now; with ``write``, persist all segments."""
        if self.current is None or self._started is None:
            return
        self.current["end_step"] = int(state.global_step)
        self.current["runtime_s"] = round(time.perf_counter() - self._started, 6)
        if write:
            write_json_atomic(self.path, {"segments": self.segments()})

    def segments(self) -> list[dict[str, Any]]:
        """Every segment of the run so far, oldest first."""
        return [*self.earlier, *([dict(self.current)] if self.current is not None else [])]

    def summary(self) -> dict[str, Any]:
        """The summary.json keys: ``train_segments``, ``train_runtime_s`` and ``startup_s`` (sums over the
        segments; None before training)."""
        segments = self.segments()
        if not segments:
            return {"train_segments": segments, "train_runtime_s": None, "startup_s": None}
        return {"train_segments": segments,
                "train_runtime_s": sum(float(s.get("runtime_s") or 0.0) for s in segments),
                "startup_s": round(sum(float(s.get("startup_s") or 0.0) for s in segments), 6)}
