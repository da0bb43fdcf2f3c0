"""Learning-rate schedules, built from transformers' and torch's own schedulers.

Public API:

* ``SCHEDULES`` -- name -> (description, accepted schedule_kwargs); standard library only, for config validation.
* ``resolve_schedule(name, *, num_training_steps, warmup_steps, min_lr_ratio=0.1, schedule_free=False,
  **kwargs) -> dict``: the schedule and its resolved parameters, checked, without building anything (a run's plan
  holds it). ``warmup_steps``: an int (or integral float >= 1) is a number of steps, a float in [0, 1) a fraction
  of ``num_training_steps`` (transformers 5's TrainingArguments convention).
* ``build_scheduler(name, optimizer, *, num_training_steps, warmup_steps, min_lr_ratio=0.1, **kwargs)
  -> torch.optim.lr_scheduler.LRScheduler``: the same, built over ``optimizer``.
* ``describe_scheduler(scheduler) -> dict``: the schedule a built scheduler computes, read from the object (its
  transformers lambda and that lambda's arguments, or torch's OneCycleLR), whoever built it.
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
* ``cosine`` -- transformers' ``cosine`` (``get_cosine_schedule_with_warmup``): linear warmup, cosine to 0. What a
  recipe's ``lr_scheduler_type: cosine`` means (TRL and alignment-handbook recipes); not GPT-3's floor.
* ``linear`` -- transformers' ``linear`` (``get_linear_schedule_with_warmup``, TrainingArguments' default): linear
  warmup, linear decay to 0.
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

# name -> (one-line description, accepted schedule_kwargs)
SCHEDULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpt3_cosine": ("linear warmup, cosine to min_lr_ratio x peak (GPT-3)", ("num_cycles",)),
    "wsd": ("warmup, constant, then decay over the last decay_ratio of steps (default 0.2, 1-sqrt)",
            ("decay_ratio", "decay_type", "warmup_type")),
    "one_cycle": ("torch OneCycleLR: peak/25 -> peak -> peak/(25*1e4) (Smith & Topin 2017)",
                  ("pct_start", "div_factor", "final_div_factor", "anneal_strategy", "cycle_momentum",
                   "base_momentum", "max_momentum", "three_phase")),
    "cosine": ("transformers' cosine: linear warmup, cosine to 0", ("num_cycles",)),
    "linear": ("transformers' linear: linear warmup, linear decay to 0", ()),
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


def _wsd_record(warmup: int, num_training_steps: int, min_lr_ratio: float, kwargs: dict[str, Any]) -> dict[str, Any]:
    decay_ratio = float(kwargs.get("decay_ratio", 0.2))
    if not 0.0 < decay_ratio <= 1.0:
        raise OptBenchError(f"schedule_kwargs decay_ratio must be in (0, 1], got {decay_ratio}.")
    decay = int(round(decay_ratio * num_training_steps))
    if warmup + decay > num_training_steps:
        raise OptBenchError(
            f"wsd: warmup ({warmup}) + decay ({decay}) steps exceed the run ({num_training_steps}); lower "
            "warmup_steps or schedule_kwargs decay_ratio."
        )
    kinds = ("linear", "cosine", "1-sqrt")  # transformers' get_wsd_schedule's warmup and decay shapes
    decay_type, warmup_type = kwargs.get("decay_type", "1-sqrt"), kwargs.get("warmup_type", "linear")
    for key, value in (("decay_type", decay_type), ("warmup_type", warmup_type)):
        if value not in kinds:
            raise OptBenchError(f"wsd schedule_kwargs {key} must be one of {', '.join(kinds)}, got {value!r}.")
    return {"min_lr_ratio": min_lr_ratio, "decay_steps": decay, "decay_ratio": decay_ratio, "decay_type": decay_type,
            "warmup_type": warmup_type}


def _one_cycle_record(warmup: int, num_training_steps: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    opts = {"anneal_strategy": "cos", "cycle_momentum": False, "div_factor": 25.0, "final_div_factor": 1e4}
    opts.update(kwargs)
    if "pct_start" in kwargs and warmup:
        raise OptBenchError(
            "one_cycle: both warmup_steps and schedule_kwargs pct_start set the warmup; keep one of them."
        )
    if "pct_start" not in opts:
        opts["pct_start"] = warmup / num_training_steps if warmup else 0.3
    return {**opts, "warmup_steps": int(round(opts["pct_start"] * num_training_steps))}


def resolve_schedule(name: str, *, num_training_steps: int, warmup_steps: float | int = 0, min_lr_ratio: float = 0.1,
                     schedule_free: bool = False, **kwargs: Any) -> dict[str, Any]:
    """The schedule ``name`` with every parameter resolved and checked (see the module doc), as a record:
    ``name``, ``num_training_steps``, ``warmup_steps`` (steps) and the schedule's own (``min_lr_ratio``,
    ``num_cycles``, ``decay_steps``...); ``warmup_by: "optimizer"`` when a schedule-free optimizer warms up itself.
    Nothing is built: a run's plan holds this record, and :func:`build_scheduler` builds from it."""
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
    if schedule_free and name not in SCHEDULE_FREE_OK:
        raise OptBenchError(
            f"schedule '{name}' with a schedule-free optimizer: it needs no LR schedule (Defazio et al. 2024). "
            "Use schedule: none (its warmup is done by the optimizer)."
        )
    record: dict[str, Any] = {"name": name, "num_training_steps": int(num_training_steps), "warmup_steps": warmup}
    if name == "gpt3_cosine":
        record.update(min_lr_ratio=min_lr_ratio, num_cycles=float(kwargs.get("num_cycles", 0.5)))
    elif name == "cosine":
        record.update(num_cycles=float(kwargs.get("num_cycles", 0.5)))
    elif name == "wsd":
        record.update(_wsd_record(warmup, num_training_steps, min_lr_ratio, kwargs))
    elif name == "one_cycle":
        record.update(_one_cycle_record(warmup, num_training_steps, kwargs))
    elif name in ("constant", "none") and warmup:
        if not schedule_free:
            raise OptBenchError(
                f"schedule '{name}' has no warmup but warmup_steps is {warmup_steps}: use constant_with_warmup, or "
                "set warmup_steps 0."
            )
        record["warmup_by"] = "optimizer"
    return record


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
    from hf_optbench.optim.registry import is_schedule_free

    record = resolve_schedule(name, num_training_steps=num_training_steps, warmup_steps=warmup_steps,
                              min_lr_ratio=min_lr_ratio, schedule_free=is_schedule_free(optimizer), **kwargs)
    if record.get("warmup_by") == "optimizer":
        _hand_warmup_to_optimizer(optimizer, record["warmup_steps"])
    return scheduler_from_record(record, optimizer)


