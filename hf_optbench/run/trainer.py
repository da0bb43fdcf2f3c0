"""What a stock ``transformers.Trainer`` needs to train with an hf_optbench optimizer and schedule, under every
backend (single process, DDP, DeepSpeed ZeRO) -- no Trainer subclass.

Why these two hooks: with DeepSpeed, transformers 5's ``deepspeed_init`` sets ``trainer.optimizer = None`` and
then calls ``trainer.create_optimizer()`` and ``create_scheduler()``, so ``Trainer(optimizers=(lion, cosine))``
silently trains AdamW (from ``args.optim``) with a linear schedule (from ``args.lr_scheduler_type``). The Trainer's
own extension points survive that re-initialisation:

* the optimizer: ``Trainer(optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="gpt2"))``.
  ``create_optimizer`` calls ``OptimizerFactory()(model, **kwargs)`` (a non-``Optimizer`` class is a factory in
  transformers' ``is_optimizer_factory``), which builds the optimizer with hf_optbench's registry, or hands back
  one already built (``trainer_optimizer(optimizer=opt)``, what ``hf_optbench.run`` does: its summary and
  callbacks need the optimizer before training). DeepSpeed then wraps it as a client optimizer.
* the schedule: ``TrainingArguments(**schedule_training_args("gpt3_cosine", num_training_steps=N, ...))`` sets
  ``lr_scheduler_type``/``lr_scheduler_kwargs``/``warmup_steps`` to the transformers scheduler that computes the
  same learning rates as ``hf_optbench.optim.schedules.build_scheduler`` (it builds its schedules with those very
  functions), so ``create_scheduler`` makes our schedule, also under DeepSpeed, and trackers show it. ``one_cycle``
  (torch's OneCycleLR) has no transformers type: pass it as ``optimizers=(None, scheduler)`` (not under DeepSpeed).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler


def _trainable_ids(params: Any) -> set[int]:
    return {id(p) for p in params if getattr(p, "requires_grad", True)}


def _optimizer_params(optimizer: Any) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


class OptimizerFactory:
    """``Trainer(optimizer_cls_and_kwargs=(OptimizerFactory, kwargs))``: the Trainer calls
    ``OptimizerFactory()(model, **kwargs)`` in ``create_optimizer`` (also after DeepSpeed's re-initialisation).

    kwargs: ``optimizer`` -- a registry name or dotted path (built with ``build_optimizer(optimizer, model,
    **rest)``), or an optimizer already built over this model's parameters (handed back as it is).
    """

    def __call__(self, model: torch.nn.Module, *, optimizer: Any, **build_kwargs: Any) -> Any:
        if not isinstance(optimizer, str):
            if build_kwargs:
                raise OptBenchError(f"trainer_optimizer: a built optimizer takes no build arguments, got "
                                    f"{sorted(build_kwargs)}. Pass them to build_optimizer instead.")
            if _optimizer_params(optimizer) != _trainable_ids(model.parameters()):
                raise OptBenchError(
                    "the Trainer asked for an optimizer over other parameters than the built one holds (FSDP "
                    "re-wraps them): pass the optimizer by name, trainer_optimizer('lion', ...), so that it is "
                    "built over the Trainer's model."
                )
            return _with_train_begin_hook(optimizer, None)
        from hf_optbench.optim.registry import build_optimizer

        built = build_optimizer(optimizer, model, **build_kwargs)
        return _with_train_begin_hook(built, _build_sources(built, model, build_kwargs))


def _build_sources(optimizer: Any, model: torch.nn.Module, build_kwargs: dict[str, Any]) -> dict[str, str]:
    """Where each value of an optimizer built by name came from: "user" for what ``build_kwargs`` set, else the
    registry's citation for the size class (the one ``build_optimizer`` took)."""
    from hf_optbench.optim.registry import OPTIMIZERS, model_size_class, optimizer_defaults

    name = getattr(optimizer, "hf_optbench_name", None)
    sources: dict[str, str] = {}
    if name in OPTIMIZERS:
        sources.update(optimizer_defaults(name, model_size_class(model, build_kwargs.get("model_size")))["sources"])
    given = {"lr": "learning_rate"}
    sources.update({given.get(k, k): "user" for k, v in build_kwargs.items() if v is not None and k != "model_size"})
    return sources


def _with_train_begin_hook(optimizer: Any, sources: dict[str, str] | None) -> Any:
    """Give ``optimizer`` the hook the recorder calls at train begin (``hf_optbench_train_begin``): it records what
    ran in the TrainingArguments and the trackers (:func:`hf_optbench.run.tracking.record_at_train_begin`). Why
    through the optimizer: the Trainer hands the factory no reference to itself, and the recorder (a lower layer)
    cannot import the run layer; the optimizer reaches both."""
    from functools import partial

    from hf_optbench.run.tracking import record_at_train_begin

    optimizer.hf_optbench_train_begin = partial(record_at_train_begin, sources=sources)
    return optimizer


def trainer_optimizer(optimizer: Any, **build_kwargs: Any) -> tuple[type, dict[str, Any]]:
    """The ``optimizer_cls_and_kwargs`` pair for a stock Trainer: ``optimizer`` is a registry name (``build_kwargs``
    as ``hf_optbench.build_optimizer`` takes them: ``model_size``, ``lr``, ``weight_decay``, constructor arguments)
    or an optimizer already built over the Trainer's model.

    A name whose optimizer needs Trainer callbacks (schedule-free's train/eval switch: without it checkpoints and the
    final model hold the training iterate, not the averaged weights; Sophia-G's Hessian estimate) warns, naming
    them: the Trainer builds the optimizer inside ``train()``, after its callbacks are fixed, so this pair cannot
    add them. Pass ``callbacks=optimizer_callbacks(name)`` to the Trainer (``hf_optbench.optimizer_callbacks``)."""
    if isinstance(optimizer, str):
        from hf_optbench.optim.registry import optimizer_callbacks

        needed = [type(c).__name__ for c in optimizer_callbacks(optimizer)]
        if needed:
            warnings.warn(
                f"trainer_optimizer({optimizer!r}): this optimizer needs the Trainer callback(s) {', '.join(needed)}, "
                f"which optimizer_cls_and_kwargs cannot add: pass Trainer(..., callbacks=[..., "
                f"*optimizer_callbacks({optimizer!r})]) (from hf_optbench import optimizer_callbacks).",
                UserWarning, stacklevel=2)
    return OptimizerFactory, {"optimizer": optimizer, **build_kwargs}


def training_args_for_schedule(record: dict[str, Any]) -> dict[str, Any] | None:
    """TrainingArguments fields (``lr_scheduler_type``, ``lr_scheduler_kwargs``, ``warmup_steps``) whose
    transformers scheduler computes the schedule ``record`` describes (``describe_scheduler``'s resolved record),
    or None where transformers has no such scheduler (``one_cycle``, a scheduler not built by hf_optbench)."""
    name, warmup = record.get("name"), int(record.get("warmup_steps", 0))
    if name == "gpt3_cosine":
        return {"lr_scheduler_type": "cosine_with_min_lr", "warmup_steps": warmup,
                "lr_scheduler_kwargs": {"min_lr_rate": record["min_lr_ratio"], "num_cycles": record["num_cycles"]}}
    if name == "wsd":
        return {"lr_scheduler_type": "warmup_stable_decay", "warmup_steps": warmup,
                "lr_scheduler_kwargs": {"num_decay_steps": record["decay_steps"], "min_lr_ratio":
                                        record["min_lr_ratio"], "decay_type": record["decay_type"],
                                        "warmup_type": record["warmup_type"]}}
    if name == "constant_with_warmup":
        return {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": warmup, "lr_scheduler_kwargs": {}}
    if name in ("constant", "none"):  # a schedule-free optimizer's warmup is its own (record["warmup_by"])
        return {"lr_scheduler_type": "constant", "warmup_steps": 0, "lr_scheduler_kwargs": {}}
    return None


def schedule_training_args(name: str, *, num_training_steps: int, warmup_steps: float | int = 0,
                           min_lr_ratio: float = 0.1, **schedule_kwargs: Any) -> dict[str, Any]:
    """TrainingArguments fields that make a stock Trainer run hf_optbench's schedule ``name`` (arguments as
    ``hf_optbench.build_scheduler`` takes them, validated the same way), e.g.
    ``TrainingArguments("out", max_steps=N, **schedule_training_args("gpt3_cosine", num_training_steps=N,
    warmup_steps=0.1))``."""
    import torch

    from hf_optbench.optim.schedules import build_scheduler, describe_scheduler

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # resolves and validates the arguments
    record = describe_scheduler(build_scheduler(name, probe, num_training_steps=num_training_steps,
                                                warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                                                **schedule_kwargs))
    fields = training_args_for_schedule(record)
    if fields is None:
        raise OptBenchError(
            f"schedule '{name}' has no transformers lr_scheduler_type: build it with hf_optbench.build_scheduler "
            "and pass Trainer(optimizers=(None, scheduler)) (not under DeepSpeed), or use gpt3_cosine, wsd, "
            "constant_with_warmup or constant."
        )
    return fields


def optim_label(optimizer: Any) -> str:
    """What ``TrainingArguments.optim`` shows for an optimizer hf_optbench built: ``hf_optbench:<name>`` (no
    transformers ``OptimizerNames`` value names lion-pytorch's Lion, Muon, SOAP, ...; the tracker config's
    ``hf_optbench`` section carries the implementation and every hyperparameter)."""
    from hf_optbench.optim.unwrap import innermost_optimizer

    inner = innermost_optimizer(optimizer)
    return f"hf_optbench:{getattr(inner, 'hf_optbench_name', None) or type(inner).__name__}"


def stock_trainer_kwargs(args: Any, optimizer: Any, scheduler: LRScheduler | None) -> dict[str, Any]:
    """``Trainer`` keyword arguments that run ``optimizer`` and ``scheduler`` (both built by hf_optbench over the
    Trainer's model) in a stock Trainer, under DeepSpeed too; sets ``args.optim`` to :func:`optim_label` and
    ``args.lr_scheduler_type``/``lr_scheduler_kwargs`` to the transformers scheduler of the same schedule, so that
    the Trainer builds it and trackers show what runs (``warmup_steps`` is left as given: transformers resolves a
    fraction as hf_optbench does). A schedule transformers has no type for (``one_cycle``) is passed as the object,
    and ``lr_scheduler_type`` then shows ``hf_optbench:<name>``: such a run cannot use DeepSpeed (checked by the
    caller through ``trainer.is_deepspeed_enabled``)."""
    from transformers.trainer_utils import SchedulerType

    from hf_optbench.optim.schedules import describe_scheduler

    args.optim = optim_label(optimizer)
    record = describe_scheduler(scheduler)
    fields = training_args_for_schedule(record)
    uses_warmup = fields is not None and fields["lr_scheduler_type"] != "constant"
    if fields is not None and uses_warmup and args.get_warmup_steps(args.max_steps) != fields["warmup_steps"]:
        fields = None  # the Trainer would resolve another warmup: keep our object
    if fields is None:
        args.lr_scheduler_type = f"hf_optbench:{record.get('name', type(scheduler).__name__)}"
        return {"optimizer_cls_and_kwargs": trainer_optimizer(optimizer), "optimizers": (None, scheduler)}
    args.lr_scheduler_type = SchedulerType(fields["lr_scheduler_type"])
    args.lr_scheduler_kwargs = fields["lr_scheduler_kwargs"]
    return {"optimizer_cls_and_kwargs": trainer_optimizer(optimizer), "optimizers": (None, None)}
