"""Each optimizer step's loss, gradient norm and learning rate, kept where the Trainer computed them until its next
loss log, then read back in one transfer: per-step metrics.jsonl rows without a host sync in every step.

Why: the Trainer logs (and reads its loss and gradient norm back to the host, each ``.item()`` a wait for the GPU)
only every ``logging_steps``; with ``logging_steps=1`` the GPU idles while the host does every step's logging and
callbacks. Here the values are taken as the Trainer computes them, with no wait:

* the loss: what ``Trainer.training_step`` returns for each micro-batch (the tensor the Trainer adds to its running
  sum), summed per optimizer step the way the Trainer sums between two logs (from a zero, in order), and averaged
  over processes at the read as ``nested_gather(...).mean()`` does: the row of every step holds the loss a log at
  that step would have shown;
* the gradient norm: what ``accelerator.clip_grad_norm_`` returns (the Trainer's ``_clip_grad_norm`` and
  ``_get_grad_norm`` both go through it), the pre-clipping total norm the Trainer logs;
* the learning rate at ``on_optimizer_step``: the scheduler's last rate before it steps, the rate the Trainer logs
  (``_get_learning_rate``), a tensor kept as one.

Both hooks are instance attributes set by :meth:`StepValues.watch` (``training_step`` is the Trainer's documented
override point; ``clip_grad_norm_`` accelerate's public method): no Trainer subclass, and a Trainer that was not
watched logs as before.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass
class PendingStep:
    """One optimizer step's values, still on the device: ``event`` marks its end on the CUDA stream (None on CPU,
    where ``elapsed_s`` is the clock's reading at the step's end)."""

    step: int
    epoch: float | None
    tokens: int | None
    loss: Any
    grad_norm: Any
    lr: Any
    elapsed_s: float
    event: Any = None


class StepValues:
    """The per-step buffer between two loss logs (see the module docstring)."""

    def __init__(self) -> None:
        self._watching: Any = None  # a weak reference to the Trainer watched
        self._loss: Any = None  # this step's sum of micro-batch losses so far
        self._norm: Any = None
        self._lr: Any = None
        self.pending: list[PendingStep] = []

    def reset(self) -> None:
        """A new ``train()`` call: nothing pending, no step half summed (an earlier call may have stopped inside a
        step)."""
        self._loss = self._norm = self._lr = None
        self.pending = []

    @property
    def watched(self) -> bool:
        return self._watching is not None and self._watching() is not None

    def watch(self, trainer: Any) -> None:
        """Take each micro-batch's loss and each step's gradient norm as ``trainer`` computes them (once per
        Trainer: attaching again leaves it as it is)."""
        import weakref

        if self._watching is not None and self._watching() is trainer:
            return
        training_step, clip = trainer.training_step, trainer.accelerator.clip_grad_norm_

        @functools.wraps(training_step)
        def watched_training_step(*args: Any, **kwargs: Any) -> Any:
            loss = training_step(*args, **kwargs)
            self.add_loss(loss)
            return loss

        @functools.wraps(clip)
        def watched_clip(*args: Any, **kwargs: Any) -> Any:
            self._norm = clip(*args, **kwargs)
            return self._norm

        trainer.training_step = watched_training_step
        trainer.accelerator.clip_grad_norm_ = watched_clip
        self._watching = weakref.ref(trainer)

    def add_loss(self, loss: Any) -> None:
        """One micro-batch's loss, added as the Trainer adds it to its running sum (which starts from a zero)."""
        import torch

        if self._loss is None:
            self._loss = torch.zeros((), device=loss.device)
        self._loss += loss

    def note_lr(self, scheduler: Any, optimizer: Any) -> None:
        """The rate this step ran at (called after the optimizer's step, before the scheduler's)."""
        try:
            self._lr = scheduler.get_last_lr()[0]
        except (AttributeError, AssertionError, IndexError, TypeError):  # no scheduler, or DeepSpeed before its 1st
            self._lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None

    def end_step(self, step: int, epoch: float | None, tokens: int | None, elapsed_s: float, cuda: bool) -> None:
        """Close the step (at ``on_step_end``): its values join the pending ones, with an event on CUDA."""
        event = None
        if cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.pending.append(PendingStep(step, epoch, tokens, self._loss, self._norm, self._lr, elapsed_s, event))
        self._loss = self._norm = self._lr = None

    def read(self, elapsed_now: float) -> list[dict[str, Any]]:
        """The pending steps as plain numbers (one transfer), oldest first, and forget them. ``elapsed_now``: the
        training clock now; on CUDA each step's ``elapsed_s`` is it minus the GPU time from that step's end to the
        last one's (the host may have run ahead of the GPU when it closed a step)."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        losses, norms, lrs = _to_host([p.loss for p in pending], [p.grad_norm for p in pending],
                                      [p.lr for p in pending])
        last = pending[-1].event
        if last is not None and not last.query():  # done by now: the read above waited for the stream
            last.synchronize()
        rows = []
        for p, loss, norm, lr in zip(pending, losses, norms, lrs, strict=True):
            elapsed = p.elapsed_s
            if last is not None:
                elapsed = elapsed_now - (p.event.elapsed_time(last) / 1e3 if p.event is not None else 0.0)
            rows.append({"step": p.step, "epoch": p.epoch, "tokens": p.tokens, "loss": loss, "grad_norm": norm,
                         "lr": lr, "elapsed_s": elapsed})
        return rows


def _to_host(losses: list[Any], *others: list[Any]) -> list[list[float | None]]:
    """Every list as Python floats (None stays None), all tensors in one device-to-host transfer. The losses are
    averaged over the processes of a distributed run first, in their own dtype, as the Trainer averages its logged
    loss (in one process the very value; over several the same mean, its terms perhaps summed in another order);
    every value then goes through float64, which holds fp32, bf16 and fp64 values exactly."""
    import torch

    lists = [losses, *others]
    out: list[list[Any]] = [[v if v is None or torch.is_tensor(v) else float(v) for v in values] for values in lists]
    parts, where = [], []
    for n, values in enumerate(lists):
        at = [i for i, v in enumerate(values) if torch.is_tensor(v)]
        if not at:
            continue
        if n == 0:  # the Trainer's running sums: one dtype (its float32 zero plus the losses)
            stacked = _mean_over_ranks(torch.stack([values[i].detach().reshape(()) for i in at]))
        else:
            stacked = torch.stack([values[i].detach().reshape(()).to(torch.float64) for i in at])
        parts.append(stacked.to(torch.float64))
        where += [(n, i) for i in at]
    if parts:
        for (n, i), value in zip(where, torch.cat(parts).tolist(), strict=True):
            out[n][i] = value
    return out


def _mean_over_ranks(values: Any) -> Any:
    """``values`` averaged element-wise over the processes (the Trainer's ``nested_gather(loss).mean()``); as they
    are in a single process. Every rank calls it at the same log."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return values
    gathered = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values)
    return torch.stack(gathered).mean(dim=0)
