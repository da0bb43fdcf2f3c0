"""Analytic memory planner: GPT-2 size x optimizer x precision x ZeRO stage x world size -> bytes per GPU.

    hf-optbench memory --model gpt2-xl --optimizer lion --precision bf16 --zero-stage 2 --world-size 4 \\
        --micro-batch-size 8 --block-size 1024 [--json]

Why by hand: accelerate's ``estimate-memory`` counts parameters and an Adam-shaped state only; it knows neither
Lion/Adafactor/8-bit/schedule-free state layouts nor ZeRO partitioning nor activations. The optimizer-state
figure here is *exact* for the implementations hf_optbench builds (tests compare it with the measured storage
bytes on the CPU sizes), because it is computed per parameter tensor from the same shapes the model has:

* AdamW (torch, fused/foreach): ``exp_avg`` + ``exp_avg_sq`` like the parameter, plus a 4-byte fp32 ``step``
  tensor per parameter (torch.optim.AdamW source).
* Lion (lion-pytorch): one ``exp_avg`` (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms").
* SGD with momentum: one ``momentum_buffer``.
* Adafactor (torch.optim.Adafactor / transformers Adafactor, no first moment): a row and a column vector for
  tensors of >= 2 dims, a full second moment for 1-D ones, plus one 4-byte scalar (step or RMS) per tensor
  (Shazeer & Stern 2018).
* Schedule-free AdamW (facebookresearch/schedule_free ``AdamWScheduleFree``): ``z`` + ``exp_avg_sq``; the step
  count lives in the param group (Defazio et al. 2024).
* bitsandbytes 8-bit (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"): per state one
  byte per element plus one fp32 absmax per 256-element block; tensors under 4,096 elements
  (``min_8bit_size``) and, when ``embedding_state_32bit``, the embeddings keep fp32 state; the two 256-entry
  fp32 quantisation maps are shared by all tensors (counted once).
* Muon (torch.optim.Muon; Jordan et al. 2024): ``momentum_buffer`` for the 2-D hidden matrices, AdamW state for
  the embeddings, biases and LayerNorms.
* Sophia-G (hf_optbench.sophia; Liu et al. 2023): ``momentum`` + ``hessian_moment``.
* SOAP (pytorch_optimizer.SOAP defaults; Vyas et al. 2024): Adam's two moments plus, per dimension d <= 10,000 of
  each >= 2-D tensor, a d x d statistic ``GG`` and its eigenbasis ``Q`` (1-D tensors are not preconditioned).

Precision: Trainer/Accelerate mixed precision (``bf16``/``fp16``) autocasts the compute and keeps fp32
parameters, gradients and optimizer state; ``bf16-pure`` stores the model in bf16 (torch optimizers then keep
bf16 state). DeepSpeed ZeRO with bf16/fp16 keeps 16-bit parameters and gradients plus an fp32 master copy
that is partitioned with the optimizer state (Rajbhandari et al. 2020, "ZeRO", sec. 3: 2 + 2 + K bytes per
parameter). Stage 1 partitions optimizer state (+ master), stage 2 also gradients, stage 3 also parameters,
each over the world size. ZeRO partitions flat buffers, so for per-tensor layouts (8-bit, Adafactor) the
partitioned figure is the total divided by the world size (an approximation, noted in the plan).

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

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import OptBenchError

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
BNB_BLOCK_SIZE = 256  # bitsandbytes blockwise quantisation block (bnb.functional, optimizer_update_8bit_blockwise)
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit(min_8bit_size=4096): smaller tensors keep fp32 state
# bitsandbytes keeps two 256-entry fp32 quantisation maps ("dynamic", "udynamic") per optimizer, shared by all
# tensors, whether the update uses one (Lion) or both (Adam).
BNB_QMAP_BYTES = 2 * 256 * 4
DEFAULT_VOCAB = 50_304  # GPT-2's 50,257 and the Thai tokenizer's 50,266 both pad to 50,304 (multiple of 64)

# state kind -> (registry names it covers)
STATE_KINDS: dict[str, tuple[str, ...]] = {
    "adamw": ("adamw", "adamw_torch", "adamw_fused", "adam", "adamw_foreach"),
    "lion": ("lion", "lion_foreach", "lion_pytorch"),
    "sgd_momentum": ("sgd", "sgd_momentum"),
    "adafactor": ("adafactor",),
    "schedule_free_adamw": ("schedule_free_adamw", "adamw_schedulefree", "sf_adamw"),
    "adamw_8bit": ("adamw_8bit", "adamw8bit", "adamw_bnb_8bit", "paged_adamw_8bit"),
    "lion_8bit": ("lion_8bit", "lion8bit", "paged_lion_8bit"),
    "muon": ("muon",),
    "sophia": ("sophia", "sophiag", "sophia_g"),
    "soap": ("soap",),
}
SOAP_MAX_PRECONDITION_DIM = 10_000  # pytorch_optimizer.SOAP default: larger dims get no preconditioner
_NAME_TO_KIND = {name: kind for kind, names in STATE_KINDS.items() for name in names}


@dataclass(frozen=True)
class ParamShape:
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
    from .models import GPT2_SIZES, resolve_size

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


def state_kind(optimizer: str) -> str:
    """The state layout of a registry name; OptBenchError naming the modelled ones otherwise."""
    key = str(optimizer).strip().lower().replace("-", "_")
    if key not in _NAME_TO_KIND:
        raise OptBenchError(
            f"the memory planner has no state formula for optimizer '{optimizer}'. It models: "
            f"{', '.join(sorted(_NAME_TO_KIND))}. Measure it with a short run instead (summary.json: "
            "optimizer_state_bytes)."
        )
    return _NAME_TO_KIND[key]


def _bnb_state(p: ParamShape, n_states: int, embedding_state_32bit: bool) -> tuple[int, bool]:
    """(bytes without the shared qmaps, whether this tensor is quantised)."""
    n = p.numel
    if n < BNB_MIN_8BIT_SIZE or (embedding_state_32bit and p.is_embedding):
        return n_states * 4 * n, False
    return n_states * (n + 4 * math.ceil(n / BNB_BLOCK_SIZE)), True


def planned_optimizer_state_bytes(optimizer: str, shapes: Sequence[ParamShape], *, state_bytes: int = 4,
                          embedding_state_32bit: bool = True) -> int:
    """Bytes of optimizer state for these tensors (unpartitioned). ``state_bytes``: element size of the
    torch optimizers' state (that of the parameters: 4 for fp32, 2 for bf16-pure)."""
    kind = state_kind(optimizer)
    s = state_bytes
    total = 0
    if kind in ("adamw_8bit", "lion_8bit"):
        n_states = 2 if kind == "adamw_8bit" else 1
        any_8bit = False
        for p in shapes:
            b, quantised = _bnb_state(p, n_states, embedding_state_32bit)
            total += b
            any_8bit |= quantised
        return total + (BNB_QMAP_BYTES if any_8bit else 0)
    for p in shapes:
        n = p.numel
        if kind == "adamw":
            total += 2 * s * n + 4
        elif kind in ("lion", "sgd_momentum"):
            total += s * n
        elif kind in ("schedule_free_adamw", "sophia"):
            total += 2 * s * n
        elif kind == "soap":
            dims = p.shape if len(p.shape) >= 2 else ()
            total += 2 * s * n + 2 * s * sum(d * d for d in dims if d <= SOAP_MAX_PRECONDITION_DIM)
        elif kind == "adafactor":
            if len(p.shape) >= 2:
                rows = math.prod(p.shape[:-1])
                cols = math.prod(p.shape[:-2]) * p.shape[-1]
                total += s * (rows + cols) + 4
            else:
                total += s * n + 4
        elif kind == "muon":
            total += s * n if p.is_hidden_matrix else 2 * s * n + 4
    return total


