"""``num_train_epochs`` (a recipe's TrainingArguments key, :mod:`hf_optbench.config.trainer_keys`) as the run's
``max_steps``, by transformers' own rule, once the training split's size is known.

Why before the plan: the plan resolves the schedule (its warmup fraction, its decay), the tuned values and the
run's identity from ``max_steps``; the Trainer would otherwise work the steps out only inside ``train()``. The data
is prepared here through the same cached pipeline the run uses next (the second call is a cache hit).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

from hf_optbench.config.bounds import check_max_steps
from hf_optbench.errors import OptBenchError


def epoch_steps(epochs: float, blocks: int, training: Any) -> dict[str, Any]:
    """How ``epochs`` of a training split of ``blocks`` blocks come to optimizer steps with ``training``'s batch:
    micro-batches per epoch (each process's loader: blocks over micro-batch x processes, the last partial one
    dropped with ``dataloader_drop_last``), steps per epoch (``Trainer.set_initial_training_values``: micro-batches
    over gradient_accumulation_steps, a remainder counting as a step, at least 1) and ``max_steps`` (epochs x steps
    per epoch, rounded up)."""
    per_micro = training.per_device_train_batch_size * max(int(training.world_size), 1)
    micro = blocks // per_micro if training.dataloader_drop_last else -(-blocks // per_micro)
    accumulation = training.gradient_accumulation_steps
    per_epoch = max(micro // accumulation + int(micro % accumulation > 0), 1)
    return {"num_train_epochs": epochs, "training_blocks": blocks, "micro_batches_per_epoch": micro,
            "steps_per_epoch": per_epoch, "max_steps": math.ceil(epochs * per_epoch)}


def with_epoch_steps(cfg: Any) -> Any:
    """``cfg`` (a RunConfig) with ``max_steps`` worked out from ``num_train_epochs`` when the recipe gave epochs
    (:func:`epoch_steps`, recorded in ``cfg.trainer_keys.epoch_steps``); ``cfg`` itself otherwise. The parsed
    arguments are not written: the result holds a copy of them."""
    epochs = cfg.trainer_keys.epochs
    if epochs is None:
        return cfg
    from hf_optbench.data.pipeline import prepare_data
    from hf_optbench.run.write_failure import cache_write_failures

    training = copy.copy(cfg.training)
    with training.main_process_first(desc="count the training split"), \
            cache_write_failures(cfg.data.resolved_cache_dir()):
        bundle = prepare_data(cfg.data, n_positions=cfg.model.n_positions or cfg.data.block_size)
    steps = epoch_steps(epochs, len(bundle.train), training)
    try:  # bounded as a max_steps given directly is (config.bounds), before the plan or the model
        check_max_steps(steps["max_steps"], training.logging_steps)
    except OptBenchError as exc:
        raise OptBenchError(f"num_train_epochs {epochs:g} comes to max_steps {steps['max_steps']:,} "
                            f"({steps['steps_per_epoch']:,} steps an epoch): {exc}") from None
    training.max_steps = steps["max_steps"]
    return dataclasses.replace(cfg, training=training,
                               trainer_keys=dataclasses.replace(cfg.trainer_keys, epoch_steps=steps))
