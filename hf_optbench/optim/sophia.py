"""Sophia-G (Liu et al. 2023, arXiv:2305.14342; github.com/Liuhong99/Sophia): a clipped diagonal second-order
update with a Gauss-Newton-Bartlett Hessian estimate every k steps.

The optimizer (:class:`SophiaG`), :func:`gnb_hessian_update` and the :class:`SophiaGHessianCallback` that runs it
inside Trainer live in ``sophia_impl`` (torch and pytorch-optimizer at import),
so that this module stays standard-library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor

if TYPE_CHECKING:
    import torch

# Liuhong99/Sophia at commit a7e157229b71d58cf995d32854f1be15c265b350 (main, 2024-01-29; read from a clone of the
# repository): the README table "Hyperparameters for GPT-2 models" and config/train_gpt2_{small,medium,large}_
# sophiag.py agree at that commit (earlier commits had other values, e.g. rho 0.03 / lr 3e-4 at 125M).
SOPHIA_COMMIT = "a7e157229b71d58cf995d32854f1be15c265b350"
CITATIONS: dict[str, str] = {
    "sophia": f"Liu et al. 2023, Sophia (arXiv:2305.14342); Liuhong99/Sophia@{SOPHIA_COMMIT[:7]} README 'Hyperparameters "
              "for GPT-2 models' = config/train_gpt2_{small,medium,large}_sophiag.py ((lr, rho) = (6e-4, 0.05) at "
              "125M, (7e-4, 0.08) at 355M, (3e-4, 0.05) at 770M; weight decay 0.2, betas (0.965, 0.99), interval "
              "k=10, clip 1.0) and sophia.py (eps 1e-15); sizes outside the table: lr about AdamW's (README rule) and "
              "rho 0.05 ('all other hyperparameters are transferable')",
}

# (lr, rho) per GPT-2 size class from the table above.
SOPHIA_LR_RHO = {"125M": (6e-4, 0.05), "350M": (7e-4, 0.08), "760M": (3e-4, 0.05)}
SOPHIA_TRANSFER_RHO = 0.05  # the 125M and 770M rows' rho, used where the table has no row


def defaults(size_class: str) -> CitedDefaults:
    """The Sophia repository's per-size (lr, rho); where it has no row (the CPU sizes, 1.3B) the README's rule:
    lr "about the same as the learning rate that you would use for AdamW" (AdamW's cited default for the size)
    and the transferable rho. Clipping and warmup as AdamW's."""
    base = adamw_base(size_class)
    lr, rho = SOPHIA_LR_RHO.get(size_class, (base.values["learning_rate"], SOPHIA_TRANSFER_RHO))
    return base.derive("sophia", learning_rate=lr, weight_decay=0.2, betas=(0.965, 0.99), rho=rho,
                       update_period=10, eps=1e-15)


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """hf_optbench's SophiaG (pytorch_optimizer.SophiaH's update, our GNB estimate)."""
    from hf_optbench.optim.sophia_impl import SophiaG

    opt = SophiaG(groups, lr=lr, **ctor)
    return opt, f"hf_optbench.optim.sophia_impl.SophiaG(pytorch_optimizer.SophiaH update, GNB Hessian every " \
                f"{opt.gnb_update_period} steps)"


def hessian_callbacks() -> list[Any]:
    """Sophia-G's Hessian estimate every k steps, as a Trainer callback."""
    from hf_optbench.optim.sophia_impl import SophiaGHessianCallback

    return [SophiaGHessianCallback()]


def manual_step(model: torch.nn.Module, opt: Any, inputs: dict[str, Any], *, step: int, accumulation_steps: int,
                autocast_dtype: Any) -> None:
    """What a loop outside the Trainer (the learning-rate finder) runs after step ``step``: the Hessian estimate
    every ``update_period`` steps, as the Trainer callback does."""
    if (step + 1) % opt.gnb_update_period:
        return
    from hf_optbench.optim.sophia_impl import gnb_hessian_update

    ids = inputs["input_ids"]
    gnb_hessian_update(model, opt, ids, tokens_per_step=ids.numel() * accumulation_steps,
                       attention_mask=inputs.get("attention_mask"), autocast_dtype=autocast_dtype)


def sophia_tensor_bytes(p: Any, s: int) -> int:
    """``momentum`` + ``hessian_moment`` like the parameter (SophiaG drops SophiaH's ``hessian`` alias)."""
    return 2 * s * p.numel


LAYOUT = StateLayout("sophia", per_tensor(sophia_tensor_bytes))

SPECS = (
    OptimizerSpec("sophia", "hf_optbench.optim.sophia_impl.SophiaG", build, defaults, ("betas", "rho", "update_period", "eps"),
                  "Sophia-G (Liu et al. 2023): pytorch_optimizer.SophiaH's clipped update fed with the "
                  "Gauss-Newton-Bartlett Hessian estimate every k steps (SophiaGHessianCallback)", LAYOUT,
                  package="pytorch-optimizer", callbacks=hessian_callbacks, aliases=("sophiag", "sophia_g"),
                  zero_incompatible="its Gauss-Newton-Bartlett Hessian estimate backpropagates outside DeepSpeed's "
                  "engine and reads the gradients of the optimizer's parameters, which under ZeRO are flat fp32 "
                  "partitions that only DeepSpeed's own step gives a gradient, so no estimate would reach the "
                  "Hessian and Sophia would run as sign momentum", tune_weight_decay=True, manual_step=manual_step),
)
