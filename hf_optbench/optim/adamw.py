"""AdamW (Loshchilov & Hutter 2019) as torch.optim.AdamW, and the GPT-3 / nanoGPT defaults other families derive
from.

Size classes: the CPU sizes tiny/mini/midi have no published GPT-2 recipe, so they use nanoGPT's settings for its
10M-parameter "baby GPT" (karpathy/nanoGPT config/train_shakespeare_char.py); gpt2 / gpt2-medium / gpt2-large use
GPT-3's 125M / 350M / 760M rows (Brown et al. 2020, Table 2.1) and gpt2-xl (1.5B) the nearest row, 1.3B.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.spec import (
    EMBEDDING,
    GPT3_GROUPS,
    MATRIX,
    VECTOR,
    CitedDefaults,
    GroupLayout,
    OptimizerSpec,
    StateLayout,
    per_tensor,
    trainable_params,
)

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
    "one_rate": "Brown et al. 2020, Appendix B, and karpathy/nanoGPT train.py: one peak learning rate for every "
                "parameter group (nonmatrix_lr_ratio 1). The non-matrix group's rate as a hyperparameter of its own: "
                "Wen et al. 2025, arXiv:2509.02046, and marin-community/marin experiments/optimizer_sweep PhaseI "
                "(Muon's muon_to_adam_lr, swept 0.1-0.3)",
}

# The non-matrix group: token and position embeddings, the output head (tied to the token embedding in GPT-2),
# LayerNorm gains and every bias -- what Muon leaves to AdamW (KellerJordan/Muon README). Its learning rate is
# ``nonmatrix_lr_ratio`` x learning_rate, a constructor argument of the families that take it (adamw, muon), so the
# tuning phase can tune it for the baseline as for Muon (study.tuning).
NONMATRIX_KEY = "nonmatrix_lr_ratio"

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
    """AdamW's own defaults are the base, cited to GPT-3 / nanoGPT, and one rate for every group."""
    return adamw_base(size_class).derive("one_rate", **{NONMATRIX_KEY: 1.0})


def split_matrix_params(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(hidden 2-D matrices, the non-matrix group). Embeddings (input and output, tied or not) and every tensor that
    is not 2-D are non-matrix, as the Muon README prescribes for its AdamW part; tied weights appear once."""
    import torch

    excluded: set[int] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            excluded.add(id(module.weight))
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None and getattr(out, "weight", None) is not None:
        excluded.add(id(out.weight))
    matrices, other = [], []
    for _, p in model.named_parameters():  # named_parameters() yields a tied weight once
        if not p.requires_grad:
            continue
        (matrices if p.ndim == 2 and id(p) not in excluded else other).append(p)
    return matrices, other


def rate_groups(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float,
                ratio: float) -> list[dict[str, Any]]:
    """The GPT-3 groups with the non-matrix parameters at ``lr x ratio`` in groups of their own (``param_role``
    says which is which in summary.json's param_groups); with ratio 1 the groups as they are (one rate: the
    layout, and so the checkpoints, of every run before the ratio existed)."""
    if ratio == 1.0:
        return groups
    if not ratio > 0 or ratio != ratio or ratio == float("inf"):
        raise OptBenchError(f"{NONMATRIX_KEY} must be a finite number > 0, got {ratio!r}.")
    matrices, _ = split_matrix_params(model)
    ids = {id(p) for p in matrices}
    out = []
    for g in groups:
        mine = [p for p in g["params"] if id(p) in ids]
        rest = [p for p in g["params"] if id(p) not in ids]
        if mine:
            out.append({**g, "params": mine, "lr": lr, "param_role": "matrix"})
        if rest:
            out.append({**g, "params": rest, "lr": lr * ratio, "param_role": "nonmatrix"})
    return out


def fused_ok(params: list[torch.nn.Parameter]) -> bool:
    """torch has a fused AdamW kernel for every param's device (CUDA, CPU, MPS, XPU, ...) and dtype. Measured here:
    on CPU (2 threads) one step on a 124M parameter set took 0.089 s fused vs 0.666 s foreach (median;
    benchmarks/bench_optimizer_step.py measures it again), so fused is chosen wherever it exists."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    return bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """torch.optim.AdamW, fused where the device has the kernel, else foreach (unless ``ctor`` chooses); the
    non-matrix group at ``nonmatrix_lr_ratio`` x lr (:func:`rate_groups`)."""
    import torch

    groups = rate_groups(model, groups, lr, float(ctor.pop(NONMATRIX_KEY, 1.0)))
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
# With nonmatrix_lr_ratio != 1 (rate_groups): the decayed matrices at the learning rate, the decayed embeddings and
# the vectors at the ratio x it; with 1, the GPT-3 groups as they are.
SPLIT_GROUPS = (GroupLayout("decay", (MATRIX,)),
                GroupLayout("decay_nonmatrix", (EMBEDDING,), lr_ratio_kwarg=NONMATRIX_KEY),
                GroupLayout("no_decay", (VECTOR,), decay=False, lr_ratio_kwarg=NONMATRIX_KEY))


def groups(constructor: Mapping[str, Any]) -> tuple[GroupLayout, ...]:
    """The groups :func:`build` makes for these constructor values (:func:`rate_groups`)."""
    return GPT3_GROUPS if float(constructor.get(NONMATRIX_KEY, 1.0)) == 1.0 else SPLIT_GROUPS

SPECS = (
    OptimizerSpec("adamw", "torch.optim.AdamW", build, defaults,
                  ("betas", "eps", "amsgrad", "fused", "foreach", "capturable", NONMATRIX_KEY),
                  "AdamW (Loshchilov & Hutter 2019); fused kernel where torch has one for the device (CUDA and "
                  "CPU), else foreach", LAYOUT, aliases=("adamw_torch", "adamw_torch_fused", "adamw_fused"),
                  groups=groups),
)