def scheduler_from_record(record: dict[str, Any], optimizer: Any) -> Any:
    """The scheduler a :func:`resolve_schedule` record describes, over ``optimizer``: transformers' schedule
    functions (the same a stock Trainer builds from ``lr_scheduler_type``), torch's OneCycleLR for one_cycle."""
    from transformers import optimization as tf

    name, warmup, steps = record["name"], record["warmup_steps"], record["num_training_steps"]
    if name == "gpt3_cosine":
        return tf.get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=steps, num_cycles=record["num_cycles"],
            min_lr_rate=record["min_lr_ratio"])
    if name == "cosine":
        return tf.get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=steps,
                                                  num_cycles=record["num_cycles"])
    if name == "linear":
        return tf.get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    if name == "wsd":
        return tf.get_wsd_schedule(optimizer, num_warmup_steps=warmup, num_decay_steps=record["decay_steps"],
                                   num_training_steps=steps, warmup_type=record["warmup_type"],
                                   decay_type=record["decay_type"], min_lr_ratio=record["min_lr_ratio"])
    if name == "one_cycle":
        from torch.optim.lr_scheduler import OneCycleLR

        opts = {k: record[k] for k in SCHEDULES["one_cycle"][1] if k in record}
        if opts.get("cycle_momentum") and not any(k in optimizer.defaults for k in ("momentum", "betas")):
            raise OptBenchError("one_cycle cycle_momentum=true needs an optimizer with momentum or betas.")
        return OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=steps, **opts)
    if name == "constant_with_warmup":
        return tf.get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    return tf.get_constant_schedule(optimizer)


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


