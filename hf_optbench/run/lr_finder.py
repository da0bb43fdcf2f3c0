"""LR range test (Smith 2017, "Cyclical Learning Rates for Training Neural Networks", Sec. 3.3, as implemented
by fastai's ``lr_find`` and PyTorch Lightning's LR finder): train with a learning rate growing exponentially from
``min_lr`` to ``max_lr``, record the loss and its bias-corrected EMA (fastai's ``Recorder``, beta 0.98), stop when
the EMA exceeds ``diverge_factor`` (4, fastai/Lightning) x its best, and suggest three learning rates.

Why the suggestions are not read off the EMA: a 0.98 EMA averages ~50 steps, half of a 100-step test, so it keeps
falling for as long as the raw loss sits below it and its steepest slope lands right where the raw loss blows up
(measured on recipes/quickstart_cpu.yaml: 2.4e-2, the step before the raw loss jumped from 5.7 to 9.7). The rules
read a zero-lag curve instead: a Savitzky-Golay fit (Savitzky & Golay 1964, ``scipy.signal.savgol_filter``,
quadratic, a window of about one decade of the ramp), whose first derivative is the slope against log10(lr).
On that curve, skipping the first 10% of the points (fastai trims ``num_it//10``):

* ``suggestion_steepest`` -- the LR of the steepest descent, searched only *before* the curve's minimum (fastai's
  ``steep``, fastai/fastai ``fastai/callback/schedule.py``; Lightning's ``suggestion()``);
* ``suggestion_min_div10`` -- the LR of the curve's minimum divided by 10 (fastai's ``minimum``; Smith 2017 and
  Gugger, https://sgugger.github.io/the-1cycle-policy.html: the minimum is already too high, back off 10x);
* ``suggestion_valley`` -- fastai's default since 2.5 (``valley`` in the same file): the middle of the longest
  decreasing stretch before the minimum, the most conservative of the three.

Public API: ``lr_range_test(model, optimizer, batches, *, min_lr, max_lr, num_steps, smooth=0.98,
diverge_factor=4, on_step=None) -> LRFinderResult`` (pure: no Trainer, no recipe; ``optimizer`` is a registry name,
an ``Optimizer`` or a ``model -> Optimizer`` callable; ``on_step(step, lr, loss, smoothed)`` reports progress) and
``suggest(lrs, raw_losses)``. ``hf-optbench find-lr`` (:mod:`hf_optbench.cli.find_lr`) runs it on a recipe.

Why written here: the range test lives in PyTorch Lightning and fastai (neither a dependency) and the
torch-lr-finder package (not installed); with Trainer it is 40 lines of loop, and one loop can also drive the
optimizers that need care (schedule-free train mode; an optimizer's work between steps, e.g. Sophia-G's Hessian
estimate, from its registry row's ``manual_step``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import atomic_path

if TYPE_CHECKING:
    import numpy as np
    import torch

StepCallback = Callable[[int, float, float, float], None]  # (step, lr, raw loss, smoothed loss)


@dataclass
class Suggestions:
    """The three suggested LRs (None when the curve is too short or never falls), the zero-lag curve they were
    read from (NaN where the test had stopped) and the LR of its minimum."""

    steepest: float | None = None
    min_div10: float | None = None
    valley: float | None = None
    minimum_lr: float | None = None
    curve: list[float] = field(default_factory=list)


@dataclass
class LRFinderResult:
    """LRs tried, raw and EMA-smoothed losses, the zero-lag curve the suggestions read, and the suggestions."""

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    suggestion_steepest: float | None
    suggestion_min_div10: float | None
    suggestion_valley: float | None = None
    minimum_lr: float | None = None
    zero_lag_losses: list[float] = field(default_factory=list)
    diverged_at_step: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def plot(self, path: str | Path, title: str = "LR range test") -> Path:
        """Raw and zero-lag smoothed loss vs LR (log x), the suggestions marked; y clipped above the curve's start
        so a blow-up does not flatten the part that matters. PNG via matplotlib's Agg backend, written atomically."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        ax.plot(self.lrs, self.raw_losses, color="0.65", lw=0.9, label="loss (raw)")
        if self.zero_lag_losses:
            ax.plot(self.lrs, self.zero_lag_losses, color="C0", lw=2.0, label="smoothed (zero-lag)")
        marks = ((self.suggestion_valley, "C2", "valley"), (self.suggestion_steepest, "C1", "steepest"),
                 (self.suggestion_min_div10, "C3", "min / 10"))
        for lr, color, label in marks:
            if lr is not None:
                ax.axvline(lr, color=color, ls="--", lw=1.3, label=f"{label}: {lr:.2e}")
        if self.minimum_lr is not None:
            ax.axvline(self.minimum_lr, color="0.3", ls=":", lw=1.0, label=f"minimum: {self.minimum_lr:.2e}")
        clipped = _set_ylim(ax, self.raw_losses, self.zero_lag_losses, self.lrs, self.minimum_lr)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss" + (" (blow-up clipped)" if clipped else ""))
        stop = f"; stopped at step {self.diverged_at_step + 1} (diverged)" if self.diverged_at_step is not None else ""
        ax.set_title(title + stop, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)
        return path


