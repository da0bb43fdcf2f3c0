"""MuonWithAuxAdamW: torch.optim.Muon on the hidden matrices and torch.optim.AdamW on the rest, as one optimizer."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.adamw import split_matrix_params
from hf_optbench.optim.registry import build_optimizer
from hf_optbench.optim.spec import param_groups

from fixtures.models import tiny_model


def step(model, opt, seed):
    x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_muon_gets_exactly_the_hidden_matrices():
    model = tiny_model()
    hidden, other = split_matrix_params(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)].split(".", 2)[-1] for p in hidden) == sorted(
        [f"{i}.attn.c_attn.weight" for i in range(2)] + [f"{i}.attn.c_proj.weight" for i in range(2)]
        + [f"{i}.mlp.c_fc.weight" for i in range(2)] + [f"{i}.mlp.c_proj.weight" for i in range(2)])
    assert {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)} <= {id(p) for p in other}
    assert len(hidden) + len(other) == len(list(model.parameters()))


def test_hybrid_equals_separate_torch_muon_and_adamw():
    """With Newton-Schulz in bf16 (forced: ``auto`` is fp32 on a CPU without native bf16) the composite is
    torch.optim.Muon + torch.optim.AdamW bit for bit."""
    m1, m2 = tiny_model(), tiny_model()
    opt = build_optimizer("muon", m1, lr=1e-3, weight_decay=0.1, model_size="gpt2", ns_precision="bf16")
    hidden, _ = split_matrix_params(m2)
    hid = {id(p) for p in hidden}
    groups = param_groups(m2, 0.1)
    muon = torch.optim.Muon([{**g, "params": [p for p in g["params"] if id(p) in hid]} for g in groups
                             if any(id(p) in hid for p in g["params"])],
                            lr=1e-3, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{**g, "params": [p for p in g["params"] if id(p) not in hid]} for g in groups],
                              lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for s in range(4):
        step(m1, opt, s)
        x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(s))
        m2(input_ids=x, labels=x).loss.backward()
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=False))
    # momentum only for the hidden matrices, Adam moments for the rest
    assert all(set(s) == {"momentum_buffer"} for s in opt.muon.state.values()) and len(opt.muon.state) == 8
    assert len(opt.state) == len(list(m1.parameters()))
    assert "exp_avg_sq" in opt.state[m1.transformer.wte.weight]


def test_scheduler_drives_both_children_and_state_dict_round_trips():
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    m1 = tiny_model()
    opt = build_optimizer("muon", m1, lr=1e-3)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, 2, 10, min_lr_rate=0.1)
    for s in range(3):
        step(m1, opt, s)
        sched.step()
    lrs = {g["lr"] for g in opt.muon.param_groups} | {g["lr"] for g in opt.adamw.param_groups}
    assert lrs == {sched.get_last_lr()[0]} and lrs != {1e-3}
    saved = copy.deepcopy(opt.state_dict())  # as if saved to disk: state_dict() shares tensors
    m2 = tiny_model()
    m2.load_state_dict(m1.state_dict())
    opt2 = build_optimizer("muon", m2, lr=1e-3)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0] is opt2.muon.param_groups[0]  # groups re-linked after load
    assert len(opt2.state) == len(opt.state) == len(list(m1.parameters()))  # and the merged state view
    assert opt2.state[m2.transformer.wte.weight] is opt2.adamw.state[m2.transformer.wte.weight]
    step(m1, opt, 9)
    step(m2, opt2, 9)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=False))


def test_original_lr_scaling_needs_its_own_lr_and_warns_about_conv1d():
    with pytest.raises(OptBenchError, match="muon_lr"):
        build_optimizer("muon", tiny_model(), adjust_lr_fn="original")
    with pytest.warns(UserWarning, match="Conv1D"):
        opt = build_optimizer("muon", tiny_model(), adjust_lr_fn="original", muon_lr=0.02, lr=3e-4)
    assert {g["lr"] for g in opt.muon.param_groups} == {0.02}
    assert {g["lr"] for g in opt.adamw.param_groups} == {3e-4}


def test_the_auxiliary_adamw_part_has_its_own_rate():
    """Issue 29: Muon's non-matrix group (embeddings, head, gains, biases) trained at Muon's own rate; the ratio puts
    it at a rate of its own, which a scheduler scales with the matrices' rate."""
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    model = tiny_model()
    opt = build_optimizer("muon", model, lr=0.064, weight_decay=0.1, model_size="tiny", nonmatrix_lr_ratio=0.125)
    assert {g["lr"] for g in opt.muon.param_groups} == {0.064}
    assert [g["lr"] for g in opt.adamw.param_groups] == pytest.approx([0.008] * len(opt.adamw.param_groups))
    assert any(p is model.transformer.wte.weight for g in opt.adamw.param_groups for p in g["params"])
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, 2, 10, min_lr_rate=0.1)
    for s in range(3):
        step(model, opt, s)
        sched.step()
    muon_lr, adamw_lr = opt.muon.param_groups[0]["lr"], opt.adamw.param_groups[0]["lr"]
    assert muon_lr < 0.064 and adamw_lr == pytest.approx(muon_lr * 0.125)


