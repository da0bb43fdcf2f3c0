"""Pure measurement functions shared by the callbacks (during a run) and the report (afterwards).

Torch is imported inside the functions that take tensors, so the report can use the rest (spikes, targets, AUC,
FLOPs, peak table) without it.

* Storage bytes: what a tensor really occupies, not ``numel() * element_size()``: the bytes of its untyped
  storage, each storage counted once (shared quantization maps, views, tied weights), and tensor subclasses
  (torchao's 8/4-bit optimizer states, DTensor shards) opened through ``__tensor_flatten__`` down to the plain
  tensors that hold memory. A logical-size count reports 8 B/param for torchao's 8-bit AdamW; storage gives ~2.
* FLOPs per token: ``6N + 12 L H Q T`` (PaLM, Chowdhery et al. 2022, arXiv:2204.02311, appendix B; the same
  count Chinchilla's appendix F approximates), with N the parameters used in matmuls.
* Device peaks: dense tensor-core (or FP32) peaks from NVIDIA's datasheets, keyed by device-name pattern and
  precision; an unlisted device gives ``None`` (MFU null), never a guess.
* Spike rule, time-to-target and the area under the loss curve, written once here so that the live callbacks and
  the report compute the same numbers from the same rows.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------------------------
# Storage bytes
# --------------------------------------------------------------------------------------------------------------


def _leaf_tensors(t: Any) -> Iterator[Any]:
    """Plain tensors that hold ``t``'s memory: ``t`` itself, or for a wrapper subclass its flattened inner tensors."""
    import torch

    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter and hasattr(t, "__tensor_flatten__"):
        # Traceable wrapper subclasses (torchao quantized states, DTensor, NF4Tensor) own no storage of their own:
        # their memory is in the inner tensors named by __tensor_flatten__ (PyTorch's subclass protocol).
        names, _ctx = t.__tensor_flatten__()
        for name in names:
            yield from _leaf_tensors(getattr(t, name))
    else:
        yield t


def _storage_key_and_bytes(t: Any) -> tuple[tuple, int]:
    """(dedupe key, bytes) of the storage behind a plain tensor."""
    if t.device.type == "meta":
        return ("meta", id(t)), 0
    try:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        ptr = storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # e.g. a functional or sparse tensor without a plain storage
        return ("logical", id(t)), t.numel() * t.element_size()
    if nbytes == 0:
        return ("empty", id(t)), 0
    return (t.device.type, t.device.index, ptr), nbytes


def tensor_storage_bytes(t: Any, seen: set | None = None) -> int:
    """Bytes of real storage behind ``t`` not already in ``seen`` (updated in place when given)."""
    seen = set() if seen is None else seen
    total = 0
    for leaf in _leaf_tensors(t):
        key, nbytes = _storage_key_and_bytes(leaf)
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def _walk_tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    """Tensors inside nested dict/list/tuple values (optimizer states hold lists of preconditioners, dicts...)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 4 and isinstance(obj, Mapping):
        for v in obj.values():
            yield from _walk_tensors(v, depth + 1)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk_tensors(v, depth + 1)


@dataclass
class StateBytes:
    """Real storage of an optimizer's state on this process."""

    total: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)
    by_name: dict[str, int] = field(default_factory=dict)
    by_device: dict[str, int] = field(default_factory=dict)
    num_tensors: int = 0
    master_bytes: int = 0  # parameters the optimizer updates that are not the model's (DeepSpeed's fp32 partition)

    def add(self, name: str, t: Any, seen: set) -> None:
        for leaf in _leaf_tensors(t):
            key, nbytes = _storage_key_and_bytes(leaf)
            if key in seen:
                continue
            seen.add(key)
            dtype = str(leaf.dtype).removeprefix("torch.")
            device = leaf.device.type
            self.total += nbytes
            self.num_tensors += 1
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + nbytes
            self.by_name[name] = self.by_name.get(name, 0) + nbytes
            self.by_device[device] = self.by_device.get(device, 0) + nbytes


# Attributes of torch.optim.Optimizer (and common wrappers) that are not state the optimizer allocated.
_NOT_STATE_ATTRS = frozenset({"state", "param_groups", "defaults"})


def unwrap_optimizer(optimizer: Any) -> list[Any]:
    """The chain of wrappers down to the optimizer that holds ``.state``: [outermost, ..., innermost].

    Accelerate's ``AcceleratedOptimizer`` and DeepSpeed's ``DeepSpeedZeroOptimizer`` (stages 1-2),
    ``DeepSpeedZeroOptimizer_Stage3`` and ``BF16_Optimizer`` all keep the optimizer they drive in ``.optimizer``.
    Under ZeRO the innermost one was built on this rank's flat fp32 partition, so its ``.state`` is exactly the
    partition of the moments this rank holds.
    """
    chain = [optimizer]
    while True:
        inner = getattr(chain[-1], "optimizer", None)
        if inner is None or inner is chain[-1] or inner in chain or not hasattr(inner, "param_groups"):
            return chain
        chain.append(inner)


