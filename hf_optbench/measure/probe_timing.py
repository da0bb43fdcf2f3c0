"""Timing probe: step time, tokens/s and MFU.

Step time runs from ``on_step_begin`` to ``on_step_end``: forward/backward of every micro-batch, clipping,
optimizer and scheduler step, what callbacks do in ``on_optimizer_step`` (Sophia-G's Hessian estimate every k
steps: part of its step), zero_grad; not data loading, eval, logging, saving or the memory probe's one-off
walk (its host time is subtracted). On CPU it is ``time.perf_counter`` at both ends. On CUDA it is the GPU's own
time between two events recorded on the stream at both ends, read when the recorder next reads the step values
(``on_sync``, at the Trainer's loss log, after its own wait for the GPU): no host sync in the step (a
``torch.cuda.synchronize()`` at each end of a step would make the GPU idle while the host does the Trainer's and
the callbacks' work). The first ``timing_warmup_steps`` of each ``train()`` call are written as ``null`` and left out
of the median/p90. ``tokens_per_s = tokens_per_step / median``; ``mfu = flops_per_token * tokens_per_s / (device
peak * world size)`` with the peak from ``flops.DEVICE_PEAK_FLOPS`` (null on CPU and unlisted devices) unless
``device_peak_tflops`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hf_optbench.measure.flops import device_peak_flops, flops_per_token, model_flops_utilization
from hf_optbench.measure.metrics import median_and_p90
from hf_optbench.measure.probe_base import Probe, Record, RunContext
from hf_optbench.models import tokens_per_step

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments


def precision_of(args: Any) -> str:
    """The matmul precision a Trainer runs with: bf16, fp16, tf32 (CUDA with TF32 matmuls allowed) or fp32."""
    import torch

    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    if torch.cuda.is_available() and (
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    ):
        return "tf32"
    return "fp32"


class TimingProbe(Probe):
    """Adds ``step_time_s`` to train rows; summary: step-time median/p90, tokens/s, device peak and MFU."""

    def __init__(self, flops_per_token: float | None = None) -> None:
        self.flops_per_token = flops_per_token
        self.device_name: str | None = None
        self.precision: str | None = None
        self.peak_flops: float | None = None
        self._step_times: list[float] = []
        self._steps_this_call = 0
        self._t_step = 0.0
        self._start_event: Any = None
        self._excluded_at_begin = 0.0
        self._times: dict[int, float | None] = {}  # global step -> its step time, until its row is written
        self._pending: list[tuple[int, Any, Any, float, bool]] = []  # CUDA: (step, start, end, excluded, warm-up)

    def on_train_begin(self, ctx: RunContext, args: TrainingArguments, model: torch.nn.Module) -> None:
        import torch

        self._step_times, self._steps_this_call, self._times, self._pending = [], 0, {}, []
        self.device_name = torch.cuda.get_device_name(ctx.device) if ctx.cuda else None
        self.precision = precision_of(args)
        if ctx.bench.device_peak_tflops is not None:
            self.peak_flops = ctx.bench.device_peak_tflops * 1e12
        else:
            self.peak_flops = device_peak_flops(self.device_name, self.precision)
        config = getattr(model, "config", None)
        per_step = ctx.tokens_per_step
        if self.flops_per_token is None and per_step and getattr(config, "model_type", None) == "gpt2":
            # the block size is implied by the tokens per step and the batch arguments
            seqs = tokens_per_step(args, 1, ctx.world_size)  # sequences per step
            if seqs > 0 and per_step % seqs == 0:
                self.flops_per_token = flops_per_token(config, per_step // seqs)

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        self._step_times += [float(r["step_time_s"]) for r in rows
                             if r.get("kind") == "train" and r.get("step_time_s") is not None]

    def on_step_begin(self, ctx: RunContext) -> None:
        self._excluded_at_begin = ctx.clock.excluded
        if ctx.cuda:
            import torch

            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        self._t_step = time.perf_counter()

    def on_step_end(self, ctx: RunContext, state: TrainerState) -> None:
        excluded = ctx.clock.excluded - self._excluded_at_begin
        self._steps_this_call += 1
        warm_up = self._steps_this_call <= ctx.bench.timing_warmup_steps
        if ctx.cuda and self._start_event is not None:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((state.global_step, self._start_event, end, excluded, warm_up))
            self._start_event = None
            return
        self._record(state.global_step, time.perf_counter() - self._t_step - excluded, warm_up)

    def on_sync(self, ctx: RunContext) -> None:
        """The CUDA events of the steps since the last read, as step times (one wait, for the last event)."""
        pending, self._pending = self._pending, []
        if pending and not pending[-1][2].query():  # done when the step values were read just before: no wait
            pending[-1][2].synchronize()
        for step, start, end, excluded, warm_up in pending:
            self._record(step, max(0.0, start.elapsed_time(end) / 1e3 - excluded), warm_up)

    def _record(self, step: int, duration: float, warm_up: bool) -> None:
        if warm_up:
            self._times[step] = None
        else:
            self._times[step] = duration
            self._step_times.append(duration)

    def on_train_row(self, ctx: RunContext, rec: Record, control: TrainerControl) -> None:
        step = rec.row["step"]
        step_time = self._times.get(step)
        for done in [s for s in self._times if s <= step]:  # rows are written in step order
            del self._times[done]
        rec.row["step_time_s"] = None if step_time is None else round(step_time, 6)
        if step_time is not None:
            rec.logs["step_time_s"] = step_time

    def final_logs(self, ctx: RunContext) -> dict[str, Any]:
        median, p90 = median_and_p90(self._step_times)
        tokens_per_s = ctx.tokens_per_step / median if (median and ctx.tokens_per_step) else None
        return {
            "step_time_median_s": median,
            "step_time_p90_s": p90,
            "timed_steps": len(self._step_times),
            "tokens_per_s": tokens_per_s,
            "mfu": model_flops_utilization(self.flops_per_token, tokens_per_s, self.peak_flops, ctx.world_size),
        }

    def summary(self, ctx: RunContext) -> dict[str, Any]:
        totals = self.final_logs(ctx)
        return {
            **{k: totals[k] for k in ("step_time_median_s", "step_time_p90_s", "timed_steps")},
            "timing_warmup_steps": ctx.bench.timing_warmup_steps,
            "tokens_per_s": totals["tokens_per_s"],
            "flops_per_token": self.flops_per_token,
            "device_name": self.device_name,
            "precision": self.precision,
            "device_peak_flops": self.peak_flops,
            "mfu": totals["mfu"],
        }
