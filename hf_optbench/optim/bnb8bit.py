"""bitsandbytes' block-wise 8-bit AdamW and Lion (Dettmers et al. 2022, "8-bit Optimizers via Block-wise
Quantization"), plain and paged (state in CUDA unified memory), and its 32-bit Lion (what transformers builds for
``optim: lion_32bit``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hf_optbench.optim import adamw, lion
from hf_optbench.optim.spec import (
    CitedDefaults,
    OptimizerSpec,
    StateLayout,
    TensorShape,
    trainable_params,
    with_note,
)

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "bnb8bit": "Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization (ICLR): same hyperparameters as "
               "the 32-bit optimizer; 32-bit state for embeddings for stability",
}

BNB_BLOCK_SIZE = 256  # bitsandbytes blockwise quantisation block (bnb.functional, optimizer_update_8bit_blockwise)
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit(min_8bit_size=4096): smaller tensors keep fp32 state
# bitsandbytes keeps two 256-entry fp32 quantisation maps ("dynamic", "udynamic") per optimizer, shared by all
# tensors, whether the update uses one (Lion) or both (Adam).
BNB_QMAP_BYTES = 2 * 256 * 4


def eight_bit(base: Callable[[str], CitedDefaults]) -> Callable[[str], CitedDefaults]:
    """Defaults of an 8-bit variant: the 32-bit optimizer's own values, with the 8-bit paper cited on every key
    beside the 32-bit optimizer's sources (the paper keeps the 32-bit hyperparameters)."""

    def defaults(size_class: str) -> CitedDefaults:
        return dataclasses.replace(base(size_class), also="bnb8bit")

    return defaults


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any], *,
          spec: OptimizerSpec,
          embedding_state_32bit: bool, **_: Any) -> tuple[Any, str]:
    """The bitsandbytes class named by ``spec.implementation``; embeddings keep 32-bit state unless asked."""
    import bitsandbytes as bnb
    import torch

    cls = getattr(bnb.optim, spec.implementation.rsplit(".", 1)[1])
    manager = bnb.optim.GlobalOptimManager.get_instance()
    # The manager is process-global and keyed by id(param): drop entries a freed tensor may have left under an id
    # one of ours now reuses, then mark the embeddings (the library's own per-parameter override).
    for p in trainable_params(model):
        manager.pid2config.pop(id(p), None)
    # index2config is keyed by (group, position) and survives the optimizer that filled it: an earlier optimizer's
    # embedding override at (0, 0) would apply to whatever sits there now (under ZeRO, a whole flat partition).
    # Safe to clear: get_config falls back to pid2config for optimizers not yet initialised.
    manager.index2config.clear()
    embeddings = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.weight.requires_grad]
    if embedding_state_32bit:
        for weight in embeddings:
            manager.override_config(weight, "optim_bits", 32)
    opt = cls(groups, lr=lr, **ctor)
    emb = "embedding fp32" if embedding_state_32bit else "embedding 8-bit"
    return opt, f"{spec.implementation}({emb} requested)"


def build_32bit(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any], *,
                spec: OptimizerSpec, **_: Any) -> tuple[Any, str]:
    """The bitsandbytes class named by ``spec.implementation``, all state in 32 bits (no embedding override)."""
    import bitsandbytes as bnb

    return getattr(bnb.optim, spec.implementation.rsplit(".", 1)[1])(groups, lr=lr, **ctor), spec.implementation


