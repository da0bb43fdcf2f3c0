"""The model's activation: build_config uses torch's fused tanh GELU (``gelu_pytorch_tanh``), which is
GPT-2's own ``gelu_new`` computed by one kernel: equal to float rounding element-wise and through a whole model,
and recorded in the model's config."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel
from transformers.activations import ACT2FN

from hf_optbench.errors import OptBenchError
from hf_optbench.models import build_config


def test_build_config_uses_the_fused_tanh_gelu_and_records_it(tmp_path) -> None:
    cfg = build_config("tiny", 64)
    assert cfg.activation_function == "gelu_pytorch_tanh"
    model = GPT2LMHeadModel(cfg)
    assert type(model.transformer.h[0].mlp.act).__name__ == "GELUTanh"
    model.config.save_pretrained(tmp_path)
    assert '"activation_function": "gelu_pytorch_tanh"' in (tmp_path / "config.json").read_text()
    assert build_config("tiny", 64, activation_function="gelu_new").activation_function == "gelu_new"
    with pytest.raises(OptBenchError, match="activation_function 'gelu_nwe'.*gelu_new"):
        build_config("tiny", 64, activation_function="gelu_nwe")


def test_fused_tanh_gelu_equals_gpt2_gelu_new() -> None:
    x = torch.linspace(-12, 12, 200_001)
    new, fused = ACT2FN["gelu_new"], ACT2FN["gelu_pytorch_tanh"]
    torch.testing.assert_close(fused(x), new(x), atol=1e-6, rtol=0)  # fp32: a few ulp apart
    torch.testing.assert_close(fused(x.double()), new(x.double()), atol=1e-12, rtol=0)  # the same function
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = []
    for act in ("gelu_new", "gelu_pytorch_tanh"):
        torch.manual_seed(0)  # the same init: the activation has no parameters
        model = GPT2LMHeadModel(build_config("tiny", 64, n_positions=16, activation_function=act)).eval()
        with torch.no_grad():
            logits.append(model(input_ids=ids).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)
