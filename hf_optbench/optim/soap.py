"""SOAP (Vyas et al. 2024, arXiv:2409.11321): Adam in Shampoo's eigenbasis, as pytorch_optimizer.SOAP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "soap": "Vyas et al. 2024, SOAP (arXiv:2409.11321); nikhilvyas/SOAP README (lr 3e-3, betas (0.95, 0.95), "
            "weight_decay 0.01, precondition_frequency 10); no per-size table published",
}

SOAP_MAX_PRECONDITION_DIM = 10_000  # pytorch_optimizer.SOAP default: larger dims get no preconditioner


def defaults(size_class: str) -> CitedDefaults:
    """The SOAP README's values (one setting for all sizes); clipping and warmup as AdamW's."""
    base = adamw_base(size_class)
    return base.derive("soap", drop=("eps",), learning_rate=3e-3, weight_decay=0.01, betas=(0.95, 0.95),
                       precondition_frequency=10)


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """pytorch_optimizer.SOAP."""
    from pytorch_optimizer import SOAP

    return SOAP(groups, lr=lr, **ctor), "pytorch_optimizer.SOAP"


def soap_tensor_bytes(p: Any, s: int) -> int:
    """pytorch_optimizer.SOAP defaults: Adam's two moments plus, per dimension d <= 10,000 of each >= 2-D tensor,
    a d x d statistic ``GG`` and its eigenbasis ``Q`` (1-D tensors are not preconditioned)."""
    dims = p.shape if len(p.shape) >= 2 else ()
    return 2 * s * p.numel + 2 * s * sum(d * d for d in dims if d <= SOAP_MAX_PRECONDITION_DIM)


LAYOUT = StateLayout("soap", per_tensor(soap_tensor_bytes))

SPECS = (
    OptimizerSpec("soap", "pytorch_optimizer.SOAP", build, defaults,
                  ("betas", "shampoo_beta", "eps", "precondition_frequency", "max_precondition_dim",
                   "merge_dims", "precondition_1d", "correct_bias", "normalize_gradient"),
                  "SOAP (Vyas et al. 2024): Adam in Shampoo's eigenbasis (pytorch-optimizer)", LAYOUT,
                  package="pytorch-optimizer",
                  zero_incompatible="ZeRO hands the optimizer 1-D flat partitions, on which SOAP keeps no Shampoo "
                  "preconditioner and silently runs as AdamW (measured: only exp_avg and exp_avg_sq state)",
                  tune_weight_decay=True),
)
