"""Training FLOPs per token, the devices' peak FLOP/s and MFU: the figures behind ``mfu`` in summary.json.

* FLOPs per token: ``6N + 12 L H Q T`` (PaLM, Chowdhery et al. 2022, arXiv:2204.02311, appendix B; the same
  count Chinchilla's appendix F approximates), with N the parameters used in matmuls.
* Device peaks: dense tensor-core (or FP32) peaks from NVIDIA's datasheets, keyed by device-name pattern and
  precision; an unlisted device gives ``None`` (MFU null), never a guess.

Pure Python (no torch), so the report can use it too.
"""

from __future__ import annotations

import re
from typing import Any


def transformer_flops_per_token(matmul_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token, ``6 N + 12 L H Q T`` (PaLM appendix B; ``H * Q = n_embd``).

    ``6N``: forward (2N) + backward (4N) multiply-adds of the weight matmuls. ``12 L H Q T``: the attention score
    and value matmuls (QK^T and AV), which grow with the sequence length T. Causal masking is not discounted
    (PaLM's convention), so MFU stays comparable with published figures.
    """
    return 6.0 * matmul_params + 12.0 * n_layer * n_embd * seq_len


def gpt2_matmul_params(n_layer: int, n_embd: int, vocab_size: int, n_inner: int | None = None) -> int:
    """Parameters of a GPT-2 that take part in matmuls per token: all but the position table (a lookup).

    Per block: c_attn (d x 3d + 3d), attn c_proj (d x d + d), c_fc (d x f + f), mlp c_proj (f x d + d), two
    LayerNorms (4d); plus ln_f (2d) and the tied token embedding once, as the output projection (V x d). This is
    the count nanoGPT's ``estimate_mfu`` uses (parameters minus ``wpe``).
    """
    f = n_inner or 4 * n_embd
    per_block = 4 * n_embd * n_embd + 2 * n_embd * f + 3 * n_embd + n_embd + f + n_embd + 4 * n_embd
    return n_layer * per_block + 2 * n_embd + vocab_size * n_embd


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token of a GPT-2 ``config`` (any object with n_layer, n_embd, vocab_size, n_inner)."""
    try:
        n_layer, n_embd, vocab = int(config.n_layer), int(config.n_embd), int(config.vocab_size)
    except AttributeError as exc:
        raise ValueError(f"flops_per_token needs a GPT-2-style config (n_layer, n_embd, vocab_size): {exc}") from exc
    n = gpt2_matmul_params(n_layer, n_embd, vocab, getattr(config, "n_inner", None))
    return transformer_flops_per_token(n, n_layer, n_embd, int(seq_len))


_T = 1e12
# (name pattern, label, {precision: dense peak FLOP/s}, source). Tensor-core figures are the datasheets' dense
# numbers, i.e. half of the "with sparsity" ones. Order matters: the first pattern that matches wins.
DEVICE_PEAK_FLOPS: tuple[tuple[str, str, dict[str, float], str], ...] = (
    (r"H100.*NVL", "H100 NVL", {"fp32": 60 * _T, "tf32": 417.5 * _T, "bf16": 835.5 * _T, "fp16": 835.5 * _T},
     "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column)"),
    (r"H100.*PCIe", "H100 PCIe", {"fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T, "fp16": 756 * _T},
     "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column)"),
    (r"H100|H800", "H100 SXM", {"fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T},
     "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)"),
    (r"H200", "H200 / GH200", {"fp32": 67 * _T, "tf32": 494.5 * _T, "bf16": 989.5 * _T, "fp16": 989.5 * _T},
     "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)"),
    (r"A100|A800", "A100", {"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T},
     "NVIDIA A100 Tensor Core GPU datasheet"),
    (r"L40S", "L40S", {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362 * _T, "fp16": 362 * _T},
     "NVIDIA L40S GPU datasheet"),
    (r"\bL4\b", "L4", {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T},
     "NVIDIA L4 Tensor Core GPU datasheet"),
    (r"\bA10\b", "A10", {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T},
     "NVIDIA A10 Tensor Core GPU datasheet"),
    (r"V100.*PCIE", "V100 PCIe", {"fp32": 14 * _T, "fp16": 112 * _T},
     "NVIDIA Tesla V100 GPU datasheet (PCIe column)"),
    (r"V100", "V100 SXM2", {"fp32": 15.7 * _T, "fp16": 125 * _T}, "NVIDIA Tesla V100 GPU datasheet (SXM2 column)"),
    (r"\bT4\b", "T4", {"fp32": 8.1 * _T, "fp16": 65 * _T}, "NVIDIA T4 Tensor Core GPU datasheet"),
    (r"P100", "P100 PCIe", {"fp32": 9.3 * _T, "fp16": 18.7 * _T}, "NVIDIA Tesla P100 PCIe datasheet"),
)
_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def device_peak_flops(device_name: str | None, precision: str) -> float | None:
    """Dense peak FLOP/s of one device for ``precision`` (fp32, tf32, bf16, fp16); None if not listed.

    TF32 on a device without TF32 (T4, V100, P100) runs FP32 matmuls, so it falls back to the FP32 peak; bf16 on
    a device without bf16 is None. CPUs are not listed: their peak depends on cores, clock and SIMD width.
    """
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
    if not device_name:
        return None
    for pattern, _label, peaks, _source in DEVICE_PEAK_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            if precision in peaks:
                return peaks[precision]
            return peaks["fp32"] if precision == "tf32" else None
    return None


def model_flops_utilization(
    flops_per_token: float | None, tokens_per_s: float | None, peak_flops_per_device: float | None, num_devices: int
) -> float | None:
    """MFU = achieved model FLOP/s over the peak of all devices; None when any input is unknown."""
    if not flops_per_token or not tokens_per_s or not peak_flops_per_device or num_devices < 1:
        return None
    return flops_per_token * tokens_per_s / (peak_flops_per_device * num_devices)