def optimizer_state_bytes(optimizer: Any, model_params: Iterable[Any] | None = None) -> StateBytes:
    """Real storage of every tensor in the optimizer's state on this process (formula tests: tests/test_metrics.py).

    Counts, each storage once: the tensors in ``optimizer.state`` (named by their state key: exp_avg, state1,
    absmax1, qmap1, ...), and tensors held in the optimizer's own attributes outside ``.state`` (named
    ``attr:<name>``; e.g. bitsandbytes' shared quantization maps, optimizers that keep buffers elsewhere),
    excluding storages of the parameters and gradients themselves. Python numbers in the state (bitsandbytes'
    and Adafactor's ``step``) hold no tensor memory and count 0. For torch AdamW the result is exactly
    ``sum(2 * 4 * p.numel()) + 4 * n_tensors`` (two fp32 moments + a 0-d fp32 ``step`` per parameter tensor).

    ``master_bytes``: storage of parameters in the optimizer's param_groups that are not ``model_params`` (under
    DeepSpeed, the fp32 master partition of this rank); 0 when the optimizer updates the model's own tensors.
    """
    import torch

    inner = unwrap_optimizer(optimizer)[-1]
    groups = getattr(inner, "param_groups", []) or []
    opt_params = [p for g in groups for p in g.get("params", []) if isinstance(p, torch.Tensor)]
    exclude: set = set()
    for p in opt_params:
        tensor_storage_bytes(p, exclude)
        if p.grad is not None:
            tensor_storage_bytes(p.grad, exclude)
    result = StateBytes()
    seen = set(exclude)
    for per_param in getattr(inner, "state", {}).values():
        if isinstance(per_param, Mapping):
            for name, value in per_param.items():
                for t in _walk_tensors(value):
                    result.add(str(name), t, seen)
        else:
            for t in _walk_tensors(per_param):
                result.add("state", t, seen)
    for attr, value in vars(inner).items():
        if attr in _NOT_STATE_ATTRS or attr.startswith("_"):
            continue
        for t in _walk_tensors(value):
            result.add(f"attr:{attr}", t, seen)
    if model_params is not None:
        model_seen: set = set()
        for p in model_params:
            tensor_storage_bytes(p, model_seen)
        master_seen = set(model_seen)
        result.master_bytes = sum(tensor_storage_bytes(p, master_seen) for p in opt_params)
    return result


def params_storage_bytes(params: Iterable[Any]) -> int:
    """Real storage of a set of parameters (tied weights and shared storages once)."""
    seen: set = set()
    return sum(tensor_storage_bytes(p, seen) for p in params)


def grads_storage_bytes(params: Iterable[Any]) -> int:
    """Real storage of the ``.grad`` tensors of ``params`` that exist now."""
    seen: set = set()
    return sum(tensor_storage_bytes(p.grad, seen) for p in params if getattr(p, "grad", None) is not None)


def count_unique_params(params: Iterable[Any]) -> int:
    """Number of scalar parameters, each Parameter once; DeepSpeed ZeRO-3's partitioned ones by ``ds_numel``."""
    seen: set[int] = set()
    n = 0
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        n += int(getattr(p, "ds_numel", p.numel()))
    return n


# --------------------------------------------------------------------------------------------------------------
# FLOPs and device peaks
# --------------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------------
# Spikes
# --------------------------------------------------------------------------------------------------------------

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): makes the MAD a consistent estimator of a Gaussian's sigma
RELATIVE_SCALE_FLOOR = 1e-3  # robust deviation is at least 0.1% of |median|: a flat plateau has MAD 0


@dataclass(frozen=True)
class Spike:
    """A value flagged by the spike rule: its index/step, value, the window's median and its robust z."""

    index: int
    value: float
    baseline: float
    z: float