def _muon_pair(precision: str, nesterov: bool = True):
    """(model, its Muon at ``precision``) and an independent fp64 reference of the same update for comparison."""
    model = tiny_model()
    opt = build_optimizer("muon", model, lr=1e-3, weight_decay=0.1, model_size="tiny", ns_precision=precision,
                          nesterov=nesterov)
    return model, opt


@pytest.mark.parametrize("nesterov", [True, False])
def test_fp32_newton_schulz_is_torch_s_update_in_fp32(nesterov):
    """The fp32 path is torch's update with only the iteration's dtype changed: against torch's own Newton-Schulz run
    in fp64 the fp32 step lands within 1e-4 of the fp64 one (relative to the step), the bf16 step only within bf16's
    rounding (measured 0.1 at worst over the tiny model's matrices); momentum buffers and their layout are torch's either way."""
    from torch.optim._muon import _adjust_lr

    from hf_optbench.optim.muon_impl import newton_schulz

    results = {}
    for precision in ("fp32", "bf16"):
        model, opt = _muon_pair(precision, nesterov)
        before = {id(p): p.detach().clone() for g in opt.muon.param_groups for p in g["params"]}
        step(model, opt, 0)
        group = opt.muon.param_groups[0]
        assert group["ns_precision"] == precision
        worst = 0.0
        for p in group["params"]:
            buf = opt.muon.state[p]["momentum_buffer"]
            assert set(opt.muon.state[p]) == {"momentum_buffer"} and buf.dtype == p.dtype and buf.shape == p.shape
            grad = buf / (1 - group["momentum"])  # first step: buf = (1 - momentum) * grad
            update = grad.lerp(buf, group["momentum"]) if nesterov else buf
            ortho = newton_schulz(update.double(), group["ns_coefficients"], group["ns_steps"], group["eps"],
                                  torch.float64)
            lr = _adjust_lr(group["lr"], group["adjust_lr_fn"], p.shape)
            want = before[id(p)].double() * (1 - group["lr"] * group["weight_decay"]) - lr * ortho
            moved = (want - before[id(p)].double()).norm()
            worst = max(worst, float((p.detach().double() - want).norm() / moved))
        results[precision] = worst
    assert results["fp32"] < 1e-4 < 1e-3 < results["bf16"] < 0.5, results


def test_bf16_and_mixed_groups_step_like_torch():
    """A group at bf16 steps exactly as torch.optim.Muon (the same functional call), whatever the other groups do."""
    from hf_optbench.optim.muon_impl import MuonNS

    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(8, 5)), torch.nn.Parameter(torch.randn(6, 6))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    ours = MuonNS([{"params": [a[0]]}, {"params": [a[1]], "ns_precision": "fp32"}], lr=0.02, ns_precision="bf16")
    ref = torch.optim.Muon([b[0]], lr=0.02)
    for _ in range(3):
        g = [torch.randn(8, 5), torch.randn(6, 6)]
        for p, q, grad in zip(a, b, g, strict=False):
            p.grad, q.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1].detach())
    assert [g["ns_precision"] for g in ours.param_groups] == ["bf16", "fp32"]
    with pytest.raises(ValueError, match="ns_precision"):
        MuonNS([torch.nn.Parameter(torch.randn(3, 3))], ns_precision="fp16")


def test_ns_precision_is_checked_and_auto_resolved_for_the_model_s_device():
    from hf_optbench.optim.muon import bf16_matmul_native

    with pytest.raises(OptBenchError, match="ns_precision 'half' is not one of auto, bf16, fp32"):
        build_optimizer("muon", tiny_model(), ns_precision="half")
    opt = build_optimizer("muon", tiny_model())  # auto, as a Python-API user gets it
    native, _ = bf16_matmul_native("cpu")
    assert opt.muon.param_groups[0]["ns_precision"] == ("bf16" if native else "fp32")
