"""Stability probe: loss and grad-norm spikes, and divergence control.

Reads every step's loss and grad norm (total norm before clipping): the recorder hands them over at each of the
Trainer's loss logs, all the steps since the last one (``step_values``: read from the device in one transfer, so
``logging_steps`` sets how often the host waits for the GPU, not which steps are seen; a Trainer the recorder does
not watch gives only its logged steps, as ``logs["loss"]``). The spike rule is ``metrics.SpikeDetector``'s (a
streaming Hampel identifier). A NaN/Inf loss or grad norm stops training cleanly (``control.should_training_stop``;
no eval or checkpoint of the broken model: the recorder has the Trainer log before each evaluation and save) and
sets the status to "diverged", at the step where it happened; with ``logging_steps`` N the run stops at the log
that reads it, up to N - 1 steps later. ``logging_nan_inf_filter=False`` is needed where the recorder does not watch
the Trainer (with the filter on, the Trainer replaces a NaN loss by the running mean; the grad norm still catches
it): the probe warns once otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.measure.metrics import SpikeDetector
from hf_optbench.measure.probe_base import Probe, Record, RunContext, finite

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainingArguments


def nonfinite(x: Any) -> bool:
    """True for a NaN/Inf number; False for None and non-numbers (a missing value is not a divergence)."""
    if x is None:
        return False
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


class StabilityProbe(Probe):
    """Adds ``loss_spike``/``grad_norm_spike`` to train rows; owns ``status`` and ``diverged_step``."""

    def __init__(self, bench: BenchArguments) -> None:
        self.bench = bench
        self.status = "completed"  # or "diverged"; kept across train() calls of one recorder
        self.diverged_step: int | None = None
        self._reset()

    def _reset(self) -> None:
        b = self.bench
        self._loss = SpikeDetector(b.spike_window, b.spike_threshold, b.spike_min_history)
        self._grad = SpikeDetector(b.spike_window, b.spike_threshold, b.spike_min_history)

    def on_train_begin(self, ctx: RunContext, args: TrainingArguments, model: torch.nn.Module) -> None:
        self._reset()
        if args.logging_strategy != "steps" or (args.logging_steps != 1 and not ctx.per_step_rows):
            ctx.warn_once(
                "logging_steps",
                f"OptBenchRecorder reads the steps' losses and grad norms at the Trainer's loss logs (got "
                f"logging_strategy {args.logging_strategy}, logging_steps {args.logging_steps}): "
                + ("divergence is only caught at evaluations, saves and the end. Set logging_strategy='steps'."
                   if args.logging_strategy != "steps" else
                   "without attach_callbacks(trainer, [recorder]) it sees only the logged steps, so per-step rows, "
                   "spikes and divergence checks cover those alone. Attach it, or set logging_steps=1."),
            )
        if args.logging_nan_inf_filter:
            ctx.warn_once(
                "nan_filter",
                "logging_nan_inf_filter=True makes the Trainer replace a NaN/Inf loss by the running mean, so divergence "
                "is only caught through the gradient norm. Set logging_nan_inf_filter=False.",
            )

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            if row.get("kind") == "train":
                self._loss.update(finite(row.get("loss")), row["step"])
                self._grad.update(finite(row.get("grad_norm")), row["step"])

    def on_train_row(self, ctx: RunContext, rec: Record, control: TrainerControl) -> None:
        step = rec.row["step"]
        loss_spike = self._loss.update(rec.row["loss"], step) is not None
        grad_spike = self._grad.update(rec.row["grad_norm"], step) is not None
        rec.row.update(loss_spike=loss_spike, grad_norm_spike=grad_spike)
        rec.logs.update(loss_spike=int(loss_spike), grad_norm_spike=int(grad_spike))
        if not (nonfinite(rec.source.get("loss")) or nonfinite(rec.source.get("grad_norm"))):
            return
        rec.flush = True
        if self.diverged_step is None:
            self.status, self.diverged_step = "diverged", step
            rec.logs["diverged_step"] = step
            if self.bench.stop_on_divergence:
                control.should_training_stop = True
                control.should_evaluate = False  # evaluating or checkpointing a NaN model only costs time
                control.should_save = False

    def final_logs(self, ctx: RunContext) -> dict[str, Any]:
        largest_loss, largest_grad = self._loss.largest, self._grad.largest
        return {
            "loss_spikes": self._loss.count,
            "max_loss_spike": largest_loss.z if largest_loss else None,
            "grad_norm_spikes": self._grad.count,
            "max_grad_norm_spike": largest_grad.z if largest_grad else None,
        }

    def summary(self, ctx: RunContext) -> dict[str, Any]:
        totals = self.final_logs(ctx)
        largest_loss, largest_grad = self._loss.largest, self._grad.largest
        b = self.bench
        return {
            "diverged_step": self.diverged_step,
            "loss_spikes": totals["loss_spikes"],
            "max_loss_spike": totals["max_loss_spike"],
            "max_loss_spike_step": largest_loss.index if largest_loss else None,
            "grad_norm_spikes": totals["grad_norm_spikes"],
            "max_grad_norm_spike": totals["max_grad_norm_spike"],
            "max_grad_norm_spike_step": largest_grad.index if largest_grad else None,
            "spike_rule": {"window": b.spike_window, "threshold": b.spike_threshold,
                           "min_history": b.spike_min_history},
        }
