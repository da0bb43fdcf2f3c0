"""What a stock ``transformers.Trainer`` needs to train with an hf_optbench optimizer and schedule, under every
backend (single process, DDP, DeepSpeed ZeRO) -- no Trainer subclass.

Why these two hooks: with DeepSpeed, transformers 5's ``deepspeed_init`` sets ``trainer.optimizer = None`` and
then calls ``trainer.create_optimizer()`` and ``create_scheduler()``, so ``Trainer(optimizers=(lion, cosine))``
silently trains AdamW (from ``args.optim``) with a linear schedule (from ``args.lr_scheduler_type``). The Trainer's
own extension points survive that re-initialisation:

* the optimizer: ``Trainer(optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="gpt2"))``.
  ``create_optimizer`` calls ``OptimizerFactory()(model, **kwargs)`` (a non-``Optimizer`` class is a factory in
  transformers' ``is_optimizer_factory``), which builds the optimizer with hf_optbench's registry, or hands back
  one already built (``trainer_optimizer(optimizer=opt)``, what ``hf_optbench.run`` does: its plan checks the
  optimizer before training). DeepSpeed then wraps it as a client optimizer. Nothing is attached to the optimizer:
  the recorder reads what it holds at train begin (``hf_optbench.optim.held``).
* the schedule: ``TrainingArguments(**schedule_training_args("gpt3_cosine", num_training_steps=N, ...))`` sets
  ``lr_scheduler_type``/``lr_scheduler_kwargs``/``warmup_steps`` to the transformers scheduler that computes the
  same learning rates as ``hf_optbench.optim.schedules.build_scheduler`` (it builds its schedules with those very
  functions), so ``create_scheduler`` makes our schedule, also under DeepSpeed, and trackers show it. ``one_cycle``
  (torch's OneCycleLR) has no transformers type: pass it as ``optimizers=(None, scheduler)`` (not under DeepSpeed).

``hf_optbench.run`` sets these TrainingArguments fields from its plan (``hf_optbench.run.plan.RunPlan.trainer_args``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError

if TYPE_CHECKING:
    import torch


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
            return optimizer
        from hf_optbench.optim.registry import build_optimizer

        return build_optimizer(optimizer, model, **build_kwargs)


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


def schedule_training_args(name: str, *, num_training_steps: int, warmup_steps: float | int = 0,
                           min_lr_ratio: float = 0.1, **schedule_kwargs: Any) -> dict[str, Any]:
    """TrainingArguments fields that make a stock Trainer run hf_optbench's schedule ``name`` (arguments as
    ``hf_optbench.build_scheduler`` takes them, validated the same way), e.g.
    ``TrainingArguments("out", max_steps=N, **schedule_training_args("gpt3_cosine", num_training_steps=N,
    warmup_steps=0.1))``."""
    from hf_optbench.optim.schedules import resolve_schedule, training_args_for_schedule

    record = resolve_schedule(name, num_training_steps=num_training_steps, warmup_steps=warmup_steps,
                              min_lr_ratio=min_lr_ratio, **schedule_kwargs)
    fields = training_args_for_schedule(record)
    if fields is None:
        raise OptBenchError(
            f"schedule '{name}' has no transformers lr_scheduler_type: build it with hf_optbench.build_scheduler "
            "and pass Trainer(optimizers=(None, scheduler)) (not under DeepSpeed), or use gpt3_cosine, wsd, "
            "constant_with_warmup or constant."
        )
    return fields
