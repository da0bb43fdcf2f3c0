"""check_zero_compatible: the optimizers that cannot run on DeepSpeed ZeRO's flat partitions are refused with the
reason and the fix, before any work (the reasons are measured in tests/test_zero_planner.py)."""

from __future__ import annotations

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import OPTIMIZERS, check_zero_compatible


def test_check_zero_compatible_refuses_with_the_reason_and_the_fix() -> None:
    refused = [n for n, s in OPTIMIZERS.items() if s.zero_incompatible]
    runs = [n for n, s in OPTIMIZERS.items() if not s.zero_incompatible]
    assert set(refused) == {"muon", "soap", "sophia", "schedule_free_adamw"}
    for name in refused:
        check_zero_compatible(name, 0)
        with pytest.raises(OptBenchError, match=rf"'{name}' cannot run under DeepSpeed ZeRO-2: .*cpu_ddp2.yaml"):
            check_zero_compatible(name, 2)
    for name in [*runs, "adamw_torch", "torch.optim.RAdam"]:
        check_zero_compatible(name, 3)


@pytest.mark.parametrize("name, expected", [
    ("adamw", "torch.optim.AdamW(fused=True) [ZeRO flat partitions]"),
    ("adamw_8bit", "bitsandbytes.optim.AdamW8bit(ZeRO flat partitions: 1 of 2 8-bit, no fp32 embedding state)"),
    ("adafactor", "second moment factored on 0 of 2 tensors, ZeRO flat partitions)"),
])
def test_describe_optimizer_states_what_flat_partitions_hold(name: str, expected: str) -> None:
    """What DeepSpeed ZeRO-1/2 does to the optimizer (one flat fp32 tensor per param group in place of the model's
    tensors), done by hand: the implementation string follows the state, not what was requested at build."""
    import torch

    from hf_optbench.optim.registry import build_optimizer, describe_optimizer

    from fixtures.models import tiny_model

    model = tiny_model(vocab=256)
    opt = build_optimizer(name, model, model_size="tiny")
    for group in opt.param_groups:
        flat = torch.cat([p.detach().reshape(-1) for p in group["params"]]).requires_grad_()
        flat.grad = torch.randn_like(flat)
        group["params"] = [flat]
    opt.step()
    assert describe_optimizer(opt, model=model).endswith(expected), describe_optimizer(opt, model=model)
