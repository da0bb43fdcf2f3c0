"""A stock ``transformers.Trainer`` that keeps the optimizer and schedule it was given, under every backend.

Why this exists (the only Trainer subclass in the project): with DeepSpeed, transformers 5.23's ``deepspeed_init``
sets ``trainer.optimizer = None`` and rebuilds the optimizer from ``args.optim`` and the schedule from
``args.lr_scheduler_type``, so ``Trainer(optimizers=(lion, cosine))`` silently trains AdamW with a linear schedule.
Handing the given objects back from ``create_optimizer``/``create_scheduler`` keeps them; DeepSpeed then wraps our
optimizer as a client optimizer (``zero_allow_untested_optimizer`` is set by transformers for that case).
Without DeepSpeed it behaves exactly like ``Trainer(optimizers=(optimizer, scheduler))``.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer


class OptBenchTrainer(Trainer):
    """``Trainer`` whose ``optimizers=(optimizer, scheduler)`` survive DeepSpeed's re-initialisation."""

    def __init__(self, *args: Any, optimizers: tuple[Any, Any] = (None, None), **kwargs: Any) -> None:
        super().__init__(*args, optimizers=optimizers, **kwargs)
        self._given_optimizer, self._given_scheduler = optimizers

    def create_optimizer(self, model: Any = None) -> Any:
        if self.optimizer is None and self._given_optimizer is not None:
            self.optimizer = self._given_optimizer
        return super().create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        if self.lr_scheduler is None and self._given_scheduler is not None:
            self.lr_scheduler = self._given_scheduler
        return super().create_scheduler(num_training_steps, optimizer)
