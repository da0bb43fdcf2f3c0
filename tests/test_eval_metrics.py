"""hf_optbench/eval_metrics.py and the shipped evaluate metric: next-token accuracy as run_clm.py computes it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import (
    EvalPrediction,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from hf_optbench.run.eval_metrics import (
    METRIC_DIR,
    NextTokenAccuracy,
    eval_metric_kwargs,
    load_accuracy_metric,
    preprocess_logits_for_metrics,
)


def test_accuracy_compares_each_prediction_with_the_next_label_and_skips_ignored() -> None:
    preds = np.array([[2, 9, 4, 7], [6, 7, 1, 0]])  # position t predicts the token at t + 1
    labels = np.array([[1, 2, 3, 4], [5, 6, 7, -100]])
    # pairs (pred[t], label[t+1]): (2,2) (9,3) (4,4) | (6,6) (7,7) (1,-100 skipped)
    assert NextTokenAccuracy()(EvalPrediction(predictions=preds, label_ids=labels)) == {"accuracy": 4 / 5}


def test_accuracy_of_nothing_is_none() -> None:
    labels = np.full((2, 3), -100)
    assert NextTokenAccuracy()(EvalPrediction(predictions=np.zeros((2, 3), int), label_ids=labels)) == \
        {"accuracy": None}


def test_preprocess_keeps_argmax_ids_not_logits() -> None:
    logits = torch.randn(2, 5, 11)
    ids = preprocess_logits_for_metrics((logits, "past"), None)
    assert ids.shape == (2, 5) and not ids.is_floating_point()
    assert torch.equal(ids, logits.argmax(-1))


def test_shipped_metric_loads_offline_from_the_package(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert (METRIC_DIR / "next_token_accuracy.py").is_file()
    metric = load_accuracy_metric()
    assert metric.compute(predictions=[1, 2, 3, 4], references=[1, 2, 0, 4]) == {"accuracy": 0.75}


def test_importing_the_module_does_not_import_evaluate() -> None:
    code = "import sys, hf_optbench.run.eval_metrics; print('evaluate' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


def test_trainer_eval_accuracy_equals_a_direct_count(tmp_path) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=8, n_positions=16,
                                       use_cache=False, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 8, (6, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, use_cpu=True, report_to="none",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, eval_dataset=data, data_collator=default_data_collator,
                      **eval_metric_kwargs())
    metrics = trainer.evaluate()
    with torch.no_grad():
        predicted = model(ids).logits.argmax(-1)
    right = (predicted[:, :-1] == ids[:, 1:])
    direct = right.sum().item() / right.numel()  # 6 x 11 positions
    assert metrics["eval_accuracy"] == pytest.approx(direct, abs=1e-12)
    assert "eval_loss" in metrics
