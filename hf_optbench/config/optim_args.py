"""``OptimizerArguments``: which optimizer and learning-rate schedule a run uses.

Standard library only at module level: ``config.py`` parses this with ``HfArgumentParser`` next to
``TrainingArguments`` (so no field name here may collide with one of its fields), and recipe validation and the
CLI's ``--help`` must stay fast. Learning rate, weight decay, warmup and gradient clipping are TrainingArguments'
own ``learning_rate``, ``weight_decay``, ``warmup_steps`` and ``max_grad_norm``; the optimizer registry
(``optimizers.optimizer_defaults``) supplies the cited per-size default for those the user did not set.

Dict-valued options are JSON strings (the recipe loader turns a YAML mapping into one); read them parsed with
:meth:`OptimizerArguments.kwargs` and :meth:`OptimizerArguments.schedule_kwargs_dict`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.yaml_file import loads_json_bounded


def parse_json_mapping(key: str, text: str | dict | None) -> dict[str, Any]:
    """``text`` (JSON object, a dict, or empty) as a dict; OptBenchError naming ``key`` otherwise."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if isinstance(text, dict):
        return dict(text)
    try:
        value = loads_json_bounded(text)
    except json.JSONDecodeError as exc:
        raise OptBenchError(
            f"{key} is not valid JSON: {_abbrev(text)} ({exc.msg}). Write a mapping, e.g. {key}: "
            f"{{\"betas\": [0.9, 0.95]}} in the recipe or --{key} '{{\"betas\": [0.9, 0.95]}}' on the command line."
        ) from exc
    except ValueError as exc:  # nested too deep (loads_json_bounded)
        raise OptBenchError(f"{key} holds {exc}.") from None
    if not isinstance(value, dict):
        raise OptBenchError(f"{key} must be a JSON object (mapping), got {type(value).__name__}: {_abbrev(text)}.")
    return value


def _abbrev(text: str, keep: int = 40) -> str:
    """``text`` quoted, cut to its first and last ``keep`` characters: an error line stays one readable line."""
    return repr(text) if len(text) <= 2 * keep + 3 else f"{text[:keep]!r}...{text[-keep:]!r} ({len(text):,} characters)"


@dataclass
class OptimizerArguments:
    """Optimizer and schedule choice. Defaults: AdamW with GPT-3's cosine schedule to 10% (Brown et al. 2020, App. B)."""

    optimizer: str = field(
        default="adamw",
        metadata={"help": "Registry name (`hf-optbench optimizers` lists them: adamw, lion, adamw_8bit, adafactor, "
                          "schedule_free_adamw, muon, sophia, soap, ...) or a dotted path to an optimizer class "
                          "(torch.optim.RAdam, pytorch_optimizer.AdaBelief). A dotted path runs that module's code: "
                          "it is imported from installed packages and PYTHONPATH only, never from the working "
                          "directory (your own module: PYTHONPATH=. or pip install it)."},
    )
    optimizer_kwargs: str = field(
        default="{}",
        metadata={"help": "Extra constructor arguments as a JSON object, e.g. '{\"betas\": [0.9, 0.95]}'. An argument "
                          "the optimizer does not take is an error, never dropped."},
    )
    schedule: str = field(
        default="gpt3_cosine",
        metadata={"help": "LR schedule: gpt3_cosine (linear warmup, cosine to min_lr_ratio), wsd "
                          "(warmup-stable-decay), one_cycle, constant_with_warmup, constant, none. Schedule-free "
                          "optimizers run with none (their warmup is done by the optimizer)."},
    )
    schedule_kwargs: str = field(
        default="{}",
        metadata={"help": "Extra schedule arguments as a JSON object, e.g. '{\"decay_ratio\": 0.2}' for wsd."},
    )
    # GPT-3 (Brown et al. 2020, Appendix B): "cosine decay for learning rate down to 10% of its value".
    min_lr_ratio: float = field(
        default=0.1,
        metadata={"help": "Final LR as a fraction of the peak for gpt3_cosine and wsd (GPT-3: 0.1)."},
    )
    # Dettmers et al. 2022 (8-bit Optimizers via Block-wise Quantization, ICLR) keep embedding state in 32 bits for
    # stability; GPT-2's tied embedding is its largest matrix, so this choice decides most of the 8-bit saving and
    # is reported in summary.json.
    embedding_state_32bit: bool = field(
        default=True,
        metadata={"help": "8-bit optimizers (bitsandbytes): keep the optimizer state of embedding weights in 32 "
                          "bits (stabler pretraining, smaller saving). Reported in summary.json."},
    )
    tuned_hparams_file: str | None = field(
        default=None,
        metadata={"help": "YAML/JSON {optimizer: {model_size: {learning_rate: ..}}} written by `hf-optbench tune`; "
                          "its values replace the registry defaults (a value you set yourself still wins)."},
    )

    def __post_init__(self) -> None:
        from hf_optbench.optim.registry import OPTIMIZERS, check_optimizer_kwargs, resolve_optimizer_name
        from hf_optbench.optim.schedules import check_schedule_kwargs

        self.optimizer = resolve_optimizer_name(self.optimizer)
        self._kwargs = parse_json_mapping("optimizer_kwargs", self.optimizer_kwargs)
        self._schedule_kwargs = parse_json_mapping("schedule_kwargs", self.schedule_kwargs)
        # normalise so the resolved config.yaml holds canonical JSON
        self.optimizer_kwargs = json.dumps(self._kwargs, sort_keys=True)
        self.schedule_kwargs = json.dumps(self._schedule_kwargs, sort_keys=True)
        check_optimizer_kwargs(OPTIMIZERS.get(self.optimizer), self._kwargs)  # None (a dotted path): at build
        check_schedule_kwargs(self.schedule, self._schedule_kwargs)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise OptBenchError(
                f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}. GPT-3 uses 0.1 (cosine to 10% of the peak)."
            )
        if self.tuned_hparams_file and not os.path.isfile(self.tuned_hparams_file):
            there = "is not a regular file" if os.path.exists(self.tuned_hparams_file) else "does not exist"
            raise OptBenchError(
                f"tuned_hparams_file '{self.tuned_hparams_file}' {there}. Write it with `hf-optbench tune` or "
                "drop the key to use the registry's cited defaults."
            )

    def kwargs(self) -> dict[str, Any]:
        """The parsed ``optimizer_kwargs``."""
        return dict(self._kwargs)

    def schedule_kwargs_dict(self) -> dict[str, Any]:
        """The parsed ``schedule_kwargs``."""
        return dict(self._schedule_kwargs)