def _set_ylim(ax: Any, raw: list[float], curve: list[float], lrs: list[float], minimum_lr: float | None) -> bool:
    """y from the lowest loss to the highest loss seen *before* the minimum (plus margins); True if points above
    that (the blow-up) are cut off."""
    import numpy as np

    values = np.asarray([v for v in [*raw, *curve] if math.isfinite(v)])
    if values.size == 0:
        return False
    cut = len(lrs) if minimum_lr is None else int(np.searchsorted(np.asarray(lrs), minimum_lr)) + 1
    before = np.asarray([v for v in [*raw[:cut], *curve[:cut]] if math.isfinite(v)])
    lo, hi = float(values.min()), float(before.max() if before.size else values.max())
    pad = 0.08 * (hi - lo) if hi > lo else 0.5
    ax.set_ylim(lo - pad, hi + pad)
    return bool(values.max() > hi + pad or values.size < len(raw) + len(curve))


def _savgol_window(lrs: list[float], n: int) -> int:
    """Odd window of about one decade of the ramp (steps per decade), at least 5 points and at most ``n``."""
    per_decade = 1.0 / math.log10(lrs[1] / lrs[0]) if lrs[1] > lrs[0] else 5.0
    window = max(5, int(round(per_decade)) | 1)
    return min(window, n if n % 2 else n - 1)


def _valley(losses: np.ndarray) -> int:
    """fastai's ``valley`` (fastai/callback/schedule.py, fastai 2.5+): the index halfway along the longest
    decreasing subsequence of ``losses``, found by the same O(n^2) longest-decreasing-subsequence scan."""
    n = len(losses)
    lds, max_start, max_end = [1] * n, 0, 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
            if lds[max_end] < lds[i]:
                max_end, max_start = i, i - lds[i]
    sections = (max_end - max_start) / 3
    return min(n - 1, max(0, max_start + int(sections) + int(sections / 2)))