# transformers' schedule functions (transformers/optimization.py, the lambdas a LambdaLR holds) -> the schedule.
# The cosine lambda serves two builders: get_cosine_with_min_lr_schedule_with_warmup passes min_lr_rate (what
# gpt3_cosine is built with, any floor), get_cosine_schedule_with_warmup does not (transformers' "cosine", to 0).
_LAMBDAS = {
    "_get_cosine_schedule_with_warmup_lr_lambda": "cosine",
    "_get_wsd_scheduler_lambda": "wsd",
    "_get_constant_schedule_with_warmup_lr_lambda": "constant_with_warmup",
    "_get_constant_lambda": "constant",
    "_get_linear_schedule_with_warmup_lr_lambda": "linear",  # transformers' default lr_scheduler_type
}
# The longest schedule whose multiplier is evaluated step by step for its measured shape (a Python call per step).
SHAPE_MAX_STEPS = 200_000


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def lambda_shape(fn: Any, num_training_steps: int | None) -> dict[str, Any] | None:
    """The measured shape of a LambdaLR multiplier ``fn`` over ``num_training_steps`` steps, by evaluating it at
    every step: the warmup (steps before the multiplier first reaches its peak), the peak and the multiplier at the
    last step (0 for transformers' cosine and linear, min_lr_ratio for gpt3_cosine). None without a horizon or
    past :data:`SHAPE_MAX_STEPS`. Why measured: a scheduler built elsewhere is described by what it computes, not
    by the nearest name."""
    if not num_training_steps or num_training_steps <= 0 or num_training_steps > SHAPE_MAX_STEPS:
        return None
    ratios = [float(fn(step)) for step in range(int(num_training_steps) + 1)]
    peak = max(ratios)
    return {"steps": int(num_training_steps), "warmup_steps": ratios.index(peak), "peak_lr_ratio": peak,
            "lr_ratio_at_end": ratios[-1]}


