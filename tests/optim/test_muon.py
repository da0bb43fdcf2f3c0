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
    """With Newton-Schulz in bf16 (forced: ``auto`` may pick fp32) the composite is torch.optim.Muon +
    torch.optim.AdamW: the AdamW part bit for bit, the Muon part to bf16's rounding of a batched matmul against
    single ones (bit for bit on this project's AMD EPYC, torch 2.13)."""
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
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        if id(b) in hid:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # 4 steps of 1e-3 x match_rms's factor <= 3.2
        else:
            assert torch.equal(a, b)
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
    """A group at bf16 steps as torch.optim.Muon (to bf16's rounding of a batched matmul: bit for bit here),
    whatever the other groups do."""
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
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-6)
    assert not torch.equal(a[1], b[1].detach())
    assert [g["ns_precision"] for g in ours.param_groups] == ["bf16", "fp32"]
    with pytest.raises(ValueError, match="ns_precision"):
        MuonNS([torch.nn.Parameter(torch.randn(3, 3))], ns_precision="fp16")


def test_ns_precision_is_checked_and_auto_resolved_for_the_model_s_device(monkeypatch):
    """A Python-API build resolves auto itself, on the model's own hidden matrices (timings injected here)."""
    from hf_optbench.optim import muon_precision

    with pytest.raises(OptBenchError, match="ns_precision 'half' is not one of auto, bf16, fp32"):
        build_optimizer("muon", tiny_model(), ns_precision="half")
    seen = []
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    monkeypatch.setattr(muon_precision, "measure", lambda shapes: seen.append(shapes) or
                        {"bf16_ms": 1.0, "fp32_ms": 2.0, "bf16_error": 0.01, "bf16_timed": True})
    opt = build_optimizer("muon", tiny_model())  # auto, as a Python-API user gets it
    assert opt.muon.param_groups[0]["ns_precision"] == "bf16"
    assert muon_precision.shapes_key(seen[0]) == muon_precision.shapes_key(muon_precision.gpt2_matrix_shapes(2, 32))


def _shapes_params(seed: int = 0) -> list[torch.nn.Parameter]:
    """Matrices as GPT-2's blocks have them (Conv1D (in, out)): wide c_attn and c_fc, square c_proj, tall MLP c_proj
    (stacked with c_fc once transposed), three of each, and one of a shape of its own."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 48), (16, 16), (16, 64), (64, 16)] * 3 + [(24, 40)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize(("nesterov", "adjust_lr_fn", "chunk_bytes"),
                         [(True, "match_rms_adamw", None), (False, "original", None), (True, "original", 8000)])
def test_batched_newton_schulz_equals_the_per_matrix_path(precision, nesterov, adjust_lr_fn, chunk_bytes,
                                                         monkeypatch):
    """MuonNS orthogonalises same-shape matrices together (muon_impl.muon_batched); per matrix that is the
    one-matrix-at-a-time path (muon_impl.muon_per_matrix, torch's _single_tensor_muon with the precision's cast) to
    float tolerance, over steps with momentum, Nesterov or not, weight decay and a shape-dependent LR factor (the
    'original' one tells a tall matrix from its wide transpose); fp32 stacks also cut into chunks (8000 bytes: of
    2 and 1 matrices here)."""
    from hf_optbench.optim import muon_impl
    from hf_optbench.optim.muon_impl import NS_DTYPES, MuonNS, muon_per_matrix

    if chunk_bytes:
        monkeypatch.setattr(muon_impl, "FP32_CHUNK_BYTES", chunk_bytes)
        sizes = [len(s) for s in muon_impl._stacks([torch.zeros(s) for s in [(16, 16)] * 3 + [(16, 64)] * 6],
                                                  torch.float32)]
        assert sizes == [3, 1, 1, 1, 1, 1, 1]

    ours = _shapes_params()
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kwargs = {"lr": 0.02, "weight_decay": 0.1, "nesterov": nesterov, "adjust_lr_fn": adjust_lr_fn}
    opt = MuonNS(ours, ns_precision=precision, **kwargs)
    group = {**opt.param_groups[0], "params": ref}
    bufs = [torch.zeros_like(p) for p in ref]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in ours]
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        with torch.no_grad():
            muon_per_matrix(NS_DTYPES[precision], ref, [q.grad for q in ref], bufs, group)
    # fp32: summation order of a batched against a single matmul; bf16: a rounding step of bf16 at most
    atol = 1e-6 if precision == "fp32" else 2e-4
    for p, q, b in zip(ours, ref, bufs, strict=True):
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], b, rtol=0, atol=1e-7)
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=atol)


def test_batched_muon_checkpoints_load_into_torch_s_muon_and_back():
    """The state is torch.optim.Muon's (one momentum_buffer per matrix, in its order): a MuonNS state dict loads into
    torch.optim.Muon and back, and both then step alike."""
    from hf_optbench.optim.muon_impl import MuonNS

    ours, theirs = _shapes_params(), _shapes_params()
    opt = MuonNS(ours, ns_precision="bf16", lr=0.02)
    for p in ours:
        p.grad = torch.ones_like(p)
    opt.step()
    ref = torch.optim.Muon(theirs, lr=0.02)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))
    with torch.no_grad():
        for p, q in zip(ours, theirs, strict=True):
            q.copy_(p)
    for p, q in zip(ours, theirs, strict=True):
        p.grad = q.grad = torch.full_like(p, 0.5)
    opt.step()
    ref.step()
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-5)
    back = MuonNS(_shapes_params(), ns_precision="bf16", lr=0.02)
    back.load_state_dict(ref.state_dict())
    assert back.param_groups[0]["ns_precision"] == "bf16" and len(back.state) == len(ours)
