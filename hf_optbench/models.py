"""GPT-2 models built from scratch: the size table, embedding resize to the tokenizer, attention choice.

Why from a config and not ``from_pretrained``: the benchmark pretrains, so every optimizer must start from the
same random init (seeded by the Trainer) on the same shapes. An optional ``init_from`` starts from a checkpoint
instead, for quick sanity runs: a 124M GPT-2 started from pretrained weights reached validation loss 3.6 after 500
steps on OpenWebText, where the same model from scratch was at 5.7.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError, suggest

if TYPE_CHECKING:  # torch/transformers imported lazily: this module is imported by config validation
    import torch
    from transformers import GPT2LMHeadModel

# The one place a model size is defined: name -> (n_layer, n_head, n_embd, size class). Published GPT-2 shapes
# (Radford et al. 2019, Table 2; the HF `gpt2*` configs), plus four CPU shapes (head width 32)
# so the CPU sweep spans a 100x range of parameter counts in minutes on 2 cores. The size class picks the cited
# optimizer defaults (optim/registry.py SIZE_CLASSES): "cpu" for nanoGPT's baby-GPT settings, else the GPT-3 row
# (Brown et al. 2020, Table 2.1) nearest in parameter count.
_SIZE_ROWS: dict[str, tuple[int, int, int, str]] = {
    "nano": (2, 1, 32, "cpu"),  # 25k non-embedding parameters: the main job's smallest (fixed data per parameter)
    "tiny": (2, 2, 64, "cpu"),
    "mini": (4, 4, 128, "cpu"),
    "midi": (6, 6, 192, "cpu"),
    "gpt2": (12, 12, 768, "125M"),  # 124M
    "gpt2-medium": (24, 16, 1024, "350M"),  # 355M
    "gpt2-large": (36, 20, 1280, "760M"),  # 774M
    "gpt2-xl": (48, 25, 1600, "1.3B"),  # 1.5B: GPT-3's largest row below it
}
# GPT2Config arguments per size (public: hf_optbench.GPT2_SIZES).
GPT2_SIZES: dict[str, dict[str, int]] = {
    name: {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
    for name, (n_layer, n_head, n_embd, _) in _SIZE_ROWS.items()
}
# Size -> size class of the cited optimizer defaults.
SIZE_CLASS: dict[str, str] = {name: row[3] for name, row in _SIZE_ROWS.items()}
SIZE_ALIASES = {"gpt2-base": "gpt2", "gpt2-small": "gpt2", "124m": "gpt2", "355m": "gpt2-medium",
                "774m": "gpt2-large", "1.5b": "gpt2-xl"}
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def size_names() -> str:
    """Every size of the table in its order, for the help texts that list sizes (``run --help``, ``memory``,
    ``optimizers``): a row added to ``_SIZE_ROWS`` shows up in each of them."""
    cpu = [name for name, cls in SIZE_CLASS.items() if cls == "cpu"]
    gpu = [name for name, cls in SIZE_CLASS.items() if cls != "cpu"]
    return ", ".join(cpu) + " (CPU shapes), " + ", ".join(gpu)


def resolve_size(name: str) -> str:
    """Canonical size name for ``name`` (aliases allowed); OptBenchError listing the sizes otherwise."""
    key = str(name).strip().lower()
    key = SIZE_ALIASES.get(key, key)
    if key not in GPT2_SIZES:
        known = sorted(GPT2_SIZES) + sorted(SIZE_ALIASES)
        raise OptBenchError(f"unknown model_size '{name}'.{suggest(key, known, cutoff=0.6)} Choose one of: "
                            f"{', '.join(known)}.")
    return key


def check_block_size(block_size: int, n_positions: int) -> None:
    """A training block must fit the model's position table (the one rule: the CLI's checks and
    ``data.pipeline.prepare_data`` both call it)."""
    if block_size > n_positions:
        raise OptBenchError(
            f"block_size {block_size} is larger than the model's n_positions {n_positions}: lower block_size to "
            f"<= {n_positions}, or raise n_positions."
        )


def tokens_per_step(args: Any, block_size: int, world_size: int | None = None) -> int:
    """Tokens one optimizer step trains on over all processes: micro-batch x accumulation x processes x block size
    (``args``: TrainingArguments or anything with ``per_device_train_batch_size`` and
    ``gradient_accumulation_steps``; ``world_size`` defaults to ``args.world_size``). The one owner of the product:
    the run's plan, the sweep's budget, the recorder's MFU and Sophia-G's Hessian estimate use it."""
    processes = args.world_size if world_size is None else world_size
    return int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps) * int(processes) \
        * int(block_size)


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to ``multiple`` (nanoGPT pads GPT-2's 50257 to 50304 for faster matmuls)."""
    if multiple <= 1:
        return vocab_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def build_config(
    size: str,
    vocab_size: int,
    *,
    n_positions: int = 1024,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    attn_implementation: str = "sdpa",
    dropout: float = 0.0,
    activation_function: str = "gelu_pytorch_tanh",
) -> Any:
    """The GPT2Config for a size. Dropout 0 by default: pretraining runs see each token about once
    (nanoGPT's train_gpt2 and the Chinchilla-style runs use no dropout).

    ``activation_function`` "gelu_pytorch_tanh" by default: the same function as GPT-2's own ``gelu_new`` (the tanh
    approximation of GELU, Hendrycks & Gimpel 2016, eq. in Sec. 2; GPT-2's config names it gelu_new), computed by
    torch's fused ``gelu(approximate="tanh")`` kernel instead of a chain of eight element-wise ops (gelu_new was
    28 % of ``midi``'s op time on a 2-core CPU): 0.86x / 0.87x / 0.90x the step time at tiny / mini / midi, one
    thread, at the demo's shape (benchmarks/bench_cpu_mfu.py, benchmarks/RESULTS.md), losses equal to <= 5e-7. It
    is recorded in the model's config.json, so a checkpoint loads with the function it was trained with."""
    from transformers import GPT2Config
    from transformers.activations import ACT2FN

    if activation_function not in ACT2FN:
        hint = suggest(activation_function, sorted(ACT2FN))
        raise OptBenchError(f"unknown activation_function '{activation_function}'.{hint} Use gelu_pytorch_tanh (the "
                            "default) or gelu_new (GPT-2's own).")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise OptBenchError(
            f"unknown attn_implementation '{attn_implementation}'. Choose one of: {', '.join(ATTN_IMPLEMENTATIONS)}."
        )
    shape = GPT2_SIZES[resolve_size(size)]
    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        use_cache=False,
        tie_word_embeddings=True,
        # GPT2Config defaults bos/eos to 50256 (the English GPT-2 vocab): take them from the tokenizer instead.
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        activation_function=activation_function,
        **shape,
    )
    # transformers 5: the attention implementation lives on the config (GPT2LMHeadModel(cfg, attn_implementation=)
    # is a TypeError).
    cfg._attn_implementation = attn_implementation
    return cfg