def activation_bytes(size: str, *, micro_batch_size: int, block_size: int, vocab_size: int = DEFAULT_VOCAB,
                     precision: str = "bf16", attn_implementation: str = "sdpa",
                     gradient_checkpointing: bool = False) -> int:
    """Estimated activation memory of one micro-batch (see the module docstring for the formula)."""
    from .models import GPT2_SIZES, resolve_size

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
    """Bytes per GPU (``*_total`` before ZeRO partitioning)."""

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
    """Per-GPU memory of one training configuration. ``n_positions`` defaults to ``block_size`` (as run.py);
    ``vocab_size`` is rounded up to ``pad_vocab_to_multiple_of`` like models.build_model."""
    from .models import padded_vocab_size, resolve_size

    size = resolve_size(model_size)
    kind = state_kind(optimizer)
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

    zero16 = zero_stage > 0 and precision in ("bf16", "fp16")
    if precision == "bf16-pure" or zero16:
        p_bytes, master = 2, (4 if zero16 else 0)
    else:
        p_bytes, master = 4, 0
    state_elt = 2 if precision == "bf16-pure" else 4
    state_total = planned_optimizer_state_bytes(kind, shapes, state_bytes=state_elt,
                                        embedding_state_32bit=embedding_state_32bit)
    if zero16:
        notes.append("DeepSpeed ZeRO with 16-bit weights: fp32 master copy partitioned with the optimizer state")
    if zero_stage > 0 and kind in ("adamw_8bit", "lion_8bit", "adafactor", "muon"):
        notes.append(f"ZeRO partitions flat buffers: the per-tensor {kind} layout is approximated as total/world")
    if precision == "bf16-pure":
        notes.append("bf16-pure: parameters, gradients and torch optimizer state in bf16 (no fp32 master copy)")

    plan = MemoryPlan(
        model_size=size, optimizer=optimizer, precision=precision, zero_stage=zero_stage, world_size=world_size,
        micro_batch_size=micro_batch_size, block_size=block_size, vocab_size=vocab, n_positions=n_pos,
        num_params=n,
        param_bytes=_partition(p_bytes * n, world_size, zero_stage >= 3),
        grad_bytes=_partition(p_bytes * n, world_size, zero_stage >= 2),
        master_weight_bytes=_partition(master * n, world_size, zero_stage >= 1),
        optimizer_state_bytes=_partition(state_total, world_size, zero_stage >= 1),
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


def cli_main(argv: list[str] | None = None) -> int:
    """``hf-optbench memory``: print the plan (or ``--json``)."""
    parser = argparse.ArgumentParser(prog="hf-optbench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2", help="GPT-2 size (tiny ... gpt2-xl)")
    parser.add_argument("--optimizer", default="adamw", help="registry name, e.g. adamw, lion, adamw_8bit")
    parser.add_argument("--precision", default="bf16", choices=PRECISIONS)
    parser.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2, 3))
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB,
                        help="tokenizer length; padded to a multiple of 64 like build_model")
    parser.add_argument("--n-positions", type=int, default=None, help="default: --block-size")
    parser.add_argument("--attn-implementation", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--embedding-state-8bit", action="store_true",
                        help="8-bit optimizers: quantise the embeddings' state too (default keeps it fp32)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    plan = plan_memory(args.model, args.optimizer, precision=args.precision, zero_stage=args.zero_stage,
                       world_size=args.world_size, micro_batch_size=args.micro_batch_size,
                       block_size=args.block_size, vocab_size=args.vocab_size, n_positions=args.n_positions,
                       attn_implementation=args.attn_implementation,
                       gradient_checkpointing=args.gradient_checkpointing,
                       embedding_state_32bit=not args.embedding_state_8bit)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
