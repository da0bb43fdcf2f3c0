"""SGD with Nesterov momentum (torch.optim.SGD): the classic baseline; no published GPT-2 recipe, so tune first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "sgd": "No published GPT-2 pretraining recipe for SGD. momentum 0.9 + Nesterov (Sutskever et al. 2013); lr 0.1 "
           "is Goyal et al. 2017's ImageNet base rate, a starting point only -- run find-lr / the tuning grid",
}


def defaults(size_class: str) -> CitedDefaults:
    """Nesterov momentum 0.9 and an ImageNet-style LR; clipping and warmup as AdamW's."""
    base = adamw_base(size_class)
    return base.derive("sgd", drop=("betas", "eps"), learning_rate=0.1, weight_decay=0.0, momentum=0.9,
                       nesterov=True)


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """torch.optim.SGD with the cited momentum."""
    import torch

    opt = torch.optim.SGD(groups, lr=lr, **ctor)
    return opt, f"torch.optim.SGD(momentum={opt.defaults['momentum']}, nesterov={opt.defaults['nesterov']})"


def momentum_tensor_bytes(p: Any, s: int) -> int:
    """One ``momentum_buffer`` like the parameter."""
    return s * p.numel


LAYOUT = StateLayout("sgd_momentum", per_tensor(momentum_tensor_bytes))

SPECS = (
    OptimizerSpec("sgd", "torch.optim.SGD", build, defaults, ("momentum", "dampening", "nesterov", "foreach", "fused"),
                  "SGD with Nesterov momentum; no published GPT-2 recipe (tune the LR first)", LAYOUT,
                  needs_tuning=True, aliases=("sgd_momentum",)),
)
