"""Refuse a run whose model cannot fit in this machine's memory, before the model is built.

Why: ``--model_size gpt2-xl`` on a CPU with 21 GiB free, or a position table or vocabulary padding of tens of
millions of rows, allocated 12-26 GB and ended in a traceback (or the kernel's OOM killer) after 13-90 s. The
memory planner (:func:`hf_optbench.measure.planner.plan_memory`: parameters, gradients, optimizer state by the
optimizer's own state layout, activations) gives what the run needs from its plan alone; this module compares it
with what the training device has left: on CUDA the device's free memory, on the CPU the RAM ``psutil`` calls
available, lowered to a container's cgroup limit or an address-space limit (``ulimit -v``) where one is set (both
kill or fail a run that psutil's figure would let through).

It refuses only when the plan is larger than everything available: the planner's figure is an estimate without the
allocator's, the CUDA context's or the runtime's overhead, so a run it lets through may still not fit, but a run it
refuses cannot. ``--skip_memory_check true`` tries anyway (an estimate can be wrong: a custom attention kernel, an
optimizer the planner models loosely). Not checked: a model loaded with ``init_from`` (its shape is the
checkpoint's), DeepSpeed runs (offloading moves state off the device, which the planner does not model), devices
other than the CPU and CUDA.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.machine import Room, cpu_memory_room

if TYPE_CHECKING:
    from hf_optbench.measure.planner import MemoryPlan
    from hf_optbench.run.plan import RunPlan

def available_memory(device: Any) -> Room | None:
    """What the training device has left for this run: CUDA's free memory on ``device``, or on the CPU the least of
    psutil's available RAM, a cgroup limit's room and an address-space limit's room; None on other devices."""
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return Room(int(free), f"the {torch.cuda.get_device_name(device)} has {{}} GiB free")
    if kind != "cpu":
        return None
    return cpu_memory_room()


def _precision(training: Any) -> str:
    return "bf16" if training.bf16 else "fp16" if training.fp16 else "fp32"


def planned_memory(plan: RunPlan, vocab_size: int) -> MemoryPlan:
    """The planner's figure for this run's model, optimizer, precision and micro-batch at ``vocab_size`` tokens
    (padded as the model will be). A dotted-path optimizer has no state formula: its state counts 0 (a lower
    bound, so the check never refuses for it wrongly)."""
    from hf_optbench.measure.planner import plan_memory

    cfg, t = plan.args, plan.args.training
    known = plan.optimizer.spec is not None
    memory = plan_memory(plan.model.model_size, plan.optimizer.name if known else "adamw",
                         precision=_precision(t), world_size=plan.batch.world_size,
                         micro_batch_size=plan.batch.per_device_train_batch_size, block_size=plan.batch.block_size,
                         vocab_size=vocab_size, n_positions=plan.model.n_positions,
                         attn_implementation=cfg.model.attn_implementation,
                         gradient_checkpointing=bool(t.gradient_checkpointing),
                         embedding_state_32bit=plan.optimizer.embedding_state_32bit,
                         pad_vocab_to_multiple_of=cfg.model.pad_vocab_to_multiple_of)
    if not known:
        memory.total_bytes -= memory.optimizer_state_bytes
        memory.optimizer_state_bytes = memory.optimizer_state_bytes_total = 0
    return memory


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f}"


def check_memory_fits(plan: RunPlan, vocab_size: int | None) -> None:
    """OptBenchError (exit 2) when the run's planned memory exceeds what its device has left, naming both in GiB
    and the fix. ``vocab_size`` None: the tokenizer is not loaded yet, and one row (padded) stands for it, so the
    figure is a lower bound ("at least") and a refusal is still certain; the exact check follows once the data
    says how many tokens the vocabulary holds."""
    cfg = plan.args
    if cfg.run.skip_memory_check or cfg.model.init_from or plan.zero_stage > 0:
        return
    room = available_memory(cfg.training.device)
    if room is None:
        return
    memory = planned_memory(plan, vocab_size or 1)
    # CPU processes of one launch on this machine share its RAM, each holding a whole copy (no ZeRO here)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if getattr(cfg.training.device, "type", "") == "cpu" else 1
    need = memory.total_bytes * max(local, 1)
    if need <= room.bytes:
        return
    parts = ", ".join(f"{name} {_gib(n)}" for name, n in (
        ("parameters", memory.param_bytes), ("gradients", memory.grad_bytes),
        ("optimizer state", memory.optimizer_state_bytes), ("activations", memory.activation_bytes)))
    processes = f" x {local} processes" if local > 1 else ""
    raise OptBenchError(
        f"the run needs {'at least ' if vocab_size is None else ''}{_gib(need)} GiB ({memory.model_size}, "
        f"{memory.num_params / 1e6:,.1f}M parameters, {plan.optimizer.name}, {memory.precision}: {parts} GiB"
        f"{processes}; planned by hf_optbench.measure.planner) and {room.source.format(_gib(room.bytes))}: it "
        "cannot fit. Choose a smaller model_size, per_device_train_batch_size, block_size or n_positions "
        "(`hf-optbench memory` plans a configuration), or pass --skip_memory_check true to try anyway.")
