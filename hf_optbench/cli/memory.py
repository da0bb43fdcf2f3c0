"""``hf-optbench memory``: the analytic memory plan of one configuration (hf_optbench.measure.planner)."""

from __future__ import annotations

import json

from hf_optbench.cli import ArgumentParser
from hf_optbench.measure.planner import DEFAULT_VOCAB, PRECISIONS, format_plan, plan_memory
from hf_optbench.models import size_names

DESCRIPTION = ("The analytic memory plan of one configuration per GPU: parameters, gradients, optimizer state by "
               "the optimizer's own state layout, activations, ZeRO partitions; and which GPUs it fits. No model is "
               "built.")


def main(argv: list[str] | None = None) -> int:
    """``hf-optbench memory``: print the plan (or ``--json``)."""
    parser = ArgumentParser(prog="hf-optbench memory", description=DESCRIPTION, aliases={"--model": "--model_size"})
    parser.add_argument("--model_size", default="gpt2", help=f"GPT-2 size: {size_names()}")
    parser.add_argument("--optimizer", default="adamw", help="registry name, e.g. adamw, lion, adamw_8bit")
    parser.add_argument("--precision", default="bf16", choices=PRECISIONS,
                        help="parameter and activation precision (default: bf16)")
    parser.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2, 3),
                        help="DeepSpeed ZeRO stage: 1 partitions the optimizer state over the GPUs, 2 also the "
                             "gradients, 3 also the parameters (default: 0, none)")
    parser.add_argument("--world_size", type=int, default=1,
                        help="GPUs the ZeRO partitions are spread over (default: 1)")
    parser.add_argument("--micro_batch_size", type=int, default=8,
                        help="sequences per GPU per forward pass: the activations (default: 8)")
    parser.add_argument("--block_size", type=int, default=1024, help="tokens per sequence (default: 1024)")
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB,
                        help="tokenizer length; padded to a multiple of 64 like build_model")
    parser.add_argument("--n_positions", type=int, default=None, help="default: --block_size")
    parser.add_argument("--attn_implementation", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"),
                        help="attention kernel: eager keeps the attention matrix, the others do not (default: sdpa)")
    parser.add_argument("--gradient_checkpointing", action="store_true",
                        help="keep one activation per block and recompute the rest in the backward pass")
    parser.add_argument("--embedding_state_8bit", action="store_true",
                        help="8-bit optimizers: quantise the embeddings' state too (default keeps it fp32)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    plan = plan_memory(args.model_size, args.optimizer, precision=args.precision, zero_stage=args.zero_stage,
                       world_size=args.world_size, micro_batch_size=args.micro_batch_size,
                       block_size=args.block_size, vocab_size=args.vocab_size, n_positions=args.n_positions,
                       attn_implementation=args.attn_implementation,
                       gradient_checkpointing=args.gradient_checkpointing,
                       embedding_state_32bit=not args.embedding_state_8bit)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0