def suggest(lrs: list[float], raw_losses: list[float], skip_begin: int | None = None) -> Suggestions:
    """The steepest-descent, minimum/10 and valley LRs of a range test, read from a zero-lag (Savitzky-Golay)
    smoothing of the raw losses up to the first non-finite one. The first ``skip_begin`` points (default 10% of
    the test, at most 10: the warm-up, as fastai and Lightning skip) are ignored; all three lie before the minimum."""
    import numpy as np
    from scipy.signal import savgol_filter

    raw = np.asarray(raw_losses, dtype=float)
    n = int(np.argmin(np.isfinite(raw))) if not np.isfinite(raw).all() else len(raw)
    if n < 5:
        return Suggestions(curve=[math.nan] * len(raw))
    window = _savgol_window(lrs, n)
    step = math.log10(lrs[1] / lrs[0])
    curve = savgol_filter(raw[:n], window, 2)
    slope = savgol_filter(raw[:n], window, 2, deriv=1, delta=step)
    begin = min(10, max(1, n // 10)) if skip_begin is None else skip_begin
    begin = min(begin, n - 1)
    m = begin + int(np.argmin(curve[begin:]))
    out = Suggestions(minimum_lr=float(lrs[m]), min_div10=float(lrs[m]) / 10,
                      curve=[float(v) for v in curve] + [math.nan] * (len(raw) - n))
    if m - begin >= 2:
        k = begin + int(np.argmin(slope[begin:m]))
        out.steepest = float(lrs[k]) if slope[k] < 0 else None
        out.valley = float(lrs[begin + _valley(curve[begin:m + 1])])
    return out


def _cycle(batches: Iterable) -> Iterator:
    """Iterate ``batches``, starting over when a re-iterable source (list, DataLoader) runs out."""
    while True:
        empty = True
        for b in batches:
            empty = False
            yield b
        if empty or iter(batches) is batches:  # an exhausted one-shot iterator: stop
            return


def _to_inputs(batch: Any, device: torch.device) -> dict[str, Any]:
    import torch

    if isinstance(batch, torch.Tensor):
        batch = {"input_ids": batch}
    if not isinstance(batch, dict):
        raise OptBenchError(f"lr_range_test batches must be dicts of tensors or tensors, got {type(batch).__name__}.")
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    inputs.setdefault("labels", inputs["input_ids"])
    return inputs


def _check_range_args(min_lr: float, max_lr: float, num_steps: int, smooth: float, diverge_factor: float) -> None:
    if not 0 < min_lr < max_lr:
        raise OptBenchError(f"need 0 < min_lr < max_lr, got min_lr={min_lr}, max_lr={max_lr}.")
    if num_steps < 2:
        raise OptBenchError(f"num_steps must be >= 2, got {num_steps}.")
    if not 0 <= smooth < 1:
        raise OptBenchError(f"smooth must be in [0, 1), got {smooth}.")
    if diverge_factor <= 1:
        raise OptBenchError(f"diverge_factor must be > 1, got {diverge_factor}.")


def _make_optimizer(optimizer: Any, model: torch.nn.Module, min_lr: float) -> torch.optim.Optimizer:
    """A registry name is built at ``min_lr``; an Optimizer is used as is; anything else is a factory."""
    import torch

    if isinstance(optimizer, str):
        from hf_optbench.optim.registry import build_optimizer

        return build_optimizer(optimizer, model, lr=min_lr)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    return optimizer(model)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    import torch

    return torch.autocast(device.type, dtype=dtype) if dtype else torch.autocast(device.type, enabled=False)


def _accumulate(model: torch.nn.Module, opt: torch.optim.Optimizer, source: Iterator, *, step: int,
                accumulation_steps: int, autocast_dtype: torch.dtype | None) -> tuple[float, dict[str, Any]]:
    """Gradients of ``accumulation_steps`` micro-batches; returns (their summed mean loss, the last inputs)."""
    device = next(model.parameters()).device
    opt.zero_grad(set_to_none=True)
    total = 0.0
    inputs: dict[str, Any] = {}
    for _ in range(accumulation_steps):
        batch = next(source, None)
        if batch is None:
            raise OptBenchError(f"lr_range_test ran out of batches after {step} steps; pass more data or "
                                "fewer num_steps.")
        inputs = _to_inputs(batch, device)
        with _autocast(device, autocast_dtype):
            loss = model(**inputs).loss / accumulation_steps
        loss.backward()
        total += float(loss.detach())
    return total, inputs


def _ramp(model: torch.nn.Module, opt: torch.optim.Optimizer, source: Iterator, *, min_lr: float, max_lr: float,
          num_steps: int, smooth: float, diverge_factor: float, accumulation_steps: int,
          max_grad_norm: float | None, autocast_dtype: torch.dtype | None, on_step: StepCallback | None = None
          ) -> tuple[list[float], list[float], list[float], int | None]:
    """The range test's loop: (lrs, smoothed losses, raw losses, step it diverged at or None)."""
    import torch

    rates = [g["lr"] for g in opt.param_groups]
    ref = max(rates, key=rates.count)  # the lr the optimizer was asked for: most groups run it (Muon's muon_lr aside)
    ratios = [g["lr"] / ref for g in opt.param_groups]
    if callable(getattr(opt, "train", None)):
        opt.train()  # schedule-free optimizers step only in train mode
    from hf_optbench.optim.registry import manual_step_hook

    after_step = manual_step_hook(opt)  # an optimizer's own work between steps (Sophia-G's Hessian estimate)
    factor = (max_lr / min_lr) ** (1.0 / (num_steps - 1))
    lrs: list[float] = []
    losses: list[float] = []
    raw: list[float] = []
    avg, best = 0.0, math.inf
    model.train()
    for step in range(num_steps):
        lr = min_lr * factor**step
        for g, r in zip(opt.param_groups, ratios, strict=False):
            g["lr"] = lr * r
        total, inputs = _accumulate(model, opt, source, step=step, accumulation_steps=accumulation_steps,
                                    autocast_dtype=autocast_dtype)
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        if after_step is not None:
            after_step(model, opt, inputs, step=step, accumulation_steps=accumulation_steps,
                       autocast_dtype=autocast_dtype)
        avg = smooth * avg + (1 - smooth) * total
        smoothed = avg / (1 - smooth ** (step + 1))
        lrs.append(lr)
        raw.append(total)
        losses.append(smoothed)
        if on_step is not None:
            on_step(step, lr, total, smoothed)
        if not math.isfinite(smoothed) or (step > 0 and smoothed > diverge_factor * best):
            return lrs, losses, raw, step
        best = min(best, smoothed)
    return lrs, losses, raw, None


def lr_range_test(
    model: torch.nn.Module,
    optimizer: str | torch.optim.Optimizer | Callable[[torch.nn.Module], torch.optim.Optimizer],
    batches: Iterable,
    *,
    min_lr: float = 1e-7,
    max_lr: float = 1.0,
    num_steps: int = 100,
    smooth: float = 0.98,
    diverge_factor: float = 4.0,
    accumulation_steps: int = 1,
    max_grad_norm: float | None = None,
    autocast_dtype: torch.dtype | None = None,
    restore: bool = True,
    on_step: StepCallback | None = None,
) -> LRFinderResult:
    """Exponential LR ramp ``min_lr`` -> ``max_lr`` over ``num_steps`` optimizer steps on ``batches``.

    The smoothed loss is the bias-corrected EMA with factor ``smooth``; the test stops early once it exceeds
    ``diverge_factor`` x its minimum (or is not finite). The ramped LR is the one the optimizer was built with
    (``learning_rate``); groups with another LR keep their ratio to it (e.g. Muon's ``muon_lr``). With
    ``restore`` the model's weights are put back afterwards. ``on_step(step, lr, loss, smoothed)`` is called after
    every step (progress reporting).
    """
    _check_range_args(min_lr, max_lr, num_steps, smooth, diverge_factor)
    saved = copy.deepcopy(model.state_dict()) if restore else None
    opt = _make_optimizer(optimizer, model, min_lr)
    try:
        lrs, losses, raw, diverged = _ramp(
            model, opt, _cycle(batches), min_lr=min_lr, max_lr=max_lr, num_steps=num_steps, smooth=smooth,
            diverge_factor=diverge_factor, accumulation_steps=accumulation_steps, max_grad_norm=max_grad_norm,
            autocast_dtype=autocast_dtype, on_step=on_step)
    finally:
        opt.zero_grad(set_to_none=True)
        if saved is not None:
            model.load_state_dict(saved)
    sug = suggest(lrs, raw)
    return LRFinderResult(lrs=lrs, losses=losses, raw_losses=raw, suggestion_steepest=sug.steepest,
                          suggestion_min_div10=sug.min_div10, suggestion_valley=sug.valley,
                          minimum_lr=sug.minimum_lr, zero_lag_losses=sug.curve, diverged_at_step=diverged,
                          settings={"min_lr": min_lr, "max_lr": max_lr, "num_steps": num_steps, "smooth": smooth,
                                    "diverge_factor": diverge_factor, "accumulation_steps": accumulation_steps,
                                    "max_grad_norm": max_grad_norm})
