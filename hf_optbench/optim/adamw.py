"""AdamW (Loshchilov & Hutter 2019) as torch.optim.AdamW, and the GPT-3 / nanoGPT defaults other families derive
from.

Size classes: the CPU sizes tiny/mini/midi have no published GPT-2 recipe, so they use nanoGPT's settings for its
10M-parameter "baby GPT" (karpathy/nanoGPT config/train_shakespeare_char.py); gpt2 / gpt2-medium / gpt2-large use
GPT-3's 125M / 350M / 760M rows (Brown et al. 2020, Table 2.1) and gpt2-xl (1.5B) the nearest row, 1.3B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.optim.spec import CitedDefaults, OptimizerSpec, StateLayout, per_tensor, trainable_params

if TYPE_CHECKING:
    import torch

# The warmup these sources use (GPT-3: 375M tokens; nanoGPT: 100 iterations) is not taken from here: a benchmark
# run's budget is far from GPT-3's 300B tokens, so every optimizer warms up over the same fraction of its steps
# (``warmup_steps: 0.1`` in config/parse.py, the recipes' value), which keeps the schedules comparable.
CITATIONS: dict[str, str] = {
    "gpt3": "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 (peak LR per size) and Appendix B "
            "(Adam betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, 375M-token linear warmup, cosine to 10%)",
    "nanogpt_small": "karpathy/nanoGPT config/train_shakespeare_char.py (baby GPT: lr 1e-3, beta2 0.99, 100 warmup "
                     "iters, min_lr = lr/10) and train.py (weight_decay 0.1, grad_clip 1.0)",
}

# GPT-3 Table 2.1 peak learning rates; GPT-2 sizes mapped to the nearest GPT-3 row (models.SIZE_CLASS).
GPT3_LR = {"125M": 6.0e-4, "350M": 3.0e-4, "760M": 2.5e-4, "1.3B": 2.0e-4}


def adamw_base(size_class: str) -> CitedDefaults:
    """AdamW's cited hyperparameters for a size class (the base several optimizers derive from)."""
    if size_class == "cpu":
        return CitedDefaults({"learning_rate": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.99), "eps": 1e-8,
                              "max_grad_norm": 1.0}, cite="nanogpt_small")
    return CitedDefaults({"learning_rate": GPT3_LR[size_class], "weight_decay": 0.1, "betas": (0.9, 0.95),
                          "eps": 1e-8, "max_grad_norm": 1.0}, cite="gpt3")


def defaults(size_class: str) -> CitedDefaults:
    """AdamW's own defaults are the base, cited to GPT-3 / nanoGPT."""
    return adamw_base(size_class)


def fused_ok(params: list[torch.nn.Parameter]) -> bool:
    """torch has a fused AdamW kernel for every param's device (CUDA, CPU, MPS, XPU, ...) and dtype. Measured here:
    on CPU (2 threads) one step on a 124M parameter set took 0.089 s fused vs 0.666 s foreach (median;
    benchmarks/bench_optimizer_step.py measures it again), so fused is chosen wherever it exists."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    return bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """torch.optim.AdamW, fused where the device has the kernel, else foreach (unless ``ctor`` chooses)."""
    import torch

    if "fused" not in ctor and "foreach" not in ctor:
        if fused_ok(trainable_params(model)):
            ctor["fused"] = True
        else:
            ctor["foreach"] = True
    opt = torch.optim.AdamW(groups, lr=lr, **ctor)
    mode = "fused=True" if opt.defaults.get("fused") else "foreach=True" if opt.defaults.get("foreach") else \
        "single-tensor"
    return opt, f"torch.optim.AdamW({mode})"


def adamw_tensor_bytes(p: Any, s: int) -> int:
    """torch.optim.AdamW (fused/foreach): ``exp_avg`` + ``exp_avg_sq`` like the parameter, plus a 4-byte fp32
    ``step`` tensor per parameter (torch.optim.AdamW source)."""
    return 2 * s * p.numel + 4


LAYOUT = StateLayout("adamw", per_tensor(adamw_tensor_bytes))

SPECS = (
    OptimizerSpec("adamw", "torch.optim.AdamW", build, defaults,
                  ("betas", "eps", "amsgrad", "fused", "foreach", "capturable"),
                  "AdamW (Loshchilov & Hutter 2019); fused kernel where torch has one for the device (CUDA and "
                  "CPU), else foreach", LAYOUT, aliases=("adamw_torch", "adamw_torch_fused", "adamw_fused")),
)
