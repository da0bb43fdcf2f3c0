"""Sophia-G: the update equals the Sophia repository's rule, the GNB estimate is what the paper defines, and the
Trainer callback feeds it every k steps."""

from __future__ import annotations

import pytest
import torch
from transformers import Trainer, TrainingArguments
from transformers.optimization import get_constant_schedule

from hf_optbench.optim.registry import build_optimizer
from hf_optbench.optim.sophia_impl import SophiaG, SophiaGHessianCallback, gnb_hessian_update

from fixtures.models import tiny_model


def test_update_matches_the_sophia_repository_rule():
    """Reference: Liuhong99/Sophia sophia.py -- decay, momentum, clip(|m| / (rho*bs*h + 1e-15), 1) * sign(m),
    and update_hessian's h <- b2*h + (1-b2)*g*g. Ours keeps rho*bs*h in SophiaH's EMA; same numbers."""
    torch.manual_seed(0)
    lr, b1, b2, wd, rho, bs = 1e-2, 0.965, 0.99, 0.2, 0.05, 64
    p_ours = torch.nn.Parameter(torch.randn(5, 7))
    p_ref = p_ours.detach().clone()
    opt = SophiaG([p_ours], lr=lr, betas=(b1, b2), rho=rho, weight_decay=wd, update_period=3)
    m, h = torch.zeros_like(p_ref), torch.zeros_like(p_ref)
    n_clipped = n_free = 0
    for t in range(1, 13):
        g = torch.randn(5, 7) * 0.1
        p_ours.grad = g.clone()
        opt.step()
        p_ref.mul_(1 - lr * wd)
        m.mul_(b1).add_(g, alpha=1 - b1)
        ratio = (m.abs() / (rho * bs * h + 1e-15)).clamp(max=1)
        p_ref.addcmul_(m.sign(), ratio, value=-lr)
        if t % 3 == 0:
            gs = torch.randn(5, 7) * 0.3  # a sampled-label gradient
            p_ours.grad = gs.clone()
            opt.update_hessian(bs)
            h.mul_(b2).addcmul_(gs, gs, value=1 - b2)
        torch.testing.assert_close(p_ours.detach(), p_ref, rtol=1e-6, atol=1e-7)
        n_clipped += int((ratio >= 1).sum())
        n_free += int((ratio < 1).sum())
    assert n_clipped > 20 and n_free > 20  # both regimes of the clip were exercised
    assert set(opt.state[p_ours]) == {"momentum", "hessian_moment"}  # no stale 'hessian' alias kept
    assert opt.param_groups[0]["gnb_updates"] == 4


def test_without_hessian_estimates_it_fails_loudly():
    p = torch.nn.Parameter(torch.randn(3))
    opt = SophiaG([p], lr=1e-3, update_period=2)
    with pytest.raises(RuntimeError, match="SophiaGHessianCallback"):
        for _ in range(10):
            p.grad = torch.randn(3)
            opt.step()


def test_gnb_estimate_is_rho_B_g_squared_of_a_sampled_label_loss_and_spares_the_global_rng():
    model = tiny_model()
    opt = build_optimizer("sophia", model, lr=1e-3, weight_decay=0.0, rho=0.05)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    # one training step so the state exists, then the estimate from a zero EMA
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    rng = torch.get_rng_state()
    gnb_hessian_update(model, opt, ids, tokens_per_step=32, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    # the same estimate by hand
    logits = model(input_ids=ids).logits.reshape(-1, 128)
    y = torch.multinomial(torch.softmax(logits.detach(), -1), 1, generator=torch.Generator().manual_seed(7)).squeeze(-1)
    torch.nn.functional.cross_entropy(logits, y).backward()
    w = model.transformer.h[0].mlp.c_fc.weight
    expected = (1 - 0.99) * 0.05 * 32 * w.grad**2
    torch.testing.assert_close(opt.state[w]["hessian_moment"], expected, rtol=1e-5, atol=1e-12)


def test_trainer_callback_estimates_every_k_steps(tmp_path):
    model = tiny_model()
    opt = build_optimizer("sophia", model, lr=1e-3, update_period=2)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (16, 16), generator=g)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=2, use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0)
    cb = SophiaGHessianCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, get_constant_schedule(opt)),
                      callbacks=[cb])
    trainer.train()
    assert opt.param_groups[0]["gnb_updates"] == 3  # after steps 2, 4, 6
    h = opt.state[model.transformer.h[0].attn.c_attn.weight]["hessian_moment"]
    assert h.abs().sum() > 0
    assert cb._handle is None  # hook removed at the end
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_step_with_a_hessian_estimate_is_timed_with_it(tmp_path, monkeypatch):
    """The estimate runs inside the step the timing probe measures (on_optimizer_step), so Sophia's step time,
    tokens/s and MFU pay for it. A fake estimate that sleeps SLEEP seconds: the step that ran it is timed at
    least SLEEP (a sleep never returns early), and it ran at that step only. Before the fix it ran in
    on_step_end after the recorder had closed the window, and that step was timed like any other."""
    import json
    import time

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import default_callbacks
    from hf_optbench.optim import sophia_impl
    from hf_optbench.optim.registry import optimizer_callbacks

    sleep, ran_at = 1.0, []
    real = sophia_impl.gnb_hessian_update

    def slow_estimate(model, optimizer, input_ids, **kwargs):
        ran_at.append(optimizer.param_groups[0]["step"])
        time.sleep(sleep)
        return real(model, optimizer, input_ids, **kwargs)

    monkeypatch.setattr(sophia_impl, "gnb_hessian_update", slow_estimate)
    model = tiny_model()
    opt = build_optimizer("sophia", model, lr=1e-3, update_period=3)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (8, 16), generator=g)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=1, logging_nan_inf_filter=False,
                             disable_tqdm=True, seed=0)
    callbacks = default_callbacks(BenchArguments(timing_warmup_steps=0), str(tmp_path), tokens_per_step=2 * 16)
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, get_constant_schedule(opt)),
                      callbacks=[*callbacks, *optimizer_callbacks(opt)])
    trainer.train()  # returns after the recorder flushed metrics.jsonl (written in this thread)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["step_time_s"] for r in rows if r["kind"] == "train"}
    assert [float(s) for s in ran_at] == [3.0] and opt.param_groups[0]["gnb_updates"] == 1
    assert times[3] >= sleep, times
