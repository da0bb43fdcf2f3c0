"""What the optimizer sees under DeepSpeed ZeRO: one flat 1-D fp32 partition per parameter group and rank.

ZeRO never hands the optimizer the model's tensors. Stages 1-2 (deepspeed/runtime/zero/stage_1_and_2.py,
DeepSpeed 0.19) flatten each param group into one buffer padded to a multiple of ``2 * world_size`` elements
(``nccl_start_alignment_factor = 2``), split it into ``world_size`` equal partitions, clone this rank's partition
as fp32 master weights (``single_partition_of_fp32_groups``; a copy even when training in fp32) and replace the
group's params with that one 1-D tensor. Stage 3 (stage3.py) partitions each parameter into ``ceil(numel / world)``
elements, concatenates the partitions of a group into sub-groups of at least ``sub_group_size`` elements
(default 1e9) and gives the optimizer one fp32 tensor per sub-group.

So an optimizer's state under ZeRO is its own per-tensor formula applied to those 1-D partitions: a factored
second moment (Adafactor) becomes a full one, bitsandbytes' per-parameter fp32 override for embeddings is lost
(the partition is not the embedding) while ``min_8bit_size`` applies to the partition, and layouts that need
matrices (Muon, SOAP) are refused by ``optim.registry.check_zero_compatible``. tests/test_zero_planner.py checks
the result against the storage measured on two CPU ranks under ZeRO-2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

ZERO_ALIGNMENT = 2  # stage_1_and_2.py: nccl_start_alignment_factor (4-byte alignment / sizeof(fp16))
ZERO3_SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's default zero_optimization.sub_group_size
MASTER_BYTES = 4  # the master partitions (and the optimizer state on them) are fp32 under every precision


class _Tensor(Protocol):
    shape: tuple[int, ...]

    @property
    def numel(self) -> int: ...


@dataclass(frozen=True)
class FlatPartition:
    """One 1-D tensor the optimizer holds under ZeRO (``optim.spec.TensorShape``): never an embedding nor a
    hidden matrix, whatever it was flattened from."""

    size: int
    is_embedding: bool = False
    is_hidden_matrix: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.size,)

    @property
    def numel(self) -> int:
        return self.size


def param_group_numels(shapes: Sequence[_Tensor]) -> list[list[int]]:
    """Element counts per GPT-3 param group, as ``optim.spec.param_groups`` builds them: tensors of >= 2 dims
    (weight decay) first, then the 1-D ones; empty groups left out."""
    decay = [t.numel for t in shapes if len(t.shape) >= 2]
    no_decay = [t.numel for t in shapes if len(t.shape) < 2]
    return [g for g in (decay, no_decay) if g]


def zero_partitions(shapes: Sequence[_Tensor], world_size: int, zero_stage: int,
                    sub_group_size: int = ZERO3_SUB_GROUP_SIZE) -> list[FlatPartition]:
    """The flat tensors one rank's optimizer holds (every rank holds the same sizes)."""
    if zero_stage < 1:
        raise ValueError("zero_partitions is for ZeRO stages 1-3")
    out: list[FlatPartition] = []
    for numels in param_group_numels(shapes):
        if zero_stage < 3:
            align = ZERO_ALIGNMENT * world_size
            out.append(FlatPartition(math.ceil(sum(numels) / align) * align // world_size))
            continue
        parts = [math.ceil(n / world_size) for n in numels]
        if sum(parts) <= sub_group_size:
            out.append(FlatPartition(sum(parts)))
            continue
        acc = 0
        for i, n in enumerate(parts):  # stage3.py _create_fp16_sub_groups
            acc += n
            if acc >= sub_group_size or i == len(parts) - 1:
                out.append(FlatPartition(acc))
                acc = 0
    return out