def describe_scheduler(scheduler: Any, num_training_steps: int | None = None) -> dict[str, Any]:
    """The schedule a built scheduler computes, read from the object: ``name`` (the project's schedule where the
    object is built exactly as the project builds it: gpt3_cosine, wsd, cosine, linear, constant_with_warmup,
    constant, one_cycle; else ``module.Class`` of the scheduler), ``class``, the parameters it holds
    (``num_training_steps``, ``warmup_steps`` read from the scheduler, ``min_lr_ratio``...) and, for a LambdaLR,
    its ``shape`` measured over the run (:func:`lambda_shape`; ``num_training_steps`` gives the horizon where the
    scheduler holds none). {} for None. Whoever built it (hf_optbench, a stock Trainer from ``lr_scheduler_type``,
    a user's script, DeepSpeed's re-initialisation), this says what it runs."""
    if scheduler is None:
        return {}
    from torch.optim.lr_scheduler import LambdaLR, OneCycleLR

    cls = _qualified(type(scheduler))
    if isinstance(scheduler, OneCycleLR):
        phases = scheduler._schedule_phases  # torch's own record of the warmup's end (torch/optim/lr_scheduler.py)
        warm = float(phases[0]["end_step"]) + 1  # pct_start x total_steps
        return {"name": "one_cycle", "class": cls, "num_training_steps": int(scheduler.total_steps),
                "warmup_steps": int(warm), "pct_start": warm / scheduler.total_steps,
                "anneal_strategy": scheduler._anneal_func_type, "cycle_momentum": bool(scheduler.cycle_momentum)}
    fn = scheduler.lr_lambdas[0] if isinstance(scheduler, LambdaLR) and len(scheduler.lr_lambdas) >= 1 else None
    if fn is None:
        return {"name": cls, "class": cls}
    base = getattr(fn, "func", fn)
    kw = dict(getattr(fn, "keywords", None) or {})
    name = _LAMBDAS.get(getattr(base, "__name__", ""))
    if name is None:  # a lambda of the user's: its warmup is what its shape measures
        shape = lambda_shape(fn, num_training_steps)
        record = {"name": cls, "class": cls, "lr_lambda": _qualified(base), "shape": shape}
        if shape is not None:
            record.update(num_training_steps=shape["steps"], warmup_steps=shape["warmup_steps"])
        return record
    if name == "cosine" and "min_lr_rate" in kw:
        name = "gpt3_cosine"
    record: dict[str, Any] = {"name": name, "class": cls, "warmup_steps": int(kw.get("num_warmup_steps", 0))}
    if name == "wsd":
        record["num_training_steps"] = int(kw["num_warmup_steps"] + kw["num_stable_steps"] + kw["num_decay_steps"])
        record.update(min_lr_ratio=kw["min_lr_ratio"], decay_steps=int(kw["num_decay_steps"]),
                      decay_type=kw["decay_type"], warmup_type=kw["warmup_type"])
    elif "num_training_steps" in kw:
        record["num_training_steps"] = int(kw["num_training_steps"])
    if name == "gpt3_cosine":
        record.update(min_lr_ratio=float(kw["min_lr_rate"]), num_cycles=float(kw["num_cycles"]))
    elif name == "cosine":
        record["num_cycles"] = float(kw["num_cycles"])
    record["shape"] = lambda_shape(fn, record.get("num_training_steps", num_training_steps))
    return record


def training_args_for_schedule(record: dict[str, Any]) -> dict[str, Any] | None:
    """TrainingArguments fields (``lr_scheduler_type``, ``lr_scheduler_kwargs``, ``warmup_steps``) whose
    transformers scheduler computes the schedule ``record`` describes (:func:`resolve_schedule`'s or
    :func:`describe_scheduler`'s), or None where transformers has no such scheduler (``one_cycle``, another
    scheduler). A stock Trainer builds it from these fields, also after DeepSpeed's re-initialisation."""
    name, warmup = record.get("name"), int(record.get("warmup_steps", 0))
    if name == "gpt3_cosine":
        return {"lr_scheduler_type": "cosine_with_min_lr", "warmup_steps": warmup,
                "lr_scheduler_kwargs": {"min_lr_rate": record["min_lr_ratio"], "num_cycles": record["num_cycles"]}}
    if name == "wsd":
        return {"lr_scheduler_type": "warmup_stable_decay", "warmup_steps": warmup,
                "lr_scheduler_kwargs": {"num_decay_steps": record["decay_steps"], "min_lr_ratio":
                                        record["min_lr_ratio"], "decay_type": record["decay_type"],
                                        "warmup_type": record["warmup_type"]}}
    if name == "cosine":
        return {"lr_scheduler_type": "cosine", "warmup_steps": warmup,
                "lr_scheduler_kwargs": {"num_cycles": record["num_cycles"]}}
    if name == "constant_with_warmup":
        return {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": warmup, "lr_scheduler_kwargs": {}}
    if name in ("constant", "none"):  # a schedule-free optimizer's warmup is its own (record["warmup_by"])
        return {"lr_scheduler_type": "constant", "warmup_steps": 0, "lr_scheduler_kwargs": {}}
    if name == "linear":  # transformers' own default, as a Trainer builds it
        return {"lr_scheduler_type": "linear", "warmup_steps": warmup, "lr_scheduler_kwargs": {}}
    return None
