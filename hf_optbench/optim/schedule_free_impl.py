"""Switch schedule-free optimizers between their train (y) and averaged (x) weights around checkpoints.

Schedule-free AdamW (Defazio et al. 2024; facebookresearch/schedule_free README) trains at y but the weights to
evaluate and to keep are the average x: "call optimizer.eval() where you call model.eval() ... the optimizer
should also be placed in eval mode when storing checkpoints".

What transformers 5.23's Trainer already does: ``training_step`` calls ``optimizer.train()`` and
``evaluation_loop`` calls ``optimizer.eval()`` (both through Accelerate's wrapper), so evaluation sees x. What it
does not do: switch before ``_save_checkpoint`` (a checkpoint at a step without evaluation would hold y), nor at
the end of training (the model in memory, and what ``save_model`` writes, would be y). ``on_save`` and
``on_evaluate`` fire *after* the save / evaluation, so they cannot be used to switch before; this callback
switches in ``on_step_end`` / ``on_epoch_end`` -- which run after the optimizer step and after
``DefaultFlowCallback`` has decided ``should_save``/``should_evaluate``, and before Trainer acts on them -- and
back in ``on_save``. A checkpoint written in eval mode resumes correctly: its optimizer state records
``train_mode=False`` and the next ``training_step``'s ``optimizer.train()`` rebuilds y from x and z.

Add it last in ``callbacks=[...]`` so that flags set by other callbacks' ``on_step_end`` are seen.

The registry entry (cited defaults, builder, memory-planner layout) is ``hf_optbench/optim/schedule_free.py``, which
re-exports this module's public names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments


def _set_mode(optimizer: Any, mode: str) -> None:
    fn = getattr(optimizer, mode, None)  # Accelerate's AcceleratedOptimizer forwards train()/eval()
    if callable(fn):
        fn()


class ScheduleFreeModeCallback(TrainerCallback):
    """``optimizer.eval()`` before Trainer saves (and evaluates), ``optimizer.train()`` after saving, and eval mode
    at the end of training so the final model holds the averaged weights. Example::

        trainer = Trainer(..., optimizers=(sf_adamw, constant_schedule), callbacks=[..., ScheduleFreeModeCallback()])
    """

    def _before_save_or_eval(self, control: TrainerControl, optimizer: Any) -> None:
        if optimizer is not None and (control.should_save or control.should_evaluate):
            _set_mode(optimizer, "eval")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    optimizer: Any = None, **kwargs: Any) -> None:
        self._before_save_or_eval(control, optimizer)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     optimizer: Any = None, **kwargs: Any) -> None:
        self._before_save_or_eval(control, optimizer)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                optimizer: Any = None, **kwargs: Any) -> None:
        if optimizer is not None:
            _set_mode(optimizer, "train")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     optimizer: Any = None, **kwargs: Any) -> None:
        if optimizer is not None:
            _set_mode(optimizer, "eval")
