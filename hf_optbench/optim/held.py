"""What a built optimizer and scheduler hold, read from the objects: each parameter group's hyperparameters, one
value per hyperparameter, the schedule, and where each value most likely came from.

Why from the objects: TrainingArguments, torch's ``optimizer.defaults`` and a recipe each hold values that need not
be the ones that run (transformers' ``adam_beta2`` 0.999 and ``weight_decay`` 0.0 beside a Lion built at 0.99 and
0.3; ``lr_scheduler_type`` "linear" beside a cosine handed in as an object). A Trainer of the Python API, built by
``trainer_optimizer`` or with ``optimizers=(opt, sched)``, has no plan: the recorder reads these objects at train
begin (:func:`held_record`) and every tracker and its summary.json say what they hold. A run of ``hf-optbench run``
renders its record from its plan instead (``hf_optbench.run.plan``) and checks the optimizer against it; the
TrainingArguments fields both paths set come from :func:`training_args_fields`. Nothing here writes to the objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hf_optbench.optim.registry import (
    built_sources,
    describe_optimizer,
    spec_of,
)
from hf_optbench.optim.schedules import describe_scheduler
from hf_optbench.optim.unwrap import innermost_optimizer

# Group entries that are bookkeeping, not hyperparameters: the tensors, the scheduler's base rate (read as ``lr``),
# per-step counters and mode flags of schedule-free and Sophia, Muon's group marker.
BOOKKEEPING = frozenset({"params", "initial_lr", "step", "k", "train_mode", "weight_sum", "lr_max", "scheduled_lr",
                         "gnb_updates", "use_muon"})
# Implementation switches: kept in each group's record, left out of the headline hyperparameters.
IMPLEMENTATION = frozenset({"foreach", "fused", "capturable", "differentiable", "maximize"})
# The source of a value a run did not set: hf_optbench's builder for the optimizer or the library's class chose it
# (Adafactor's relative_step False, AdamW's amsgrad False).
CONSTRUCTOR_SOURCE = "builder or library default"
# The source of every value of an optimizer hf_optbench did not build and the Trainer did not build from its
# arguments: the caller's object, whatever its values equal.
OUTSIDE_SOURCE = "the caller's optimizer (a value they set, or its library's default)"
# TrainingArguments' fields of the values of an optimizer the Trainer built from them (Trainer.get_optimizer_cls_and_
# kwargs): its rate, decay, betas and eps.
ARGUMENT_FIELDS = {"learning_rate": ("learning_rate",), "weight_decay": ("weight_decay",),
                   "betas": ("adam_beta1", "adam_beta2"), "eps": ("adam_epsilon",)}
# Muon's auxiliary AdamW holds betas and eps under these constructor names.
_HEADLINE_NAMES = {"adamw_betas": "betas", "adamw_eps": "eps"}


def plain(value: Any) -> Any:
    """A group entry as a plain value: numbers, strings, None and tuples of them as they are, a one-element
    tensor (a capturable optimizer's lr) as its number, anything else as its repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if hasattr(value, "numel") and value.numel() == 1:
        return value.item()
    return repr(value)


def group_record(group: Mapping[str, Any]) -> dict[str, Any]:
    """One param group's hyperparameters; ``lr`` is the rate the group was built with (the scheduler keeps it
    as ``initial_lr`` and multiplies it each step), ``tensors`` how many tensors the group holds."""
    values = {k: plain(v) for k, v in group.items() if k not in BOOKKEEPING}
    values["lr"] = plain(group.get("initial_lr", group.get("lr")))
    values["tensors"] = len(group.get("params", ()))
    return values


def headline(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """One value per hyperparameter of the groups (:func:`group_record`): ``learning_rate`` the rate most groups
    run (the first group's on a tie: Muon's matrices at muon_lr beside two AdamW groups at the run's rate give the
    run's), ``weight_decay`` the most decayed group's, every other key from the first group holding it, most decayed
    groups first; Adam's ``eps`` from the group that holds ``betas`` (Muon's own eps is Newton-Schulz's)."""
    if not groups:
        return {}
    rates = [g["lr"] for g in groups]
    ordered = sorted(groups, key=lambda g: -(g.get("weight_decay") or 0.0))
    values: dict[str, Any] = {"learning_rate": max(rates, key=rates.count),
                              "weight_decay": ordered[0].get("weight_decay")}
    for group in ordered:
        for key, value in group.items():
            if key not in ("lr", "weight_decay", "tensors") and key not in IMPLEMENTATION:
                values.setdefault(key, value)
    adam = next((g for g in ordered if "betas" in g and "eps" in g), None)
    if adam is not None:
        values["eps"] = adam["eps"]
    return values


def _built_value_sources(built: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, str]:
    """The build's sources (:func:`~hf_optbench.optim.registry.built_sources`) under the record's headline keys."""
    out = {_HEADLINE_NAMES.get(key, key): source for key, source in built.items()}
    if "adamw_eps" in built:  # the headline eps is the AdamW group's (Muon's own eps is Newton-Schulz's)
        out["eps"] = built["adamw_eps"]
    return {k: out[k] for k in values if k in out}


def _argument_sources(values: Mapping[str, Any], args: Any) -> dict[str, str]:
    """Sources of an optimizer the Trainer built from ``args``: each value's TrainingArguments field, set by the
    caller or at transformers' default."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(type(args))}
    out = {}
    for key, fields in ARGUMENT_FIELDS.items():
        if key in values:
            by = "transformers' default" if all(getattr(args, f) == defaults.get(f) for f in fields) \
                else "set by the caller"
            out[key] = f"TrainingArguments {', '.join(fields)} ({by})"
    return out


def _sources(optimizer: Any, values: Mapping[str, Any], args: Any, model: Any) -> dict[str, str]:
    """Where each value came from, decided by how the optimizer was made, never by what its value equals:
    hf_optbench's builder recorded it; the Trainer built it from ``args``; else the caller's object."""
    built = built_sources(optimizer)
    if built is not None:
        return _built_value_sources(built, values)
    if args is not None and built_from_arguments(optimizer, args, model):
        return _argument_sources(values, args)
    return {k: OUTSIDE_SOURCE for k in values}


def held_record(optimizer: Any, scheduler: Any = None, *, model: Any = None,
                num_training_steps: int | None = None, args: Any = None) -> dict[str, Any]:
    """The record of what an optimizer and scheduler built outside a run's plan hold: ``optimizer`` (registry name
    from its class, else module.Class), ``optimizer_impl``, ``hyperparameters`` ({key: {"value", "source"}}: the
    source decided by how the optimizer was made, :func:`_sources`),
    ``param_groups`` (each group's values) and ``schedule`` (:func:`~hf_optbench.optim.schedules.describe_scheduler`).
    The same keys as a run's plan record, so trackers and summary.json read both alike. ``num_training_steps``:
    the horizon over which a scheduler that holds none is measured (the Trainer's max_steps); ``args``: the
    Trainer's TrainingArguments, which name the values of an optimizer the Trainer built from them."""
    inner = innermost_optimizer(optimizer)
    spec = spec_of(inner)
    groups = [group_record(g) for g in inner.param_groups]
    values = headline(groups)
    sources = _sources(optimizer, values, args, model)
    return {
        "optimizer": spec.name if spec is not None else f"{type(inner).__module__}.{type(inner).__qualname__}",
        "optimizer_impl": describe_optimizer(optimizer, model=model),
        "hyperparameters": {k: {"value": v, "source": sources.get(k, CONSTRUCTOR_SOURCE)} for k, v in values.items()},
        "param_groups": groups,
        "schedule": describe_scheduler(scheduler, num_training_steps),
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def optim_args_text(record: Mapping[str, Any]) -> str:
    """What TrainingArguments' ``optim_args`` says for a record: the implementation and every value it ran with
    but the rate (a field of its own), the weight decay per param group where the groups differ. transformers'
    model card prints it beside ``optim`` ("Use hf_optbench:lion and the args are: ...", and no weight decay of
    its own); nothing parses it, since no Trainer builds an ``hf_optbench:`` optimizer from its arguments."""
    values = [f"{k}={_arg(v['value'])}" for k, v in record["hyperparameters"].items()
              if k not in ("learning_rate", "max_grad_norm")]
    decays = [(g.get("weight_decay"), g.get("tensors")) for g in record.get("param_groups") or []]
    if len({d for d, _ in decays}) > 1:
        values.append("weight_decay_by_group=" + " / ".join(f"{d} on {n} tensors" for d, n in decays))
    return ", ".join([f"implementation={_arg(record.get('optimizer_impl') or record['optimizer'])}", *values])


def _arg(value: Any) -> str:
    """One ``optim_args`` value in transformers' own syntax (``key=value`` pairs split at commas, each at its one
    ``=``: ``trainer_optimizer._parse_optim_args``): a list as ``0.9/0.99``, any ``,`` or ``=`` inside replaced, so
    that a Trainer reusing these arguments fails on ``optim`` by name, not on parsing them."""
    if isinstance(value, (list, tuple)):
        return "/".join(_arg(v) for v in value)
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace(",", ";").replace("=", ":")


def built_from_arguments(optimizer: Any, args: Any, model: Any) -> bool:
    """Whether ``optimizer`` is the one a stock Trainer builds from ``args`` itself (``optim``, ``learning_rate``,
    ``weight_decay``, the Adam fields: ``Trainer.get_optimizer_cls_and_kwargs``, the class and values compared):
    those arguments then say what runs already."""
    from transformers import Trainer

    try:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except Exception:  # noqa: BLE001 - an optim transformers cannot build (hf_optbench:...), a missing package
        return False
    inner = innermost_optimizer(optimizer)
    groups = inner.param_groups
    if type(inner) is not cls or not groups:
        return False
    same = all(plain(g.get("initial_lr", g.get("lr"))) == plain(kwargs.get("lr")) for g in groups)
    same = same and max(plain(g.get("weight_decay", 0.0)) for g in groups) == args.weight_decay
    return same and all(plain(groups[0][k]) == plain(v) for k, v in kwargs.items() if k in groups[0] and k != "lr")


def training_args_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments fields hf_optbench replaces, set to what a record says runs: ``learning_rate``,
    ``weight_decay``, ``max_grad_norm`` where the record has it, ``adam_beta1``/``adam_beta2`` (a pair of betas,
    Lion's too) and ``adam_epsilon`` (a single eps), plus ``optim`` as ``hf_optbench:<name>`` (no transformers name
    covers it) and ``optim_args`` (:func:`optim_args_text`). Trackers record TrainingArguments (``args.to_dict()``),
    checkpoints and ``save_model`` pickle them, and ``Trainer.create_model_card`` prints them: they then say what
    ran rather than transformers' defaults."""
    values = {k: v["value"] for k, v in record["hyperparameters"].items()}
    fields: dict[str, Any] = {"optim": f"hf_optbench:{str(record['optimizer']).rsplit('.', 1)[-1]}",
                              "optim_args": optim_args_text(record)}
    for key in ("learning_rate", "weight_decay", "max_grad_norm"):
        if _number(values.get(key)):
            fields[key] = values[key]
    betas = values.get("betas")
    if isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_number(b) for b in betas):
        fields["adam_beta1"], fields["adam_beta2"] = float(betas[0]), float(betas[1])
    if _number(values.get("eps")):
        fields["adam_epsilon"] = values["eps"]
    return fields


class Label(str):
    """A name where transformers keeps one of its enums, for what it has no member for: ``lr_scheduler_type`` of
    one_cycle or of a scheduler of the user's class (``Trainer.create_model_card`` reads ``.value`` of it).
    Pickled as a plain string, so that a ``training_args.bin`` loads without hf_optbench."""

    @property
    def value(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (str, (str(self),))


def schedule_training_fields(schedule: Mapping[str, Any]) -> dict[str, Any]:
    """``lr_scheduler_type``, ``lr_scheduler_kwargs`` and ``warmup_steps`` saying what a schedule record
    (:func:`~hf_optbench.optim.schedules.describe_scheduler`'s) runs: transformers' type where it has one (the
    warmup read from the scheduler), else the label ``hf_optbench:<name>`` with the record's parameters."""
    from transformers.trainer_utils import SchedulerType

    from hf_optbench.optim.schedules import training_args_for_schedule

    fields = training_args_for_schedule(dict(schedule))
    if fields is not None:
        return {**fields, "lr_scheduler_type": SchedulerType(fields["lr_scheduler_type"])}
    params = {k: v for k, v in schedule.items() if k not in ("name", "class", "shape", "lr_lambda")}
    out: dict[str, Any] = {"lr_scheduler_type": Label(f"hf_optbench:{schedule.get('name')}"),
                           "lr_scheduler_kwargs": params}
    if isinstance(schedule.get("warmup_steps"), int):
        out["warmup_steps"] = schedule["warmup_steps"]
    return out
