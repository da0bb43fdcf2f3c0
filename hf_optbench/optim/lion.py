"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") from lucidrains/lion-pytorch: the
per-tensor loop (``lion``) and the same update with torch._foreach ops (``lion_foreach``)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import (
    CitedDefaults,
    OptimizerSpec,
    StateLayout,
    per_tensor,
    round3,
    trainable_params,
)

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "lion": "Chen et al. 2023, Symbolic Discovery of Optimization Algorithms, Sec. 5 (lr 3-10x smaller and decoupled "
            "weight decay 3-10x larger than AdamW; default betas (0.9, 0.99)); lucidrains/lion-pytorch README "
            "(updates 3-4: 3x smaller than AdamW beat AdamW on LM, 10x was worst) -> lr = AdamW/3, wd = AdamW*3",
}


def defaults(size_class: str) -> CitedDefaults:
    """AdamW's values with lr / 3 and weight decay x 3 (the Lion paper's and README's rule)."""
    base = adamw_base(size_class)
    return base.derive("lion", drop=("eps",), learning_rate=round3(base.values["learning_rate"] / 3),
                       weight_decay=round3(base.values["weight_decay"] * 3), betas=(0.9, 0.99))


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """lion_pytorch.Lion; ``use_triton`` is checked first because lion-pytorch's triton module calls exit() when
    the triton package is missing (measured here: the process ends instead of raising)."""
    from lion_pytorch import Lion

    if ctor.get("use_triton"):
        if importlib.util.find_spec("triton") is None or not all(p.is_cuda for p in trainable_params(model)):
            raise OptBenchError("optimizer_kwargs use_triton=true needs CUDA parameters and the triton package; "
                                "drop it (the default per-tensor update) or run on a GPU with triton installed.")
    opt = Lion(groups, lr=lr, **ctor)
    return opt, "lion_pytorch.Lion(triton)" if ctor.get("use_triton") else "lion_pytorch.Lion"


def build_foreach(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
                  **_: Any) -> tuple[Any, str]:
    """lion_pytorch.foreach.Lion (lion-pytorch's own foreach variant)."""
    from lion_pytorch.foreach import Lion

    return Lion(groups, lr=lr, **ctor), "lion_pytorch.foreach.Lion"


def lion_tensor_bytes(p: Any, s: int) -> int:
    """One ``exp_avg`` like the parameter (Chen et al. 2023, Alg. 2; lion-pytorch)."""
    return s * p.numel


LAYOUT = StateLayout("lion", per_tensor(lion_tensor_bytes))

SPECS = (
    OptimizerSpec("lion", "lion_pytorch.Lion", build, defaults, ("betas", "use_triton", "decoupled_weight_decay"),
                  "Lion (Chen et al. 2023), lucidrains' per-tensor loop; use_triton=True needs CUDA + triton",
                  LAYOUT, package="lion-pytorch", aliases=("lion_pytorch",), tune_weight_decay=True),
    OptimizerSpec("lion_foreach", "lion_pytorch.foreach.Lion", build_foreach, defaults,
                  ("betas", "decoupled_weight_decay"),
                  "the same Lion update with torch._foreach ops (lion-pytorch's own foreach variant)",
                  LAYOUT, package="lion-pytorch", tune_weight_decay=True),
)
