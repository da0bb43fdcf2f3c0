"""LR range test (Smith 2017, "Cyclical Learning Rates for Training Neural Networks", Sec. 3.3; seed 003 used
PyTorch Lightning's): train with a learning rate growing exponentially from ``min_lr`` to ``max_lr``, record the
smoothed loss, stop when it diverges, and suggest

* ``suggestion_steepest`` -- the LR where the smoothed loss falls fastest (steepest negative slope vs log LR;
  Lightning's and fastai's "steep" suggestion), and
* ``suggestion_min_div10`` -- the LR of the lowest smoothed loss divided by 10 (fastai's "minimum/10"). Seed 003
  notes Gugger's observation that one-cycle tolerates LRs near the minimum of the curve.

Public API: ``lr_range_test(model, optimizer, batches, *, min_lr, max_lr, num_steps, smooth=0.98,
diverge_factor=4) -> LRFinderResult`` (pure: no Trainer, no recipe; ``optimizer`` is a registry name, an
``Optimizer`` or a ``model -> Optimizer`` callable), and ``find_lr_main(argv)`` for
``hf-optbench find-lr RECIPE.yaml [--key value ...] [--min-lr X --max-lr Y --num-steps N --output DIR]``, which
gets the recipe's model and data from ``run.prepare`` and writes ``lr_finder.json`` and ``lr_finder.png``.

Why written here: the range test lives in PyTorch Lightning and fastai (neither a dependency) and the
torch-lr-finder package (not installed); with Trainer it is 40 lines of loop, and one loop can also drive the
optimizers that need care (schedule-free train mode, Sophia-G's Hessian estimate).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import OptBenchError

if TYPE_CHECKING:
    import torch


@dataclass
class LRFinderResult:
    """LRs tried, raw and smoothed (bias-corrected EMA) losses, and the two suggestions (None if too few points)."""

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    suggestion_steepest: float | None
    suggestion_min_div10: float | None
    diverged_at_step: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def plot(self, path: str | Path, title: str = "LR range test") -> Path:
        """Loss vs LR (log x) with both suggestions marked; PNG via matplotlib's Agg backend."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(self.lrs, self.raw_losses, color="0.75", lw=0.8, label="loss")
        ax.plot(self.lrs, self.losses, color="C0", lw=1.8, label="smoothed loss")
        for lr, color, label in ((self.suggestion_steepest, "C2", "steepest"),
                                 (self.suggestion_min_div10, "C3", "min / 10")):
            if lr is not None:
                ax.axvline(lr, color=color, ls="--", lw=1.2, label=f"{label}: {lr:.2e}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        finite = [v for v in self.losses if math.isfinite(v)]
        if finite:  # keep the diverging tail from flattening the interesting part
            lo, hi = min(finite), min(max(finite), finite[0] * 1.5 if finite[0] > 0 else max(finite))
            ax.set_ylim(lo - 0.05 * abs(hi - lo + 1e-9), hi + 0.05 * abs(hi - lo + 1e-9))
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def suggest(lrs: list[float], smoothed: list[float], skip_begin: int | None = None, skip_end: int = 1
            ) -> tuple[float | None, float | None]:
    """(steepest-descent LR, min-loss LR / 10) from a range test's curve. The first points (warm-up noise of the
    EMA: 10, or 10% on short tests) and the last point are ignored for the steepest slope, as in Lightning."""
    import numpy as np

    n = len(lrs)
    if n < 3:
        return None, None
    losses = np.asarray(smoothed, dtype=float)
    finite = np.isfinite(losses)
    min_idx = int(np.nanargmin(np.where(finite, losses, np.nan))) if finite.any() else None
    min_div10 = lrs[min_idx] / 10 if min_idx is not None else None
    begin = min(10, max(1, n // 10)) if skip_begin is None else skip_begin
    end = n - skip_end
    if end - begin < 3:
        return None, min_div10
    seg = losses[begin:end]
    if not np.isfinite(seg).all():
        stop = int(np.argmin(np.isfinite(seg)))
        seg = seg[:stop]
    if len(seg) < 3:
        return None, min_div10
    grads = np.gradient(seg, np.log10(np.asarray(lrs[begin:begin + len(seg)])))
    return float(lrs[begin + int(np.argmin(grads))]), min_div10


def _cycle(batches: Iterable) -> Iterable:
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
) -> LRFinderResult:
    """Exponential LR ramp ``min_lr`` -> ``max_lr`` over ``num_steps`` optimizer steps on ``batches``.

    The smoothed loss is the bias-corrected EMA with factor ``smooth``; the test stops early once it exceeds
    ``diverge_factor`` x its minimum (or is not finite). The ramped LR is the one the optimizer was built with
    (``learning_rate``); groups with another LR keep their ratio to it (e.g. Muon's ``muon_lr``). With
    ``restore`` the model's weights are put back afterwards.
    """
    import torch

    if not 0 < min_lr < max_lr:
        raise OptBenchError(f"need 0 < min_lr < max_lr, got min_lr={min_lr}, max_lr={max_lr}.")
    if num_steps < 2:
        raise OptBenchError(f"num_steps must be >= 2, got {num_steps}.")
    if not 0 <= smooth < 1:
        raise OptBenchError(f"smooth must be in [0, 1), got {smooth}.")
    if diverge_factor <= 1:
        raise OptBenchError(f"diverge_factor must be > 1, got {diverge_factor}.")
    saved = copy.deepcopy(model.state_dict()) if restore else None
    if isinstance(optimizer, str):
        from .optimizers import build_optimizer

        opt = build_optimizer(optimizer, model, lr=min_lr)
    elif isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    else:
        opt = optimizer(model)
    ref = getattr(opt, "hf_optbench_lr", None) or opt.param_groups[0]["lr"]  # the lr the optimizer was asked for
    ratios = [g["lr"] / ref for g in opt.param_groups]
    if callable(getattr(opt, "train", None)):
        opt.train()  # schedule-free optimizers step only in train mode
    sophia = type(opt).__name__ == "SophiaG"
    device = next(model.parameters()).device
    ctx = (lambda: torch.autocast(device.type, dtype=autocast_dtype)) if autocast_dtype else \
        (lambda: torch.autocast(device.type, enabled=False))
    factor = (max_lr / min_lr) ** (1.0 / (num_steps - 1))
    lrs, losses, raw = [], [], []
    avg, best, diverged = 0.0, math.inf, None
    source = _cycle(batches)
    model.train()
    try:
        for step in range(num_steps):
            lr = min_lr * factor**step
            for g, r in zip(opt.param_groups, ratios, strict=False):
                g["lr"] = lr * r
            opt.zero_grad(set_to_none=True)
            total = 0.0
            inputs = None
            for _ in range(accumulation_steps):
                batch = next(source, None)
                if batch is None:
                    raise OptBenchError(f"lr_range_test ran out of batches after {step} steps; pass more data or "
                                        "fewer num_steps.")
                inputs = _to_inputs(batch, device)
                with ctx():
                    loss = model(**inputs).loss / accumulation_steps
                loss.backward()
                total += float(loss.detach())
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            if sophia and (step + 1) % opt.gnb_update_period == 0:
                from .sophia import gnb_hessian_update

                ids = inputs["input_ids"]
                gnb_hessian_update(model, opt, ids, tokens_per_step=ids.numel() * accumulation_steps,
                                   attention_mask=inputs.get("attention_mask"), autocast_dtype=autocast_dtype)
            avg = smooth * avg + (1 - smooth) * total
            smoothed = avg / (1 - smooth ** (step + 1))
            lrs.append(lr)
            raw.append(total)
            losses.append(smoothed)
            if not math.isfinite(smoothed) or (step > 0 and smoothed > diverge_factor * best):
                diverged = step
                break
            best = min(best, smoothed)
    finally:
        opt.zero_grad(set_to_none=True)
        if saved is not None:
            model.load_state_dict(saved)
    steep, min10 = suggest(lrs, losses)
    return LRFinderResult(lrs=lrs, losses=losses, raw_losses=raw, suggestion_steepest=steep,
                          suggestion_min_div10=min10, diverged_at_step=diverged,
                          settings={"min_lr": min_lr, "max_lr": max_lr, "num_steps": num_steps, "smooth": smooth,
                                    "diverge_factor": diverge_factor, "accumulation_steps": accumulation_steps,
                                    "max_grad_norm": max_grad_norm})


# ----------------------------------------------------------------------------------------------------------------
# hf-optbench find-lr
# ----------------------------------------------------------------------------------------------------------------
_OWN_OPTIONS = {"--min-lr": float, "--max-lr": float, "--num-steps": int, "--output": str, "--smooth": float,
                "--diverge-factor": float}


def _split_own(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Our --min-lr/--max-lr/... out of argv; the rest (recipe and --key value) goes to config.parse_args."""
    own: dict[str, Any] = {}
    rest: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        tok = argv[i]
        key, eq, val = tok.partition("=")
        if key in _OWN_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise OptBenchError(f"{key} needs a value.")
                val = argv[i + 1]
                next(it, None)
            try:
                own[key[2:].replace("-", "_")] = _OWN_OPTIONS[key](val)
            except ValueError as exc:
                raise OptBenchError(f"{key} {val!r}: not a valid {_OWN_OPTIONS[key].__name__}.") from exc
        else:
            rest.append(tok)
    return own, rest


_USAGE = """usage: hf-optbench find-lr RECIPE.yaml [--key value ...] [--min-lr 1e-7] [--max-lr 1] [--num-steps 100]
                           [--output DIR] [--smooth 0.98] [--diverge-factor 4]

LR range test on the recipe's model, data, optimizer, micro-batch, accumulation and clipping. Writes
DIR/lr_finder.json and DIR/lr_finder.png (DIR defaults to <output_dir>/lr_finder) and prints the suggestions."""


def find_lr_main(argv: list[str] | None = None) -> int:
    """``hf-optbench find-lr``: see _USAGE."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    own, rest = _split_own(argv)
    from .config import parse_args
    from .run import prepare, resolve_hyperparameters

    cfg = parse_args(rest)
    import torch
    from torch.utils.data import DataLoader

    from .optimizers import build_optimizer, describe_optimizer

    hparams = resolve_hyperparameters(cfg)  # weight decay / clipping as the run would use them
    targs = cfg.training
    prepared = prepare(cfg)
    model = prepared.model.to(targs.device)
    min_lr = own.get("min_lr", 1e-7)
    opt = build_optimizer(cfg.optim.optimizer, model, lr=min_lr, weight_decay=targs.weight_decay,
                          model_size=cfg.model.model_size, embedding_state_32bit=cfg.optim.embedding_state_32bit,
                          **cfg.optim.kwargs())
    gen = torch.Generator().manual_seed(targs.seed)
    loader = DataLoader(prepared.train_dataset, batch_size=targs.per_device_train_batch_size, shuffle=True,
                        collate_fn=prepared.data_collator, generator=gen, drop_last=True)
    dtype = torch.bfloat16 if targs.bf16 else torch.float16 if targs.fp16 else None
    result = lr_range_test(
        model, opt, loader, min_lr=min_lr, max_lr=own.get("max_lr", 1.0), num_steps=own.get("num_steps", 100),
        smooth=own.get("smooth", 0.98), diverge_factor=own.get("diverge_factor", 4.0),
        accumulation_steps=targs.gradient_accumulation_steps, max_grad_norm=targs.max_grad_norm or None,
        autocast_dtype=dtype, restore=False,
    )
    out = Path(own.get("output") or Path(targs.output_dir) / "lr_finder")
    out.mkdir(parents=True, exist_ok=True)
    record = {"optimizer": cfg.optim.optimizer, "optimizer_impl": describe_optimizer(opt),
              "model_size": cfg.model.model_size, "recipe": cfg.recipe_path,
              "micro_batch_size": targs.per_device_train_batch_size,
              "gradient_accumulation_steps": targs.gradient_accumulation_steps,
              "hyperparameter_sources": {k: v["source"] for k, v in hparams.items()
                                         if k in ("weight_decay", "max_grad_norm")},
              "default_learning_rate": hparams.get("learning_rate", {}).get("value"),
              **result.to_dict()}
    (out / "lr_finder.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    png = result.plot(out / "lr_finder.png", title=f"LR range test: {cfg.optim.optimizer}, {cfg.model.model_size}")
    def fmt(v):
        return (f"{v:.3g}" if v is not None else "n/a")
    print(f"steepest descent: {fmt(result.suggestion_steepest)}   min/10: {fmt(result.suggestion_min_div10)}   "
          f"(registry default: {fmt(record['default_learning_rate'])}; {len(result.lrs)} steps"
          + (f", diverged at step {result.diverged_at_step}" if result.diverged_at_step is not None else "") + ")")
    print(f"wrote {out / 'lr_finder.json'} and {png}")
    return 0
