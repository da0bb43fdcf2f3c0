"""What tensors really occupy: storage bytes of an optimizer's state, of parameters and of gradients.

Not ``numel() * element_size()``: the bytes of each tensor's untyped storage, each storage counted once (shared
quantization maps, views, tied weights), and tensor subclasses (torchao's 8/4-bit optimizer states, DTensor
shards) opened through ``__tensor_flatten__`` down to the plain tensors that hold memory. A logical-size count
reports 8 B/param for torchao's 8-bit AdamW; storage gives ~2. Torch is imported inside the functions, so
importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.optim.unwrap import innermost_optimizer


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


# The old name of optim.unwrap.optimizer_chain: one owner for the walk, so every caller stops at the same place.


def optimizer_state_bytes(optimizer: Any, model_params: Iterable[Any] | None = None) -> StateBytes:
    """Real storage of every tensor in the optimizer's state on this process (tests/measure/test_metrics.py).

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

    inner = innermost_optimizer(optimizer)
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
