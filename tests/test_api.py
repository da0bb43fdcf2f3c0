"""The README's Python API example, on a tiny model: hf_optbench's pieces dropped into a plain Trainer."""

from __future__ import annotations

import json

import torch
from transformers import Trainer, TrainingArguments

import hf_optbench
from hf_optbench import BenchArguments, build_model, build_optimizer, build_scheduler, default_callbacks


def test_readme_api_example_with_a_plain_trainer(tmp_path) -> None:
    vocab, block, batch, steps = 300, 32, 4, 6
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch * steps, block))
    ds = [{"input_ids": r, "labels": r} for r in ids]

    model = build_model("tiny", vocab_size=vocab)
    opt = build_optimizer("lion", model, model_size="tiny")
    sched = build_scheduler("gpt3_cosine", opt, num_training_steps=steps, warmup_steps=0.1)
    args = TrainingArguments(str(tmp_path), max_steps=steps, per_device_train_batch_size=batch, logging_steps=1,
                             logging_nan_inf_filter=False, use_cpu=True, report_to="none", save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=(opt, sched),
                      callbacks=default_callbacks(BenchArguments(), str(tmp_path), tokens_per_step=batch * block))
    trainer.train()

    assert type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
                ).__module__.startswith("lion_pytorch")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, steps + 1))
    memory = [r for r in rows if r["kind"] == "memory"]
    n_params = sum(p.numel() for p in model.parameters())
    assert memory and memory[0]["optimizer_state_bytes"] == 4 * n_params  # Lion: one fp32 moment per parameter


def test_public_names_resolve() -> None:
    for name in hf_optbench.__all__:
        assert getattr(hf_optbench, name) is not None, name
