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
    m1, m2 = tiny_model(), tiny_model()
    opt = build_optimizer("muon", m1, lr=1e-3, weight_decay=0.1, model_size="gpt2")
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
