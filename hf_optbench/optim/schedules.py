"""Learning-rate schedules, built from transformers' and torch's own schedulers.

Public API:

* ``SCHEDULES`` -- name -> (description, accepted schedule_kwargs); standard library only, for config validation.
* ``build_scheduler(name, optimizer, *, num_training_steps, warmup_steps, min_lr_ratio=0.1, **kwargs)
  -> torch.optim.lr_scheduler.LRScheduler``. ``warmup_steps``: an int (or integral float >= 1) is a number of
  steps, a float in [0, 1) a fraction of ``num_training_steps`` (transformers 5's TrainingArguments convention).
  The returned scheduler carries ``hf_optbench_schedule``: the schedule and its resolved parameters, for
  summary.json (:func:`describe_scheduler`).
* ``resolve_warmup_steps(warmup_steps, num_training_steps) -> int``; ``check_schedule_kwargs(name, kwargs)``.

Schedules:

* ``gpt3_cosine`` -- linear warmup, cosine decay to ``min_lr_ratio`` x peak at the last step (GPT-3, Brown et al.
  2020, App. B: "cosine decay for learning rate down to 10% of its value"); transformers'
  ``get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate=...)``.
* ``wsd`` -- warmup-stable-decay; transformers' ``get_wsd_schedule``. Defaults: the last 20% of steps decay with
  the 1-sqrt shape, which matched cosine in Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond
  Fixed Training Durations", arXiv:2405.18392), down to ``min_lr_ratio``.
* ``one_cycle`` -- torch's ``OneCycleLR`` (Smith & Topin 2017, "Super-Convergence"): warm up from peak/25 to the
  peak over ``warmup_steps`` (else 30% of the run, torch's default), cosine down to peak/(25*1e4). Momentum
  cycling is off by default so that the only difference from the other schedules is the LR curve
  (``cycle_momentum: true`` turns it on). ``min_lr_ratio`` does not apply (its end is ``final_div_factor``).
* ``constant_with_warmup`` -- transformers' ``get_constant_schedule_with_warmup``.
* ``constant`` / ``none`` -- the optimizer's LR throughout (``get_constant_schedule``). A warmup with these is an
  error (use constant_with_warmup), except for schedule-free optimizers: their warmup is the optimizer's own
  (``warmup_steps`` of ``schedulefree.AdamWScheduleFree``), so it is handed to the optimizer.

Schedule-free optimizers accept only ``constant``/``none``: a decaying schedule would defeat their purpose.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError, suggest

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler

# name -> (one-line description, accepted schedule_kwargs)
SCHEDULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpt3_cosine": ("linear warmup, cosine to min_lr_ratio x peak (GPT-3)", ("num_cycles",)),
    "wsd": ("warmup, constant, then decay over the last decay_ratio of steps (default 0.2, 1-sqrt)",
            ("decay_ratio", "decay_type", "warmup_type")),
    "one_cycle": ("torch OneCycleLR: peak/25 -> peak -> peak/(25*1e4) (Smith & Topin 2017)",
                  ("pct_start", "div_factor", "final_div_factor", "anneal_strategy", "cycle_momentum",
                   "base_momentum", "max_momentum", "three_phase")),
    "constant_with_warmup": ("linear warmup, then constant", ()),
    "constant": ("the optimizer's learning rate throughout (no warmup)", ()),
    "none": ("no schedule: the optimizer's learning rate throughout (schedule-free optimizers)", ()),
}
SCHEDULE_FREE_OK = ("constant", "none")


def check_schedule_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """OptBenchError for an unknown schedule or a schedule_kwargs key it does not take."""
    if name not in SCHEDULES:
        hint = suggest(name, SCHEDULES, cutoff=0.6)
        raise OptBenchError(f"unknown schedule '{name}'.{hint} Choose one of: {', '.join(SCHEDULES)}.")
    accepted = SCHEDULES[name][1]
    for key in kwargs:
        if key not in accepted:
            hint = suggest(key, accepted, cutoff=0.6)
            raise OptBenchError(
                f"schedule_kwargs '{key}' is not an option of schedule '{name}'.{hint} "
                f"It takes: {', '.join(accepted) or 'none (warmup is warmup_steps, the floor min_lr_ratio)'}."
            )


def resolve_warmup_steps(warmup_steps: float | int, num_training_steps: int) -> int:
    """Steps of warmup: an int (or integral float >= 1) is steps, a float in [0, 1) a fraction of the run."""
    if warmup_steps is None:
        return 0
    w = float(warmup_steps)
    if w < 0 or math.isnan(w):
        raise OptBenchError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if w < 1:
        return int(math.ceil(w * num_training_steps)) if w > 0 else 0
    if w != int(w):
        raise OptBenchError(
            f"warmup_steps {warmup_steps} is neither a step count (integer) nor a fraction in [0, 1)."
        )
    return int(w)


def _is_schedule_free(optimizer: Any) -> bool:
    from hf_optbench.optim.registry import is_schedule_free

    return is_schedule_free(optimizer)


def _wsd(optimizer: Any, warmup: int, num_training_steps: int, min_lr_ratio: float, kwargs: dict[str, Any],
         record: dict[str, Any]) -> Any:
    """transformers' warmup-stable-decay schedule; fills ``record`` with its resolved parameters."""
    from transformers.optimization import get_wsd_schedule

    decay_ratio = float(kwargs.get("decay_ratio", 0.2))
    if not 0.0 < decay_ratio <= 1.0:
        raise OptBenchError(f"schedule_kwargs decay_ratio must be in (0, 1], got {decay_ratio}.")
    decay = int(round(decay_ratio * num_training_steps))
    if warmup + decay > num_training_steps:
        raise OptBenchError(
            f"wsd: warmup ({warmup}) + decay ({decay}) steps exceed the run ({num_training_steps}); lower "
            "warmup_steps or schedule_kwargs decay_ratio."
        )
    decay_type = kwargs.get("decay_type", "1-sqrt")
    warmup_type = kwargs.get("warmup_type", "linear")
    try:
        sched = get_wsd_schedule(
            optimizer, num_warmup_steps=warmup, num_decay_steps=decay, num_training_steps=num_training_steps,
            warmup_type=warmup_type, decay_type=decay_type, min_lr_ratio=min_lr_ratio,
        )
    except ValueError as exc:
        raise OptBenchError(f"wsd schedule_kwargs: {exc}") from exc
    record.update(min_lr_ratio=min_lr_ratio, decay_steps=decay, decay_ratio=decay_ratio, decay_type=decay_type,
                  warmup_type=warmup_type)
    return sched