def build_model(
    size: str,
    vocab_size: int,
    *,
    n_positions: int = 1024,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    attn_implementation: str = "sdpa",
    pad_vocab_to_multiple_of: int = 64,
    init_from: str | None = None,
    dropout: float = 0.0,
) -> GPT2LMHeadModel:
    """A GPT2LMHeadModel of ``size`` whose (tied) token embedding covers ``vocab_size`` tokens.

    The embedding is resized with ``resize_token_embeddings(vocab_size, pad_to_multiple_of=...)`` to align it with
    the tokenizer (flax-community/gpt2-base-thai's 50,266 tokens -> 50,304 rows).
    With ``init_from`` (a Hub id or local directory) the weights come from that checkpoint instead.
    """
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel

    if vocab_size <= 0:
        raise OptBenchError(f"vocab_size must be positive, got {vocab_size}.")
    if init_from:
        import pickle

        try:
            model = AutoModelForCausalLM.from_pretrained(init_from, attn_implementation=attn_implementation,
                                                         trust_remote_code=False)
        except OSError as exc:
            raise OptBenchError(
                f"cannot load init_from='{init_from}': {exc}. Pass a local directory holding config.json and "
                "model.safetensors, or leave init_from empty to train from scratch."
            ) from exc
        except pickle.UnpicklingError as exc:  # a local directory's is refused before any work (config.checks)
            first = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), "weights_only")
            raise OptBenchError(
                f"cannot load init_from='{init_from}': its weights are a pickle that torch's safe loader refuses "
                f"({first.rstrip('.')}): loading it could run code, so it is never loaded. Start from a checkpoint "
                "saved as model.safetensors."
            ) from None
        except ValueError as exc:  # a Hub model asking for its own code: trust_remote_code stays off
            if "trust_remote_code" not in str(exc):
                raise
            raise OptBenchError(
                f"cannot load init_from='{init_from}': it asks for custom modelling code (auto_map in its "
                "config.json), which hf_optbench never runs. Start from a checkpoint of a stock model class."
            ) from None
        model.config.use_cache = False
    else:
        # Build at the tokenizer's exact length, then resize: the same code path as aligning a pretrained English
        # GPT-2 with the Thai tokenizer, and it leaves the padding rows' init identical to transformers' own resize.
        cfg = build_config(
            size,
            vocab_size,
            n_positions=n_positions,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            attn_implementation=attn_implementation,
            dropout=dropout,
        )
        model = GPT2LMHeadModel(cfg)
    # transformers 5.23 leaves GPT-2's loss_type unset, and the Trainer then counts the label tokens for its
    # loss normalisation without the causal shift: every reported loss (and gradient) comes out (T-1)/T of the true
    # mean (6% low at T=16, 0.8% at T=128). Naming the causal-LM loss makes the count match the model's own loss.
    model.loss_type = "ForCausalLM"
    if pad_vocab_to_multiple_of > 1 or model.get_input_embeddings().num_embeddings != vocab_size:
        # mean_resizing=False: the rows of a from-scratch model are random, so their mean and covariance carry no
        # information; the new rows get the model's own init (std 0.02) like every other row.
        model.resize_token_embeddings(vocab_size, pad_to_multiple_of=max(pad_vocab_to_multiple_of, 1),
                                      mean_resizing=False)
    return model


def count_parameters(model: torch.nn.Module, exclude_embeddings: bool = False) -> int:
    """Unique parameters (tied weights counted once); optionally without token and position embeddings,
    as in Kaplan et al. 2020's non-embedding N."""
    import torch

    seen: set[int] = set()
    total = 0
    skip: set[int] = set()
    if exclude_embeddings:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                skip.add(id(module.weight))
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def non_embedding_params(size: str) -> int:
    """Non-embedding parameters of a size (Kaplan et al. 2020's N: everything but the token and position
    embeddings), from its shape alone, so a sweep can size its data budget before building any model. Per block:
    attention (d x 3d + 3d, d x d + d), MLP (d x 4d + 4d, 4d x d + d), two LayerNorms (2d each): 12d^2 + 13d; plus
    the final LayerNorm (2d). tests/test_models.py checks it against :func:`count_parameters` on built models."""
    shape = GPT2_SIZES[resolve_size(size)]
    d = shape["n_embd"]
    return shape["n_layer"] * (12 * d * d + 13 * d) + 2 * d
