"""ScheduleFreeModeCallback really switches: evaluation and checkpoints see the averaged weights x, training the
y sequence, and a checkpoint written at x resumes to the same run."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from hf_optbench.optim.registry import build_optimizer
from hf_optbench.optim.schedule_free_impl import ScheduleFreeModeCallback
from hf_optbench.optim.schedules import build_scheduler

BETA1 = 0.9


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64,
                                       use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=0, eos_token_id=0))
    # GPT-2's loss_type is None in transformers 5.23, so Trainer counts label tokens without the causal shift and
    # its losses come out (T-1)/T of the model's mean; naming the loss makes eval_loss the model's own mean.
    model.loss_type = "ForCausalLM"
    return model


def data(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 128, (n, 16), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": x, "labels": x} for x in ids]


TRAIN, EVAL = data(32, 0), data(8, 1)


def y_from_x(optimizer, p: torch.Tensor) -> torch.Tensor:
    """The train-mode point of a parameter held at x: y = (1 - beta1) z + beta1 x (schedulefree's train())."""
    return torch.lerp(p.detach(), optimizer.state[p]["z"], 1 - BETA1)


def loss_on(model, batch_list) -> float:
    ids = torch.stack([b["input_ids"] for b in batch_list])
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


class Probe(TrainerCallback):
    """Records, at each save and evaluation, the optimizer mode and what was written/evaluated."""

    def __init__(self) -> None:
        self.saves: list[dict] = []
        self.evals: list[dict] = []

    def on_save(self, args, state, control, model=None, optimizer=None, **kw):
        saved = load_file(f"{args.output_dir}/checkpoint-{state.global_step}/model.safetensors")
        current = {n: p.detach() for n, p in model.named_parameters()}
        w = model.transformer.h[0].mlp.c_fc.weight
        self.saves.append({
            "step": state.global_step,
            "train_mode": optimizer.param_groups[0]["train_mode"],
            "saved_is_current": all(torch.equal(saved[n], current[n]) for n in saved if n in current),
            "saved_is_y": torch.allclose(saved["transformer.h.0.mlp.c_fc.weight"], y_from_x(optimizer, w))
            if not optimizer.param_groups[0]["train_mode"] else True,
        })

    def on_evaluate(self, args, state, control, model=None, optimizer=None, metrics=None, **kw):
        in_eval = not optimizer.param_groups[0]["train_mode"]
        at_x = loss_on(model, EVAL)
        optimizer.train()
        at_y = loss_on(model, EVAL)
        optimizer.eval()
        self.evals.append({"step": state.global_step, "eval_mode": in_eval, "eval_loss": metrics["eval_loss"],
                           "loss_at_x": at_x, "loss_at_y": at_y})


def run(tmp_path, *, mode_callback: bool, max_steps: int = 6, resume: str | None = None):
    model = tiny_model()
    opt = build_optimizer("schedule_free_adamw", model, lr=1e-2, weight_decay=0.0)
    sched = build_scheduler("none", opt, num_training_steps=max_steps, warmup_steps=2)
    probe = Probe()
    callbacks = [probe] + ([ScheduleFreeModeCallback()] if mode_callback else [])
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=3, save_strategy="steps",
                             save_steps=4, use_cpu=True, report_to=[], logging_steps=1, disable_tqdm=True, seed=0,
                             data_seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=TRAIN, eval_dataset=EVAL, optimizers=(opt, sched),
                      callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return model, opt, probe


def test_checkpoints_and_final_model_hold_the_averaged_weights(tmp_path):
    model, opt, probe = run(tmp_path / "with", mode_callback=True)
    step4 = next(s for s in probe.saves if s["step"] == 4)  # a save without an evaluation at that step
    assert step4["train_mode"] is False and step4["saved_is_current"] and not step4["saved_is_y"]
    assert opt.param_groups[0]["train_mode"] is False  # training ended in eval mode: the model holds x
    for e in probe.evals:
        assert e["eval_mode"] and e["eval_loss"] == pytest.approx(e["loss_at_x"], rel=1e-5)
        assert abs(e["loss_at_x"] - e["loss_at_y"]) > 1e-4  # x and y really differ


def test_without_the_callback_a_checkpoint_holds_the_training_weights(tmp_path):
    _, opt, probe = run(tmp_path / "without", mode_callback=False)
    step4 = next(s for s in probe.saves if s["step"] == 4)
    assert step4["train_mode"] is True  # Trainer alone saves y at a step with no evaluation


def test_a_checkpoint_written_at_x_resumes_to_the_same_run(tmp_path):
    full, _, _ = run(tmp_path / "full", mode_callback=True)
    resumed, _, probe = run(tmp_path / "full", mode_callback=True, resume=str(tmp_path / "full" / "checkpoint-4"))
    assert [s["step"] for s in probe.saves] == [6]  # only steps 5-6 were trained after the resume
    for (n, a), b in zip(full.named_parameters(), resumed.parameters(), strict=False):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
