"""Schedule-free AdamW (Defazio et al. 2024, "The Road Less Scheduled"; facebookresearch/schedule_free): no LR
schedule, and a train/eval mode switch around evaluation and checkpoints.

The switch, :class:`ScheduleFreeModeCallback`, lives in ``schedule_free_impl`` (it subclasses transformers'
TrainerCallback); it is importable from here, loaded on first use so this module stays standard-library only.
"""

from __future__ import annotations

from typing import Any

from hf_optbench.optim.adamw import adamw_base
from hf_optbench.optim.spec import OptimizerSpec, StateLayout, per_tensor

CITATIONS: dict[str, str] = {
    "schedule_free": "Defazio et al. 2024, The Road Less Scheduled; facebookresearch/schedule_free README "
                     "(beta 0.9; AdamW LR 1x-10x the scheduled one -> 1x GPT-3's; warmup via the optimizer; no LR "
                     "schedule). beta2 0.95 and weight decay 0.1 as GPT-3 for comparability",
}


def defaults(size_class: str) -> dict[str, Any]:
    """AdamW's values; the learning rate per the schedule_free README (1x the scheduled AdamW's)."""
    d = adamw_base(size_class)
    d.update(_extra_cite="schedule_free", _derived=("learning_rate",))
    return d


def build(model: Any, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any], **_: Any) -> tuple[Any, str]:
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


def __getattr__(name: str) -> Any:
    """``ScheduleFreeModeCallback`` from ``schedule_free_impl``, imported on first use (PEP 562)."""
    if name == "ScheduleFreeModeCallback":
        from hf_optbench.optim import schedule_free_impl

        return schedule_free_impl.ScheduleFreeModeCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
