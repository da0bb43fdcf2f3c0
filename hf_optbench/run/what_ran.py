"""The one record of what a run ran: the optimizer's hyperparameters as constructed (read from its ``param_groups``,
inside any wrapper), the schedule built, and where each value came from.

Why: TrainingArguments, torch's ``optimizer.defaults`` and the recipe each hold values that need not be the ones
that ran (transformers' ``adam_beta2`` 0.999 beside an AdamW built with the cited 0.99; torch's ``weight_decay``
0.01 in ``defaults`` while the groups carry 0.1 and 0.0). :func:`what_ran` reads the optimizer itself, once per
run, and every file and tracker takes its values from that record: summary.json (``hyperparameters``,
``param_groups``), the TrainingArguments fields hf_optbench replaces (:func:`apply_to_training_args`: config.yaml
and the args W&B/TensorBoard/trackio record), the ``hf_optbench`` tracker section and the model card.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from hf_optbench.config.parse import RunConfig

# Group entries that are bookkeeping, not hyperparameters: the tensors, the scheduler's base rate (read as ``lr``),
# per-step counters and mode flags of schedule-free and Sophia.
BOOKKEEPING = frozenset({"params", "initial_lr", "step", "k", "train_mode", "weight_sum", "lr_max", "scheduled_lr",
                         "gnb_updates"})
# Implementation switches: kept in each group's record, left out of the headline hyperparameters.
IMPLEMENTATION = frozenset({"foreach", "fused", "capturable", "differentiable", "maximize"})
# The source of a value neither cited nor set by the user: hf_optbench's builder for the optimizer or the library's
# class chose it (Adafactor's relative_step False, AdamW's amsgrad False).
CONSTRUCTOR_SOURCE = "builder or library default"


def _value(value: Any) -> Any:
    """A group entry as a plain value: numbers, strings, None and tuples of them as they are, a one-element
    tensor (a capturable optimizer's lr) as its number, anything else as its repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_value(v) for v in value)
    if hasattr(value, "numel") and value.numel() == 1:
        return value.item()
    return repr(value)


def group_record(group: Mapping[str, Any]) -> dict[str, Any]:
    """One param group's hyperparameters; ``lr`` is the rate the group was built with (the scheduler keeps it
    as ``initial_lr`` and multiplies it each step), ``tensors`` how many tensors the group holds."""
    values = {k: _value(v) for k, v in group.items() if k not in BOOKKEEPING}
    values["lr"] = _value(group.get("initial_lr", group.get("lr")))
    values["tensors"] = len(group.get("params", ()))
    return values


def _headline(inner: Any, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """One value per hyperparameter: the weight decay of the most decayed group, the learning rate asked for
    (``hf_optbench_lr``) when a group runs it, and every other key from the first group holding it, most decayed
    groups first (Muon's matrices before its AdamW groups, decayed matrices before biases and norms); ``eps`` from
    the group that holds ``betas`` when one does."""
    ordered = sorted(groups, key=lambda g: -(g.get("weight_decay") or 0.0))
    asked = getattr(inner, "hf_optbench_lr", None)
    rates = [g["lr"] for g in groups]
    values: dict[str, Any] = {
        "learning_rate": asked if asked is not None and asked in rates else (ordered[0]["lr"] if ordered else None),
        "weight_decay": ordered[0].get("weight_decay") if ordered else None,
    }
    for group in ordered:
        for key, value in group.items():
            if key not in ("lr", "weight_decay", "tensors") and key not in IMPLEMENTATION:
                values.setdefault(key, value)
    adam = next((g for g in ordered if "betas" in g and "eps" in g), None)
    if adam is not None:  # Adam's eps beside its betas (Muon's own eps is Newton-Schulz's, another quantity)
        values["eps"] = adam["eps"]
    return values


def _source(key: str, hparams: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """``hparams``' source, else ``sources``' (Muon's auxiliary AdamW takes betas / eps as ``adamw_betas`` /
    ``adamw_eps``), else :data:`CONSTRUCTOR_SOURCE`."""
    if key in hparams:
        return hparams[key]["source"]
    return sources.get(key) or sources.get(f"adamw_{key}") or CONSTRUCTOR_SOURCE


def what_ran(optimizer: Any, scheduler: LRScheduler | None = None, *, hparams: Mapping[str, Any] | None = None,
             sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The record of what ran: ``optimizer`` (registry name, else module.Class), ``optimizer_impl``,
    ``hyperparameters`` ({key: {"value", "source"}}: the optimizer's values; a key of ``hparams`` the optimizer
    does not hold, such as ``max_grad_norm``, keeps its own value), ``param_groups`` (each group's values) and
    ``schedule`` (``describe_scheduler``'s record). A source is ``hparams``' (``resolve_hyperparameters``), else
    ``sources``' (e.g. the registry's citations, "user"), else "builder or library default"."""
    from hf_optbench.optim.registry import describe_optimizer
    from hf_optbench.optim.schedules import describe_scheduler
    from hf_optbench.optim.unwrap import innermost_optimizer

    inner = innermost_optimizer(optimizer)
    groups = [group_record(g) for g in inner.param_groups]
    hparams, sources = dict(hparams or {}), dict(sources or {})
    values = _headline(inner, groups)
    for key, entry in hparams.items():
        values.setdefault(key, entry.get("value"))
    hyper = {key: {"value": value, "source": _source(key, hparams, sources)} for key, value in values.items()}
    return {
        "optimizer": getattr(inner, "hf_optbench_name", None) or f"{type(inner).__module__}.{type(inner).__name__}",
        "optimizer_impl": describe_optimizer(optimizer),
        "hyperparameters": hyper,
        "param_groups": groups,
        "schedule": describe_scheduler(scheduler) if scheduler is not None else {},
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def training_args_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments fields hf_optbench replaces, set to what ran where the optimizer has them:
    ``learning_rate``, ``weight_decay``, ``adam_beta1``/``adam_beta2`` (a pair of betas, Lion's too) and
    ``adam_epsilon`` (a single eps), plus ``optim`` as ``hf_optbench:<name>`` (no transformers name covers it)."""
    values = {k: v["value"] for k, v in record["hyperparameters"].items()}
    fields: dict[str, Any] = {"optim": f"hf_optbench:{record['optimizer'].rsplit('.', 1)[-1]}"}
    for key in ("learning_rate", "weight_decay"):
        if _number(values.get(key)):
            fields[key] = values[key]
    betas = values.get("betas")
    if isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_number(b) for b in betas):
        fields["adam_beta1"], fields["adam_beta2"] = float(betas[0]), float(betas[1])
    if _number(values.get("eps")):
        fields["adam_epsilon"] = values["eps"]
    return fields


def apply_to_training_args(args: Any, record: Mapping[str, Any]) -> dict[str, Any]:
    """Set :func:`training_args_fields` on ``args`` (the copy the Trainer holds, which trackers record and
    checkpoints save), so that they state what ran rather than transformers' defaults; returns the fields."""
    fields = training_args_fields(record)
    for key, value in fields.items():
        setattr(args, key, value)
    return fields


def value_sources(cfg: RunConfig) -> dict[str, str]:
    """Where a run's other constructor values came from (``what_ran``'s ``sources``): the registry's citation per
    key (momentum, rho, ...), "user" for what optimizer_kwargs set; ``resolve_hyperparameters``' own sources
    (learning rate, weight decay, clipping, betas, eps) win over both."""
    from hf_optbench.optim.registry import OPTIMIZERS, optimizer_defaults, resolve_optimizer_name

    name = resolve_optimizer_name(cfg.optim.optimizer)
    sources = dict(optimizer_defaults(name, cfg.model.model_size)["sources"]) if name in OPTIMIZERS else {}
    sources.update(dict.fromkeys(cfg.optim.kwargs(), "user"))
    return sources