class SpikeDetector:
    """Streaming Hampel identifier on the upper side: the spike rule of the benchmark.

    A value x_t is a spike when ``x_t > median(W) + k * s`` with W the last ``window`` finite values *before* t,
    ``s = max(1.4826 * MAD(W), 1e-3 * |median(W)|)`` and at least ``min_history`` values in W. Its size is the
    robust z ``(x_t - median) / s``. Non-finite values are never spikes and do not enter W (divergence is
    reported separately). Spikes do enter W: a median is barely moved by one outlier, and a lasting jump stops
    being flagged once it is the new level.
    """

    def __init__(self, window: int = 50, threshold: float = 6.0, min_history: int = 10) -> None:
        if window < 3 or min_history < 2 or min_history > window or threshold <= 0:
            raise ValueError(f"bad spike rule: window={window}, threshold={threshold}, min_history={min_history}")
        self.window, self.threshold, self.min_history = window, threshold, min_history
        self._values: deque[float] = deque()  # arrival order
        self._sorted: list[float] = []  # the same values, sorted: the median is O(1) per step
        self.spikes: list[Spike] = []

    def update(self, value: float | None, index: int) -> Spike | None:
        """Feed the next value; returns the Spike if it is one."""
        if value is None or not math.isfinite(value):
            return None
        spike = None
        ordered = self._sorted
        if len(ordered) >= self.min_history:
            med = _sorted_median(ordered)
            floor = max(RELATIVE_SCALE_FLOOR * abs(med), 1e-12)
            # The scale is >= floor, so a value within threshold * floor of the median cannot be a spike: the MAD
            # (a sort of the window's deviations) is only computed for the values that might be one.
            if value - med > self.threshold * floor:
                mad = _sorted_median(sorted([abs(v - med) for v in ordered]))
                scale = max(MAD_TO_SIGMA * mad, floor)
                z = (value - med) / scale
                if z > self.threshold:
                    spike = Spike(index=index, value=value, baseline=med, z=z)
                    self.spikes.append(spike)
        if len(self._values) == self.window:
            old = self._values.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
        self._values.append(value)
        bisect.insort(ordered, value)
        return spike

    @property
    def count(self) -> int:
        return len(self.spikes)

    @property
    def largest(self) -> Spike | None:
        return max(self.spikes, key=lambda s: s.z) if self.spikes else None


def _sorted_median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def detect_spikes(
    values: Sequence[float | None],
    window: int = 50,
    threshold: float = 6.0,
    min_history: int = 10,
    steps: Sequence[int] | None = None,
) -> list[Spike]:
    """The spike rule over a whole series (``Spike.index`` is ``steps[i]`` when given, else ``i``)."""
    det = SpikeDetector(window, threshold, min_history)
    for i, v in enumerate(values):
        det.update(v, steps[i] if steps is not None else i)
    return det.spikes


# --------------------------------------------------------------------------------------------------------------
# Convergence
# --------------------------------------------------------------------------------------------------------------


class TargetTracker:
    """First point at which a (trailing-mean smoothed) loss reaches each target; targets only ever get reached once.

    ``smoothing=1`` uses the raw loss (eval losses are already averages over the validation split).
    """

    def __init__(self, targets: Iterable[float], smoothing: int = 1) -> None:
        self.targets = sorted({float(t) for t in targets}, reverse=True)
        self.smoothing = max(1, int(smoothing))
        self._window: deque[float] = deque(maxlen=self.smoothing)
        self._sum = 0.0
        self.reached: dict[float, dict[str, float | int | None]] = {}

    def update(self, loss: float | None, step: int, tokens: int | None, seconds: float | None) -> list[float]:
        """Feed one point; returns the targets reached at it. Non-finite losses are skipped."""
        if loss is None or not math.isfinite(loss):
            return []
        if len(self._window) == self.smoothing:
            self._sum -= self._window[0]
        self._window.append(loss)
        self._sum += loss
        if len(self._window) < self.smoothing:
            return []
        level = self._sum / self.smoothing
        hit = [t for t in self.targets if t not in self.reached and level <= t]
        for t in hit:
            self.reached[t] = {"step": step, "tokens": tokens, "seconds": seconds}
        return hit

    def as_dict(self) -> dict[str, dict[str, float | int | None] | None]:
        """{"<target>": {"step", "tokens", "seconds"} or None if never reached}."""
        return {_target_key(t): self.reached.get(t) for t in self.targets}


def _target_key(t: float) -> str:
    return repr(float(t))


def time_to_targets(
    points: Iterable[tuple[int, int | None, float | None, float | None]], targets: Iterable[float], smoothing: int = 1
) -> dict[str, dict[str, float | int | None] | None]:
    """Targets reached over ``(step, tokens, seconds, loss)`` points, in the format of ``TargetTracker.as_dict``."""
    tracker = TargetTracker(targets, smoothing)
    for step, tokens, seconds, loss in points:
        tracker.update(loss, step, tokens, seconds)
    return tracker.as_dict()


def trapezoid_auc(x: Sequence[float], y: Sequence[float | None]) -> float | None:
    """Trapezoid area under y(x) over the finite points (x ascending); None with fewer than two.

    The area under loss-vs-tokens ranks optimizers by how low the loss was *throughout* a fixed budget, not only
    at the end; divide by the token span for the mean loss.
    """
    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True) if a is not None and b is not None and math.isfinite(b)]
    if len(pts) < 2:
        return None
    return sum(0.5 * (y0 + y1) * (x1 - x0) for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False))


def median_and_p90(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Median and 90th percentile (linear interpolation between order statistics, as numpy's default)."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None, None
    if len(vals) == 1:
        return vals[0], vals[0]
    return statistics.median(vals), statistics.quantiles(vals, n=10, method="inclusive")[8]
