"""The Python API's Trainer hook (issue 33 item 7): schedule-free AdamW through ``trainer_optimizer`` no longer
trains without its train/eval switch in silence. The pair cannot install Trainer callbacks (the Trainer builds the
optimizer inside ``train()``), so it warns naming ``optimizer_callbacks``, which now takes the registry name."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from transformers import Trainer, TrainingArguments, default_data_collator

from hf_optbench.optim.registry import optimizer_callbacks
from hf_optbench.optim.schedule_free_impl import ScheduleFreeModeCallback
from hf_optbench.optim.unwrap import innermost_optimizer
from hf_optbench.run.trainer import schedule_training_args, trainer_optimizer

from fixtures.models import tiny_model, token_data

SF = "schedule_free_adamw"


def test_a_name_that_needs_callbacks_warns_naming_optimizer_callbacks() -> None:
    pytest.importorskip("schedulefree")
    with pytest.warns(UserWarning, match=r"optimizer_callbacks\('schedule_free_adamw'\)") as caught:
        trainer_optimizer(SF, model_size="tiny")
    assert "ScheduleFreeModeCallback" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer_optimizer("adamw", model_size="tiny")  # needs none: silent


def test_optimizer_callbacks_takes_a_registry_name() -> None:
    assert [type(c) for c in optimizer_callbacks(SF)] == [ScheduleFreeModeCallback]
    assert [type(c) for c in optimizer_callbacks("sf_adamw")] == [ScheduleFreeModeCallback]  # an alias
    assert optimizer_callbacks("adamw") == [] and optimizer_callbacks("torch.optim.RAdam") == []


@pytest.mark.parametrize("with_callbacks", [True, False])
def test_the_final_weights_are_the_average_only_with_the_callbacks(tmp_path: Path, with_callbacks: bool) -> None:
    """What the warning is for: without the switch the Trainer ends in train mode, so the saved model holds the
    training iterate y, not the averaged weights x."""
    pytest.importorskip("schedulefree")
    steps = 3
    args = TrainingArguments(str(tmp_path), max_steps=steps, per_device_train_batch_size=4, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                             **schedule_training_args("none", num_training_steps=steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pair = trainer_optimizer(SF, model_size="tiny")
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(4 * steps),
                      data_collator=default_data_collator, optimizer_cls_and_kwargs=pair,
                      callbacks=optimizer_callbacks(SF) if with_callbacks else None)
    trainer.train()
    assert innermost_optimizer(trainer.optimizer).param_groups[0]["train_mode"] is (not with_callbacks)
