"""AdamW's non-matrix group (embeddings, head, LayerNorm gains, biases) at its own learning rate: the freedom Muon's
auxiliary AdamW has, given to the baseline (issue 29), as an ordinary constructor argument."""

from __future__ import annotations

import pytest
import torch

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.adamw import NONMATRIX_KEY, split_matrix_params
from hf_optbench.optim.registry import build_optimizer, optimizer_defaults
from hf_optbench.optim.spec import param_groups

from fixtures.models import tiny_model


def _rates(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr"] for g in opt.param_groups for p in g["params"]}


def test_the_ratio_puts_the_non_matrix_group_at_its_own_rate() -> None:
    model = tiny_model()
    opt = build_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, model_size="tiny", **{NONMATRIX_KEY: 0.25})
    rates = _rates(model, opt)
    matrices, other = split_matrix_params(model)
    assert len(rates) == len(matrices) + len(other) == len(list(model.parameters()))
    assert rates["transformer.h.0.attn.c_attn.weight"] == 1e-3 and rates["transformer.h.1.mlp.c_proj.weight"] == 1e-3
    for name in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                 "transformer.h.0.attn.c_attn.bias", "transformer.ln_f.bias"):
        assert rates[name] == pytest.approx(2.5e-4), name
    # weight decay still by shape (GPT-3): the embedding decays, gains and biases do not
    decay = {n: g["weight_decay"] for g in opt.param_groups for n, p in model.named_parameters()
             if any(p is q for q in g["params"])}
    assert decay["transformer.wte.weight"] == 0.1 and decay["transformer.ln_f.bias"] == 0.0
    assert {g["param_role"] for g in opt.param_groups} == {"matrix", "nonmatrix"}


def test_ratio_one_keeps_the_groups_and_the_updates_of_plain_adamw() -> None:
    """The cited default (one rate for every group) builds exactly the optimizer every earlier run had."""
    m1, m2 = tiny_model(), tiny_model()
    opt = build_optimizer("adamw", m1, lr=1e-3, weight_decay=0.1, model_size="tiny")
    ref = torch.optim.AdamW(param_groups(m2, 0.1), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, fused=True)
    assert len(opt.param_groups) == len(ref.param_groups) == 2 and "param_role" not in opt.param_groups[0]
    x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    for model, o in ((m1, opt), (m2, ref)):
        model(input_ids=x, labels=x).loss.backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))


def test_the_default_is_cited_and_a_bad_ratio_is_refused() -> None:
    for name in ("adamw", "muon"):
        d = optimizer_defaults(name, "tiny")
        assert d[NONMATRIX_KEY] == 1.0 and "nonmatrix_lr_ratio 1" in d["sources"][NONMATRIX_KEY]
    with pytest.raises(OptBenchError, match="nonmatrix_lr_ratio must be a finite number > 0"):
        build_optimizer("adamw", tiny_model(), lr=1e-3, **{NONMATRIX_KEY: 0.0})
    with pytest.raises(OptBenchError, match="not an argument of lion"):
        build_optimizer("lion", tiny_model(), lr=1e-3, **{NONMATRIX_KEY: 0.5})
