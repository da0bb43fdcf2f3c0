"""Every registered optimizer has torch's standard state dict ({"state": ..., "param_groups": ...}) and round-trips
through torch.distributed.checkpoint.state_dict (get_optimizer_state_dict / set_optimizer_state_dict), the API
FSDP checkpointing uses: after the round trip, one more step on the same batch gives bit-identical weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from hf_optbench.optim.registry import OPTIMIZERS, build_optimizer

from fixtures.models import tiny_model

CASES = [pytest.param(name, marks=[pytest.mark.gpu] if spec.requires_cuda else [])
         for name, spec in OPTIMIZERS.items()]


def _device(name: str) -> str:
    return "cuda" if OPTIMIZERS[name].requires_cuda else "cpu"


def _build(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = build_optimizer(name, model, lr=1e-3, model_size="tiny")
    if callable(getattr(opt, "train", None)):
        opt.train()  # schedule-free optimizers step only in train mode
    return opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    device = next(model.parameters()).device
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(seed)).to(device)
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", CASES)
def test_standard_state_dict_round_trips_through_distributed_checkpoint(name: str) -> None:
    if _device(name) == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = tiny_model(vocab=256).to(_device(name))  # wte 256x32 > bnb's min_8bit_size: really 8-bit state
    opt = _build(name, model)
    for seed in range(3):
        _step(model, opt, seed)
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups"}
    n_params = len(list(model.parameters()))
    assert sorted(i for g in sd["param_groups"] for i in g["params"]) == list(range(n_params))

    saved = copy.deepcopy(get_optimizer_state_dict(model, opt))  # keyed by parameter name
    assert set(saved) == {"state", "param_groups"} and "transformer.wte.weight" in saved["state"]
    model2 = copy.deepcopy(model)
    opt2 = _build(name, model2)
    set_optimizer_state_dict(model2, opt2, saved)

    _step(model, opt, 99)
    _step(model2, opt2, 99)
    for (pname, a), b in zip(model.named_parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b), f"{name}: {pname} differs after the round trip"


def test_muon_reads_the_nested_state_dict_of_earlier_checkpoints() -> None:
    model = tiny_model(vocab=256)
    opt = _build("muon", model)
    _step(model, opt, 0)
    nested = copy.deepcopy({"muon": opt.muon.state_dict(), "adamw": opt.adamw.state_dict()})
    model2 = copy.deepcopy(model)
    opt2 = _build("muon", model2)
    opt2.load_state_dict(nested)
    assert opt2.param_groups[0] is opt2.muon.param_groups[0]
    _step(model, opt, 1)
    _step(model2, opt2, 1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True))
    with pytest.raises(ValueError, match="param groups"):
        opt2.load_state_dict({"state": {}, "param_groups": opt2.state_dict()["param_groups"][:1]})