def describe(opt: Any, built: str, flattened: bool, *, embedding_ids: frozenset[int] = frozenset()) -> str:
    """The implementation string from the dtypes the state really has (``state1``: uint8 when quantised, fp32
    otherwise): the embeddings' (``embedding_ids``, from the model it was built over) when the optimizer holds them,
    the flat partitions' under ZeRO (where the per-parameter embedding override cannot apply). Before the first
    step: what was requested."""
    base = built.split("(", 1)[0]
    held = [(p, opt.state[p]["state1"].dtype) for g in opt.param_groups for p in g["params"]
            if p in opt.state and "state1" in opt.state[p]]
    if not held:
        return with_note(built, "not yet stepped")
    if flattened:
        n8 = sum(str(d) == "torch.uint8" for _, d in held)
        return f"{base}(ZeRO flat partitions: {n8} of {len(held)} 8-bit, no fp32 embedding state)"
    emb = [str(d) == "torch.uint8" for p, d in held if id(p) in embedding_ids]
    if not emb:
        return f"{base}(no embedding)"
    if all(emb) or not any(emb):
        return f"{base}(embedding {'8-bit' if all(emb) else 'fp32'})"
    # e.g. no override, and a position embedding below min_8bit_size keeps fp32 state
    return f"{base}(embedding 8-bit on {sum(emb)} of {len(emb)} embedding tensors, fp32 on the rest)"


def _layout(name: str, n_states: int) -> StateLayout:
    """Per state one byte per element plus one fp32 absmax per 256-element block; tensors under 4,096 elements
    (``min_8bit_size``) and, when ``embedding_state_32bit``, the embeddings keep fp32 state; the two 256-entry fp32
    quantisation maps are shared by all tensors (counted once, when any tensor is quantised)."""

    def state_bytes(shapes: Sequence[TensorShape], s: int, embedding_state_32bit: bool) -> int:
        total, any_8bit = 0, False
        for p in shapes:
            n = p.numel
            if n < BNB_MIN_8BIT_SIZE or (embedding_state_32bit and p.is_embedding):
                total += n_states * 4 * n
            else:
                total += n_states * (n + 4 * math.ceil(n / BNB_BLOCK_SIZE))
                any_8bit = True
        return total + (BNB_QMAP_BYTES if any_8bit else 0)

    return StateLayout(name, state_bytes, per_tensor=True)


ADAMW_LAYOUT = _layout("adamw_8bit", 2)
LION_LAYOUT = _layout("lion_8bit", 1)
_ADAMW_KWARGS = ("betas", "eps", "amsgrad", "min_8bit_size")
_LION_KWARGS = ("betas", "min_8bit_size")
_PAGED = "state in CUDA unified (paged) memory"

SPECS = (
    OptimizerSpec("adamw_8bit", "bitsandbytes.optim.AdamW8bit", build, eight_bit(adamw.defaults), _ADAMW_KWARGS,
                  "block-wise 8-bit AdamW state (Dettmers et al. 2022); embedding state 32-bit unless "
                  "embedding_state_32bit=false", ADAMW_LAYOUT, package="bitsandbytes", describe=describe,
                  aliases=("adamw8bit", "adamw_bnb_8bit")),
    OptimizerSpec("paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit", build, eight_bit(adamw.defaults),
                  _ADAMW_KWARGS, f"8-bit AdamW with {_PAGED}", ADAMW_LAYOUT, package="bitsandbytes",
                  describe=describe, requires_cuda=True),
    OptimizerSpec("lion_8bit", "bitsandbytes.optim.Lion8bit", build, eight_bit(lion.defaults), _LION_KWARGS,
                  "block-wise 8-bit Lion state (bitsandbytes); embedding state 32-bit unless "
                  "embedding_state_32bit=false", LION_LAYOUT, package="bitsandbytes", describe=describe,
                  aliases=("lion8bit",), tune_weight_decay=True),
    OptimizerSpec("paged_lion_8bit", "bitsandbytes.optim.PagedLion8bit", build, eight_bit(lion.defaults),
                  _LION_KWARGS, f"8-bit Lion with {_PAGED}", LION_LAYOUT, package="bitsandbytes",
                  describe=describe, requires_cuda=True, tune_weight_decay=True),
    # transformers 5's optim "lion_32bit" builds bitsandbytes.optim.Lion(optim_bits=32), the class Lion32bit is
    OptimizerSpec("lion_32bit", "bitsandbytes.optim.Lion32bit", build_32bit, lion.defaults, ("betas",),
                  "Lion with bitsandbytes' 32-bit state (transformers' optim lion_32bit)", lion.LAYOUT,
                  package="bitsandbytes", tune_weight_decay=True),
)