def _one_cycle(optimizer: Any, warmup: int, num_training_steps: int, kwargs: dict[str, Any],
               record: dict[str, Any]) -> Any:
    """torch's OneCycleLR with momentum cycling off unless asked; fills ``record``."""
    from torch.optim.lr_scheduler import OneCycleLR

    opts = {"anneal_strategy": "cos", "cycle_momentum": False, "div_factor": 25.0, "final_div_factor": 1e4}
    opts.update(kwargs)
    if "pct_start" in kwargs and warmup:
        raise OptBenchError(
            "one_cycle: both warmup_steps and schedule_kwargs pct_start set the warmup; keep one of them."
        )
    if "pct_start" not in opts:
        opts["pct_start"] = warmup / num_training_steps if warmup else 0.3
    if opts.get("cycle_momentum") and not any(k in optimizer.defaults for k in ("momentum", "betas")):
        raise OptBenchError("one_cycle cycle_momentum=true needs an optimizer with momentum or betas.")
    sched = OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups],
                       total_steps=num_training_steps, **opts)
    record.update(opts)
    record["warmup_steps"] = int(round(opts["pct_start"] * num_training_steps))
    return sched


def build_scheduler(
    name: str,
    optimizer: torch.optim.Optimizer,
    *,
    num_training_steps: int,
    warmup_steps: float | int = 0,
    min_lr_ratio: float = 0.1,
    **kwargs: Any,
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR scheduler ``name`` for ``optimizer`` over ``num_training_steps`` optimizer steps (see module doc)."""
    from transformers.optimization import (
        get_constant_schedule,
        get_constant_schedule_with_warmup,
        get_cosine_with_min_lr_schedule_with_warmup,
    )

    check_schedule_kwargs(name, kwargs)
    if num_training_steps is None or num_training_steps <= 0:
        raise OptBenchError(f"num_training_steps must be positive, got {num_training_steps} (set max_steps).")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise OptBenchError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}.")
    warmup = resolve_warmup_steps(warmup_steps, num_training_steps)
    if warmup > num_training_steps:
        raise OptBenchError(
            f"warmup of {warmup} steps is longer than the run ({num_training_steps} steps): lower warmup_steps."
        )
    record: dict[str, Any] = {"name": name, "num_training_steps": int(num_training_steps), "warmup_steps": warmup}
    schedule_free = _is_schedule_free(optimizer)
    if schedule_free and name not in SCHEDULE_FREE_OK:
        raise OptBenchError(
            f"schedule '{name}' with a schedule-free optimizer: it needs no LR schedule (Defazio et al. 2024). "
            "Use schedule: none (its warmup is done by the optimizer)."
        )

    if name == "gpt3_cosine":
        num_cycles = float(kwargs.get("num_cycles", 0.5))
        sched = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=num_training_steps, num_cycles=num_cycles,
            min_lr_rate=min_lr_ratio,
        )
        record.update(min_lr_ratio=min_lr_ratio, num_cycles=num_cycles)
    elif name == "wsd":
        sched = _wsd(optimizer, warmup, num_training_steps, min_lr_ratio, kwargs, record)
    elif name == "one_cycle":
        sched = _one_cycle(optimizer, warmup, num_training_steps, kwargs, record)
    elif name == "constant_with_warmup":
        sched = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    else:  # constant / none
        if warmup:
            if not schedule_free:
                raise OptBenchError(
                    f"schedule '{name}' has no warmup but warmup_steps is {warmup_steps}: use "
                    "constant_with_warmup, or set warmup_steps 0."
                )
            _hand_warmup_to_optimizer(optimizer, warmup)
            record["warmup_by"] = "optimizer"
        sched = get_constant_schedule(optimizer)
    sched.hf_optbench_schedule = record
    return sched


def _hand_warmup_to_optimizer(optimizer: Any, warmup: int) -> None:
    """Schedule-free AdamW warms up itself (its ``warmup_steps`` group option): set it, unless set otherwise."""
    from hf_optbench.optim.unwrap import innermost_optimizer

    groups = innermost_optimizer(optimizer).param_groups
    if not all("warmup_steps" in g for g in groups):
        raise OptBenchError("this schedule-free optimizer has no warmup_steps option: set warmup_steps 0.")
    for g in groups:
        if g["warmup_steps"] not in (0, warmup):
            raise OptBenchError(
                f"warmup given twice: optimizer_kwargs warmup_steps={g['warmup_steps']} and warmup_steps={warmup}. "
                "Keep one."
            )
        g["warmup_steps"] = warmup


def describe_scheduler(scheduler: LRScheduler | None) -> dict[str, Any]:
    """The schedule and its resolved parameters (for summary.json); {} for a scheduler not built here."""
    return dict(getattr(scheduler, "hf_optbench_schedule", {}))
