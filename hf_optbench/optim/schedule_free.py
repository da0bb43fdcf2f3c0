"""Schedule-free AdamW (Defazio et al. 2024, "The Road Less Scheduled"; facebookresearch/schedule_free): no LR
schedule, and a train/eval mode switch around evaluation and checkpoints.

The switch, :class:`ScheduleFreeModeCallback`, lives in ``schedule_free_impl`` (it subclasses transformers'
TrainerCallback),
so that this module stays standard-library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "schedule_free": "Defazio et al. 2024, The Road Less Scheduled; facebookresearch/schedule_free README "
                     "(beta 0.9; AdamW LR 1x-10x the scheduled one -> 1x GPT-3's; warmup via the optimizer; no LR "
                     "schedule). beta2 0.95 and weight decay 0.1 as GPT-3 for comparability",
}


def defaults(size_class: str) -> CitedDefaults:
    """AdamW's values; the learning rate per the schedule_free README (1x the scheduled AdamW's)."""
    base = adamw_base(size_class)
    return base.derive("schedule_free", learning_rate=base.values["learning_rate"])


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """schedulefree.AdamWScheduleFree."""
    from schedulefree import AdamWScheduleFree

    return AdamWScheduleFree(groups, lr=lr, **ctor), "schedulefree.AdamWScheduleFree"


def mode_callbacks() -> list[Any]:
    """The Trainer callbacks every schedule-free optimizer needs (also used for dotted-path ones)."""
    from hf_optbench.optim.schedule_free_impl import ScheduleFreeModeCallback

    return [ScheduleFreeModeCallback()]


def schedule_free_tensor_bytes(p: Any, s: int) -> int:
    """``z`` + ``exp_avg_sq`` like the parameter; the step count lives in the param group
    (facebookresearch/schedule_free ``AdamWScheduleFree``)."""
    return 2 * s * p.numel


LAYOUT = StateLayout("schedule_free_adamw", per_tensor(schedule_free_tensor_bytes))

SPECS = (
    OptimizerSpec("schedule_free_adamw", "schedulefree.AdamWScheduleFree", build, defaults,
                  ("betas", "eps", "warmup_steps", "r", "weight_lr_power", "foreach"),
                  "Schedule-free AdamW (Defazio et al. 2024): no LR schedule; optimizer.train()/eval() around "
                  "evaluation and checkpoints (ScheduleFreeModeCallback)", LAYOUT, package="schedulefree",
                  schedule_free=True, callbacks=mode_callbacks, aliases=("adamw_schedulefree", "sf_adamw"),
                  zero_incompatible="its train()/eval() switch moves the weights the optimizer holds, which under ZeRO "
                  "are DeepSpeed's fp32 master partitions, not the model's: evaluation and checkpoints would see the "
                  "training iterate y instead of the average x"),
)
