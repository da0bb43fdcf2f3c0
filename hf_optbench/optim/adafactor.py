"""Adafactor (Shazeer & Stern 2018) as transformers.optimization.Adafactor, driven by an external LR schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor, with_note

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "adafactor": "Shazeer & Stern 2018, Adafactor (decay_rate -0.8, clip_threshold 1.0, eps (1e-30, 1e-3), beta1 "
                 "None = no first moment); transformers Adafactor docs (external LR: scale_parameter=False, "
                 "relative_step=False, warmup_init=False). No published GPT-2 Adafactor LR: AdamW's GPT-3 value is "
                 "used (with parameter scaling off the step is Adam-sized) -- tune it",
}


def defaults(size_class: str) -> CitedDefaults:
    """The paper's factorisation settings; AdamW's LR and weight decay (none published for GPT-2)."""
    base = adamw_base(size_class)
    return base.derive("adafactor", drop=("betas",), beta1=None, decay_rate=-0.8, clip_threshold=1.0,
                       eps=(1e-30, 1e-3), learning_rate=base.values["learning_rate"])


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """transformers' Adafactor with the LR given from outside (relative_step and warmup_init off)."""
    from transformers.optimization import Adafactor

    ctor.setdefault("scale_parameter", False)
    opt = Adafactor(groups, lr=lr, relative_step=False, warmup_init=False, **ctor)
    return opt, f"transformers.Adafactor(beta1={ctor.get('beta1')}, external lr)"


def adafactor_tensor_bytes(p: Any, s: int) -> int:
    """No first moment: a row and a column vector for tensors of >= 2 dims, a full second moment for 1-D ones,
    plus one 4-byte scalar (step or RMS) per tensor (Shazeer & Stern 2018; transformers Adafactor)."""
    if len(p.shape) >= 2:
        rows = math.prod(p.shape[:-1])
        cols = math.prod(p.shape[:-2]) * p.shape[-1]
        return s * (rows + cols) + 4
    return s * p.numel + 4


def describe(opt: Any, built: str, flattened: bool, **_: Any) -> str:
    """How many tensors really keep a factored second moment (``exp_avg_sq_row``): under ZeRO the optimizer holds
    1-D partitions, so none does."""
    held = [opt.state[p] for g in opt.param_groups for p in g["params"] if p in opt.state]
    factored = sum("exp_avg_sq_row" in st for st in held)
    if not held:
        return built
    where = ", ZeRO flat partitions" if flattened else ""
    return with_note(built, f"second moment factored on {factored} of {len(held)} tensors{where}")


LAYOUT = StateLayout("adafactor", per_tensor(adafactor_tensor_bytes), per_tensor=True)

_EXTERNAL_LR = "is fixed: the benchmark drives Adafactor's LR with an external schedule " \
               "(relative_step=False, warmup_init=False)"

SPECS = (
    OptimizerSpec("adafactor", "transformers.optimization.Adafactor", build, defaults,
                  ("eps", "clip_threshold", "decay_rate", "beta1", "scale_parameter"),
                  "Adafactor (Shazeer & Stern 2018): factored second moment, no first moment by default, "
                  "external LR schedule", LAYOUT, package="transformers", needs_tuning=True, describe=describe,
                  rejected_kwargs={"relative_step": _EXTERNAL_LR, "warmup_init": _EXTERNAL_LR,
                                   "lr": "is learning_rate"}),
)
