"""``BenchArguments``: what the measurement callbacks (``measure/recorder.py``) measure and how.

Standard library only at module level: ``config.py`` parses this with ``HfArgumentParser`` next to
``TrainingArguments`` (so no field name may collide with one of its fields), and recipe validation and the CLI's
``--help`` must stay fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hf_optbench.errors import OptBenchError

# A single step's loss can dip below a target by noise alone; a trailing mean makes "reached" mean "reached and
# stayed". 20 steps is our choice: long enough to average out batch noise at micro-batch 8, short next to the 200+
# step runs of the CPU recipes. The one owner of the default: the recorder and the report (a run that recorded none).
TARGET_SMOOTHING_STEPS = 20


@dataclass
class BenchArguments:
    """Knobs of the measurement callbacks. Defaults are benchmark choices, each argued next to it."""

    target_losses: list[float] = field(
        default_factory=list,
        metadata={
            "help": "Loss levels to time (e.g. 6.0 5.0 4.0): steps, tokens and seconds until the smoothed train loss "
            "(and, unless eval_target_losses is given, the eval loss) first reaches each."
        },
    )
    eval_target_losses: list[float] = field(
        default_factory=list,
        metadata={"help": "Loss levels timed on the eval loss; empty = the same as target_losses."},
    )
    target_smoothing_steps: int = field(
        default=TARGET_SMOOTHING_STEPS,
        metadata={"help": "Train-loss targets count as reached when the mean of the last N step losses is <= target."},
    )
    # Spike rule (metrics.SpikeDetector): value > rolling median of the previous `spike_window` values +
    # `spike_threshold` x 1.4826 x MAD, i.e. a Hampel identifier (Pearson 2002, "Outliers in process modeling and
    # identification", IEEE TCST 10(1); Hampel 1974). Classic Hampel uses k=3; training-loss noise is heavier-tailed
    # than Gaussian and k=3 flags ~1 in 740 steps of pure Gaussian noise, so we use k=6 (1 in ~10^9 for Gaussian).
    spike_window: int = field(
        default=50, metadata={"help": "Steps in the rolling window the spike rule compares against."}
    )
    spike_threshold: float = field(
        default=6.0,
        metadata={"help": "A spike is a value above the rolling median by more than this many robust deviations."},
    )
    spike_min_history: int = field(
        default=10, metadata={"help": "Finite values needed in the window before the spike rule is applied."}
    )
    # Steps 1..K of every train() call (torch.compile, CUDA/cuDNN autotuning, allocator growth, lazy optimizer-state
    # allocation) are not steady state; 3 covers eager warm-up on CPU and GPU. Raise it under torch_compile.
    timing_warmup_steps: int = field(
        default=3,
        metadata={"help": "First optimizer steps of each train() call left out of the step-time summary."},
    )
    measure_memory: bool = field(
        default=True,
        metadata={"help": "Measure optimizer-state/param/grad bytes after the first optimizer step and at train end."},
    )
    stop_on_divergence: bool = field(
        default=True,
        metadata={"help": "Stop training cleanly (status 'diverged') at the first NaN/Inf loss or gradient norm."},
    )
    device_peak_tflops: float | None = field(
        default=None,
        metadata={
            "help": "Peak dense TFLOPS of one device for MFU, for GPUs missing from metrics.DEVICE_PEAK_FLOPS "
            "(null = look the device up; MFU is null when it is not listed)."
        },
    )
    metrics_flush_every: int = field(
        default=100,
        metadata={"help": "metrics.jsonl rows buffered before a write (also flushed on eval, save, stop and end)."},
    )

    def __post_init__(self) -> None:
        for key in ("target_losses", "eval_target_losses"):
            values = getattr(self, key)
            if values is None:
                setattr(self, key, [])
                continue
            if isinstance(values, (int, float)):
                values = [values]
                setattr(self, key, values)
            for v in values:
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                    raise OptBenchError(
                        f"{key} must hold positive finite losses, got {v!r}. Use e.g. --{key} 6.0 5.0 4.0."
                    )
            setattr(self, key, sorted((float(v) for v in values), reverse=True))
        _check_int(self, "target_smoothing_steps", 1)
        _check_int(self, "spike_window", 3)
        _check_int(self, "spike_min_history", 2)
        _check_int(self, "timing_warmup_steps", 0)
        _check_int(self, "metrics_flush_every", 1)
        if self.spike_min_history > self.spike_window:
            raise OptBenchError(
                f"spike_min_history ({self.spike_min_history}) must be <= spike_window ({self.spike_window}). "
                "Lower spike_min_history or raise spike_window."
            )
        if not (isinstance(self.spike_threshold, (int, float)) and math.isfinite(self.spike_threshold)
                and self.spike_threshold > 0):
            raise OptBenchError(
                f"spike_threshold must be a positive number of robust deviations, got {self.spike_threshold!r}. "
                "Use e.g. --spike_threshold 6."
            )
        if self.device_peak_tflops is not None and not (
            isinstance(self.device_peak_tflops, (int, float)) and math.isfinite(self.device_peak_tflops)
            and self.device_peak_tflops > 0
        ):
            raise OptBenchError(
                f"device_peak_tflops must be a positive number of TFLOPS, got {self.device_peak_tflops!r}. "
                "Take the dense (not sparsity) figure for your precision from the GPU's datasheet, or leave it unset."
            )

    @property
    def eval_targets(self) -> list[float]:
        """Targets applied to the eval loss: ``eval_target_losses`` if given, else ``target_losses``."""
        return list(self.eval_target_losses or self.target_losses)


def _check_int(args: BenchArguments, key: str, minimum: int) -> None:
    value = getattr(args, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise OptBenchError(f"{key} must be an integer >= {minimum}, got {value!r}. Fix --{key}.")
