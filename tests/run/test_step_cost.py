"""run/step_cost.py: the training output without logits (no fp32 copy under bf16), evaluation and every recorded
figure unchanged; the Trainer's FLOP count with the parameters counted once, the same total."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from transformers import Trainer, TrainingArguments, default_data_collator

from hf_optbench.run.eval_metrics import eval_metric_kwargs
from hf_optbench.run.step_cost import drop_training_logits, flops_once

from fixtures.models import tiny_model, token_data


def _batch() -> dict[str, torch.Tensor]:
    return default_data_collator(token_data(2))


def test_training_output_with_labels_has_no_logits_and_the_same_loss() -> None:
    plain, lean = tiny_model(), tiny_model()
    drop_training_logits(lean)
    drop_training_logits(lean)  # idempotent: one wrapper
    batch = _batch()
    out, out_lean = plain(**batch), lean(**batch)
    assert "logits" in out and "logits" not in out_lean and getattr(out_lean, "logits", None) is None
    assert torch.equal(out.loss, out_lean.loss)
    out_lean.loss.backward()  # gradients flow as before
    assert all(p.grad is not None for p in lean.parameters() if p.requires_grad)
    # without labels (Sophia-G's Hessian estimate samples from the logits) and in eval mode: the whole output
    assert torch.equal(lean(input_ids=batch["input_ids"]).logits, plain(input_ids=batch["input_ids"]).logits)
    lean.eval()
    assert "logits" in lean(**batch)


def test_under_bf16_accelerate_converts_no_logits_to_fp32() -> None:
    """accelerate's ConvertOutputsToFp32 wraps the forward of a prepared model: with ours inside it, a training
    step's output holds only the loss (the fp32 copy of the logits is gone), evaluation's output its logits."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # a singleton: an earlier test's precision would stay
    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        model = tiny_model()
        drop_training_logits(model)
        prepared = accelerator.prepare(model)
        batch = _batch()
        out = prepared(**batch)
        assert list(out.keys()) == ["loss"]
        prepared.eval()
        with torch.no_grad():
            assert prepared(**batch).logits.dtype == torch.float32  # eval: converted, as before
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _trainer(out: Path, *, lean: bool, bf16: bool = False) -> Trainer:
    model = tiny_model()
    if lean:
        drop_training_logits(model)
    args = TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                             use_cpu=True, bf16=bf16, report_to="none", logging_steps=1, save_strategy="no",
                             eval_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(32), eval_dataset=token_data(8, seed=1),
                      data_collator=default_data_collator, **eval_metric_kwargs())
    if lean:
        flops_once(trainer)
    return trainer


@pytest.mark.parametrize("bf16", [False, True])
def test_losses_eval_metrics_and_total_flos_are_unchanged(tmp_path: Path, bf16: bool) -> None:
    runs = {}
    for lean in (False, True):
        trainer = _trainer(tmp_path / str(lean), lean=lean, bf16=bf16)
        trainer.train()
        losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
        runs[lean] = (losses, trainer.evaluate(), trainer.state.total_flos)
    (losses, metrics, flos), (losses_lean, metrics_lean, flos_lean) = runs[False], runs[True]
    assert losses_lean == losses and flos_lean == flos > 0
    assert {k: v for k, v in metrics_lean.items() if "runtime" not in k and "per_second" not in k} == \
        {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}


def test_the_parameters_are_counted_once_per_run(tmp_path: Path, monkeypatch) -> None:
    trainer = _trainer(tmp_path, lean=True)
    calls = []
    real = type(trainer.model).num_parameters
    monkeypatch.setattr(type(trainer.model), "num_parameters", lambda self, **kw: calls.append(kw) or real(self, **kw))
    trainer.train()
    assert calls == []  # counted when the Trainer was built, not per micro-batch
    assert trainer.state.total_flos == 6 * 4 * 32 * 4 * real(trainer.model, exclude_embeddings=True)


def test_start_up_objects_are_out_of_the_collectors_reach_while_training_only() -> None:
    import gc

    from hf_optbench.run.step_cost import start_up_heap_frozen

    suite_frozen = gc.get_freeze_count() > 0  # tests/conftest.py freezes the collected suite: thawed for this test
    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        with start_up_heap_frozen():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0  # collectable again: in-process callers (tests, notebooks) leak nothing
        gc.freeze()  # a process that froze its own objects (a forking parent) keeps them frozen
        with start_up_heap_frozen():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        if suite_frozen:
            gc.freeze()


def test_accelerate_asks_importlib_once_per_process_not_twice_per_step(monkeypatch) -> None:
    """The wrapped optimizer step asks for lomo_optim through importlib on the first step only, with the same
    answer; a second call changes nothing."""
    import importlib.util

    import accelerate.optimizer as accelerated_optimizer

    from hf_optbench.run.step_cost import package_lookup_once

    kept = accelerated_optimizer.is_lomo_available  # cached already where a run was assembled in this process
    original = getattr(kept, "__wrapped__", kept)
    monkeypatch.setattr(accelerated_optimizer, "is_lomo_available", original)  # kept put back after the test
    asked: list[str] = []
    find_spec = importlib.util.find_spec

    def counting_find_spec(name: str, *args, **kwargs):
        asked.append(name)
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", counting_find_spec)
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.ones(2)
    optimizer = Accelerator(cpu=True).prepare(torch.optim.SGD([param], lr=0.5))
    asked.clear()  # prepare asks once too
    optimizer.step()
    assert asked.count("lomo_optim") == 2  # accelerate as it is: two asks per step
    expected = original()
    assert package_lookup_once() is True and package_lookup_once() is False
    asked.clear()
    for _ in range(5):
        optimizer.step()
    assert asked.count("lomo_optim") == 1 and accelerated_optimizer.is_lomo_available() == expected
    assert param.detach().tolist() == [-3.0, -3.0]  # six steps of 0.5 x 1.0: the steps still ran
