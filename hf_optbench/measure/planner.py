"""Analytic memory planner: GPT-2 size x optimizer x precision x ZeRO stage x world size -> bytes per GPU.

    hf-optbench memory --model gpt2-xl --optimizer lion --precision bf16 --zero-stage 2 --world-size 4 \\
        --micro-batch-size 8 --block-size 1024 [--json]

Why by hand: accelerate's ``estimate-memory`` counts parameters and an Adam-shaped state only; it knows neither
Lion/Adafactor/8-bit/schedule-free state layouts nor ZeRO partitioning nor activations. The optimizer-state
figure here is *exact* for the implementations hf_optbench builds (tests compare it with the measured storage
bytes on the CPU sizes), because it is computed per parameter tensor from the same shapes the model has, by the
optimizer's own ``StateLayout``: each family module under ``hf_optbench/optim/`` (``adamw.py``, ``lion.py``,
``bnb8bit.py``, ...) declares and documents the state its implementation keeps.

Precision: Trainer/Accelerate mixed precision (``bf16``/``fp16``) autocasts the compute and keeps fp32
parameters, gradients and optimizer state; ``bf16-pure`` stores the model in bf16 (torch optimizers then keep
bf16 state). DeepSpeed ZeRO with bf16/fp16 keeps 16-bit parameters and gradients plus an fp32 master copy
that is partitioned with the optimizer state (Rajbhandari et al. 2020, "ZeRO", sec. 3: 2 + 2 + K bytes per
parameter). Stage 1 partitions optimizer state (+ master), stage 2 also gradients, stage 3 also parameters,
each over the world size. The optimizer never sees the model's tensors under ZeRO: it holds one flat 1-D fp32
partition per param group (``planner_zero``), an fp32 master copy under every precision (fp32 included), and its
state is its own formula applied to those partitions (Adafactor unfactored, 8-bit without the fp32 embedding
override). Optimizers that cannot run flattened (Muon, SOAP, Sophia-G, schedule-free) are refused with
``optim.registry.check_zero_compatible``'s error. Measured equal on two CPU ranks (tests/test_zero_planner.py).

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", eq. 1):
``s*b*h*(34 + 5*a*s/h)`` bytes per layer with 16-bit activations and dropout. hf_optbench trains without
dropout (no masks: ``32*s*b*h + 2*a*s^2*b``), and SDPA's fused kernels store no s^2 scores (only an fp32
log-sum-exp per head and position, ``4*a*s*b``). fp32 activations double the s*b*h terms. Full recomputation
(gradient checkpointing) keeps ``2*s*b*h`` per layer plus one layer's activations. The LM head adds the
logits (compute dtype), their fp32 copy for the loss and the fp32 log-softmax: ``(act + 4 + 4)*s*b*V`` bytes
(``act + 4`` when the compute dtype is already fp32). It is an estimate: allocator caching, the CUDA context
and temporary buffers of the optimizer step are not in it, hence the fit margin below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.planner_zero import MASTER_BYTES, zero_partitions
from hf_optbench.optim.registry import ALIASES, OPTIMIZERS, check_zero_compatible
from hf_optbench.optim.spec import StateLayout

# Usable memory as nvidia-smi reports it (MiB): a plan "fits" below FIT_MARGIN of it and is "tight" up to it.
GPUS: dict[str, int] = {
    "T4 16GB": 15_360 * 2**20,
    "A100 40GB": 40_960 * 2**20,
    "A100 80GB": 81_920 * 2**20,
    "H100 80GB": 81_559 * 2**20,
}
# 10 % left for the CUDA context (~0.3-0.5 GiB), cuBLAS/NCCL workspaces and allocator fragmentation.
FIT_MARGIN = 0.9

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-pure")
DEFAULT_VOCAB = 50_304  # GPT-2's 50,257 and the Thai tokenizer's 50,266 both pad to 50,304 (multiple of 64)


@dataclass(frozen=True)
class ParamShape:
    """One trainable tensor as the planner sees it: what an optimizer's ``StateLayout`` needs (shape, and whether
    it is an embedding (8-bit optimizers keep its state fp32) or a hidden matrix (Muon's share))."""

    name: str
    shape: tuple[int, ...]
    is_embedding: bool = False
    is_hidden_matrix: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def gpt2_param_shapes(size: str, vocab_size: int = DEFAULT_VOCAB, n_positions: int = 1024) -> list[ParamShape]:
    """The trainable tensors of ``models.build_model(size, ...)`` (tied LM head counted once), in module order.

    ``vocab_size`` is the number of embedding rows (already padded). Conv1D weights are (in, out).
    """
    from hf_optbench.models import GPT2_SIZES, resolve_size

    shape = GPT2_SIZES[resolve_size(size)]
    L, d = shape["n_layer"], shape["n_embd"]
    out = [ParamShape("transformer.wte.weight", (vocab_size, d), is_embedding=True),
           ParamShape("transformer.wpe.weight", (n_positions, d), is_embedding=True)]
    for i in range(L):
        p = f"transformer.h.{i}."
        out += [
            ParamShape(p + "ln_1.weight", (d,)), ParamShape(p + "ln_1.bias", (d,)),
            ParamShape(p + "attn.c_attn.weight", (d, 3 * d), is_hidden_matrix=True),
            ParamShape(p + "attn.c_attn.bias", (3 * d,)),
            ParamShape(p + "attn.c_proj.weight", (d, d), is_hidden_matrix=True),
            ParamShape(p + "attn.c_proj.bias", (d,)),
            ParamShape(p + "ln_2.weight", (d,)), ParamShape(p + "ln_2.bias", (d,)),
            ParamShape(p + "mlp.c_fc.weight", (d, 4 * d), is_hidden_matrix=True),
            ParamShape(p + "mlp.c_fc.bias", (4 * d,)),
            ParamShape(p + "mlp.c_proj.weight", (4 * d, d), is_hidden_matrix=True),
            ParamShape(p + "mlp.c_proj.bias", (d,)),
        ]
    out += [ParamShape("transformer.ln_f.weight", (d,)), ParamShape("transformer.ln_f.bias", (d,))]
    return out


def state_layout(optimizer: str) -> StateLayout:
    """The state layout of a registry name or alias; OptBenchError naming the modelled ones otherwise."""
    key = str(optimizer).strip().lower().replace("-", "_")
    spec = OPTIMIZERS.get(ALIASES.get(key, key))
    if spec is None:
        raise OptBenchError(
            f"the memory planner has no state formula for optimizer '{optimizer}'. It models: "
            f"{', '.join(sorted([*OPTIMIZERS, *ALIASES]))}. Measure it with a short run instead (summary.json: "
            "optimizer_state_bytes)."
        )
    return spec.layout


def planned_optimizer_state_bytes(optimizer: str, shapes: Sequence[ParamShape], *, state_bytes: int = 4,
                                  embedding_state_32bit: bool = True) -> int:
    """Bytes of optimizer state for these tensors (unpartitioned). ``state_bytes``: element size of the
    torch optimizers' state (that of the parameters: 4 for fp32, 2 for bf16-pure)."""
    return state_layout(optimizer).state_bytes(shapes, state_bytes, embedding_state_32bit)


def activation_bytes(size: str, *, micro_batch_size: int, block_size: int, vocab_size: int = DEFAULT_VOCAB,
                     precision: str = "bf16", attn_implementation: str = "sdpa",
                     gradient_checkpointing: bool = False) -> int:
    """Estimated activation memory of one micro-batch (see the module docstring for the formula)."""
    from hf_optbench.models import GPT2_SIZES, resolve_size

    shape = GPT2_SIZES[resolve_size(size)]
    L, h, a = shape["n_layer"], shape["n_embd"], shape["n_head"]
    s, b = block_size, micro_batch_size
    act = 4 if precision == "fp32" else 2
    sbh = s * b * h * (act // 2)  # Korthikanti's terms are in 2-byte units
    scores = 4 * a * s * b if attn_implementation != "eager" else 2 * a * s * s * b * (act // 2)
    per_layer = 32 * sbh + scores
    layers = (2 * sbh * L + per_layer) if gradient_checkpointing else per_layer * L
    final_ln = 4 * sbh
    logits = s * b * vocab_size * (act + (4 if act != 4 else 0) + 4)
    return layers + final_ln + logits


@dataclass
class MemoryPlan:
    """Bytes per GPU; ``optimizer_state_bytes_total`` is summed over the ranks (each rank's whole state without
    ZeRO; the partitions of every rank under ZeRO), as summary.json's measured key."""

    model_size: str
    optimizer: str
    precision: str
    zero_stage: int
    world_size: int
    micro_batch_size: int
    block_size: int
    vocab_size: int
    n_positions: int
    num_params: int
    param_bytes: int
    grad_bytes: int
    master_weight_bytes: int
    optimizer_state_bytes: int
    optimizer_state_bytes_total: int
    activation_bytes: int
    total_bytes: int
    fits: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _partition(nbytes: int, world_size: int, partitioned: bool) -> int:
    return math.ceil(nbytes / world_size) if partitioned else nbytes


def plan_memory(model_size: str, optimizer: str, *, precision: str = "bf16", zero_stage: int = 0,
                world_size: int = 1, micro_batch_size: int = 8, block_size: int = 1024,
                vocab_size: int = DEFAULT_VOCAB, n_positions: int | None = None,
                attn_implementation: str = "sdpa", gradient_checkpointing: bool = False,
                embedding_state_32bit: bool = True, pad_vocab_to_multiple_of: int = 64) -> MemoryPlan:
    """Per-GPU memory of one training configuration. ``n_positions`` defaults to ``block_size`` (as a run does);
    ``vocab_size`` is rounded up to ``pad_vocab_to_multiple_of`` like models.build_model."""
    from hf_optbench.models import padded_vocab_size, resolve_size

    size = resolve_size(model_size)
    layout = state_layout(optimizer)
    if precision not in PRECISIONS:
        raise OptBenchError(f"unknown precision '{precision}'. Choose one of: {', '.join(PRECISIONS)}.")
    if zero_stage not in (0, 1, 2, 3):
        raise OptBenchError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}.")
    for key, value in (("world_size", world_size), ("micro_batch_size", micro_batch_size),
                       ("block_size", block_size), ("vocab_size", vocab_size)):
        if value < 1:
            raise OptBenchError(f"{key} must be a positive integer, got {value}.")
    n_pos = n_positions or block_size
    if block_size > n_pos:
        raise OptBenchError(f"block_size {block_size} exceeds n_positions {n_pos}: lower block_size.")
    vocab = padded_vocab_size(vocab_size, pad_vocab_to_multiple_of)
    shapes = gpt2_param_shapes(size, vocab, n_pos)
    n = sum(p.numel for p in shapes)
    notes: list[str] = []

    p_bytes = 2 if precision == "bf16-pure" or (zero_stage > 0 and precision in ("bf16", "fp16")) else 4
    if zero_stage > 0:
        state, state_total, master = _zero_state(layout, optimizer, shapes, precision, zero_stage, world_size,
                                                 notes)
    else:
        state = state_total = layout.state_bytes(shapes, 2 if precision == "bf16-pure" else 4,
                                                 embedding_state_32bit)
        master = 0
    if precision == "bf16-pure":
        notes.append("bf16-pure: parameters, gradients and torch optimizer state in bf16 (no fp32 master copy)")

    plan = MemoryPlan(
        model_size=size, optimizer=optimizer, precision=precision, zero_stage=zero_stage, world_size=world_size,
        micro_batch_size=micro_batch_size, block_size=block_size, vocab_size=vocab, n_positions=n_pos,
        num_params=n,
        param_bytes=_partition(p_bytes * n, world_size, zero_stage >= 3),
        grad_bytes=_partition(p_bytes * n, world_size, zero_stage >= 2),
        master_weight_bytes=master,
        optimizer_state_bytes=state,
        optimizer_state_bytes_total=state_total,
        activation_bytes=activation_bytes(size, micro_batch_size=micro_batch_size, block_size=block_size,
                                          vocab_size=vocab, precision=precision,
                                          attn_implementation=attn_implementation,
                                          gradient_checkpointing=gradient_checkpointing),
        total_bytes=0,
        notes=notes,
    )
    plan.total_bytes = (plan.param_bytes + plan.grad_bytes + plan.master_weight_bytes
                        + plan.optimizer_state_bytes + plan.activation_bytes)
    plan.fits = {gpu: fit(plan.total_bytes, cap) for gpu, cap in GPUS.items()}
    return plan


def _zero_state(layout: StateLayout, optimizer: str, shapes: Sequence[ParamShape], precision: str,
                zero_stage: int, world_size: int, notes: list[str]) -> tuple[int, int, int]:
    """(state per rank, state summed over ranks, fp32 master bytes per rank) under ZeRO: the layout's formula on
    the flat partitions this rank's optimizer holds (every rank holds the same sizes)."""
    check_zero_compatible(optimizer, zero_stage)
    if precision == "bf16-pure":
        raise OptBenchError("precision bf16-pure has no ZeRO equivalent (DeepSpeed keeps fp32 master partitions "
                            "and fp32 optimizer state): use --precision bf16 with --zero-stage, or zero stage 0.")
    flat = zero_partitions(shapes, world_size, zero_stage)
    state = layout.state_bytes(flat, MASTER_BYTES, False)
    notes.append(f"DeepSpeed ZeRO-{zero_stage}: the optimizer holds {len(flat)} flat fp32 partition(s) per rank "
                 f"({', '.join(f'{p.numel:,}' for p in flat)} elements) plus their fp32 master copy")
    if layout.per_tensor:
        notes.append(f"the {layout.name} state is computed on those 1-D partitions: per-tensor structure (factored "
                     "moments, fp32 embedding state) does not survive flattening")
    return state, state * world_size, MASTER_BYTES * sum(p.numel for p in flat)


def fit(total: int, capacity: int) -> str:
    """"yes" under FIT_MARGIN of the capacity, "tight" up to it, "no" beyond."""
    if total <= FIT_MARGIN * capacity:
        return "yes"
    return "tight" if total <= capacity else "no"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def format_plan(plan: MemoryPlan) -> str:
    """A plain-text table for the terminal."""
    rows = [
        ("parameters", plan.param_bytes),
        ("gradients", plan.grad_bytes),
        ("fp32 master weights", plan.master_weight_bytes),
        ("optimizer state", plan.optimizer_state_bytes),
        ("activations (estimate)", plan.activation_bytes),
        ("total per GPU", plan.total_bytes),
    ]
    head = (f"{plan.model_size} ({plan.num_params / 1e6:,.1f}M params, vocab {plan.vocab_size}) | "
            f"{plan.optimizer} | {plan.precision} | ZeRO-{plan.zero_stage} x {plan.world_size} GPU(s) | "
            f"micro-batch {plan.micro_batch_size} x {plan.block_size} tokens")
    width = max(len(r[0]) for r in rows)
    lines = [head, ""] + [f"  {name.ljust(width)}  {_gib(v):>14}" for name, v in rows]
    lines += ["", "  fits (<= 90 % of memory = yes; <= 100 % = tight):"]
    lines += [f"    {gpu:<10} {verdict}" for gpu, verdict in plan.fits.items()]
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)
