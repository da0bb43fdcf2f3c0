"""The probe interface that ``OptBenchRecorder`` composes, and what its probes share.

A probe measures one topic (memory, timing, stability, convergence) and owns everything about it: the fields it
adds to metrics.jsonl rows, the figures it forwards to ``report_to`` backends, its ``summary()`` keys and how it
rebuilds its series from the rows kept on a resume. So adding a metric edits one probe module. The recorder owns
what the probes share: the run log (``runlog.RunLog``), the training clock (:class:`TrainClock`) and the base
fields of every row (kind, step, tokens, elapsed_s, and for train rows epoch, loss, grad_norm, lr).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_optbench.config.bench_args import BenchArguments

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments


def finite(x: Any) -> float | None:
    """float(x) if finite, else None (metrics.jsonl is strict JSON)."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass
class Record:
    """A metrics.jsonl row being built by the recorder and its probes, in the order they run."""

    row: dict[str, Any]
    source: Mapping[str, Any] = field(default_factory=dict)  # the Trainer's logs / eval metrics, as received
    logs: dict[str, Any] = field(default_factory=dict)  # figures for report_to backends, without "optbench/"
    flush: bool = False  # write the row at once (a divergence must be on disk even if the process dies next)


class TrainClock:
    """Train wall time: since train begin, minus evaluation, checkpoint saving and the probes' one-off walks;
    continued across a resume from the last kept row."""

    def __init__(self) -> None:
        self.running = False
        self.last = 0.0  # elapsed when not running: at the last stop, or the largest kept row's on a resume
        self.excluded = 0.0  # seconds left out since start()
        self._offset = self._t0 = self._mark = 0.0

    def reset(self) -> None:
        self.running, self.last = False, 0.0

    def observe(self, elapsed: float) -> None:
        """A kept row's elapsed_s (resume): the clock continues from the largest."""
        self.last = max(self.last, float(elapsed))

    def start(self) -> None:
        self._offset, self.excluded, self.running = self.last, 0.0, True
        self._t0 = self._mark = time.perf_counter()

    def stop(self) -> None:
        self.last = self.elapsed()
        self.running = False

    def elapsed(self, now: float | None = None) -> float:
        if not self.running:
            return self.last
        now = time.perf_counter() if now is None else now
        return self._offset + (now - self._t0 - self.excluded)

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def set_mark(self, now: float | None = None) -> None:
        """Training ran until now: the next :meth:`exclude_since_mark` leaves out only what follows."""
        self._mark = time.perf_counter() if now is None else now

    def exclude_since_mark(self, now: float) -> None:
        """Leave out the time since the last mark (an evaluation or a checkpoint save just ended)."""
        if self.running:
            self.excluded += now - self._mark
            self._mark = now


@dataclass
class RunContext:
    """What every probe may read: the measurement settings, the clock and the device of this train() call."""

    bench: BenchArguments
    tokens_per_step: int | None = None
    clock: TrainClock = field(default_factory=TrainClock)
    device: Any = None
    world_size: int = 1
    per_step_rows: bool = False  # the recorder reads every step's values (it watches the Trainer), not only logs
    warned: set[str] = field(default_factory=set)

    @property
    def in_train(self) -> bool:
        return self.clock.running

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def sync(self) -> None:
        """Wait for queued CUDA work, so that a timestamp covers it (no-op on CPU)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def tokens(self, state: TrainerState) -> int | None:
        """Tokens seen over all ranks at ``state.global_step``; None when neither source is available."""
        if self.tokens_per_step is not None:
            return int(state.global_step * self.tokens_per_step)
        seen = getattr(state, "num_input_tokens_seen", 0)
        return int(seen) if seen else None

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(message, UserWarning, stacklevel=3)


class Probe:
    """One measured topic. Every hook is optional; the recorder calls them in this order for each train() call:

    ``on_train_begin`` (reset the series) -> ``replay`` (kept rows of a resume) -> per step ``on_step_begin``,
    ``on_optimizer_step``, ``on_step_end``; at each loss log ``on_sync``, then ``on_train_row`` for each step since
    the last one (in step order), ``on_log`` (any log event)
    -> ``on_eval_row`` -> ``final_logs`` (the Trainer's last log) -> ``on_train_end``. ``summary`` any time.
    Hooks returning rows give whole metrics.jsonl rows (with ``kind``); the recorder writes them.
    """

    def on_train_begin(self, ctx: RunContext, args: TrainingArguments, model: torch.nn.Module) -> None:
        """Start this train() call: reset the series (a resume then replays them)."""

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        """Rebuild the series from the metrics.jsonl rows kept on a resume (steps up to the resumed one)."""

    def on_step_begin(self, ctx: RunContext) -> None:
        pass

    def on_optimizer_step(self, ctx: RunContext, state: TrainerState, optimizer: Any,
                          model: torch.nn.Module) -> list[dict[str, Any]]:
        return []

    def on_step_end(self, ctx: RunContext, state: TrainerState) -> None:
        pass

    def on_sync(self, ctx: RunContext) -> None:
        """Read back what this probe kept on the device since the last read (the recorder calls it at each loss
        log, when the Trainer has just waited for the GPU, and before evaluation, saving and train end)."""

    def on_train_row(self, ctx: RunContext, rec: Record, control: TrainerControl) -> None:
        """Add this probe's fields to a train row (``rec.row``) and its figures to ``rec.logs``."""

    def on_eval_row(self, ctx: RunContext, rec: Record) -> None:
        """Add this probe's fields to an eval row."""

    def on_log(self, ctx: RunContext, logs: Mapping[str, Any]) -> dict[str, Any]:
        """Figures to forward with any log event (keys without the "optbench/" prefix)."""
        return {}

    def final_logs(self, ctx: RunContext) -> dict[str, Any]:
        """Totals forwarded with the Trainer's final log of a train() call (finite numbers only reach it)."""
        return {}

    def on_train_end(self, ctx: RunContext, state: TrainerState, optimizer: Any,
                     model: torch.nn.Module) -> list[dict[str, Any]]:
        return []

    def summary(self, ctx: RunContext) -> dict[str, Any]:
        """This probe's keys of summary.json."""
        return {}
