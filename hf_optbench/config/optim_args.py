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


def parse_json_mapping(key: str, text: str | dict | None) -> dict[str, Any]:
    """``text`` (JSON object, a dict, or empty) as a dict; OptBenchError naming ``key`` otherwise."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptBenchError(
            f"{key} is not valid JSON: {text!r} ({exc.msg}). Write a mapping, e.g. {key}: {{\"betas\": [0.9, 0.95]}} "
            "in the recipe or --" + key + " '{\"betas\": [0.9, 0.95]}' on the command line."
        ) from exc
    if not isinstance(value, dict):
        raise OptBenchError(f"{key} must be a JSON object (mapping), got {type(value).__name__}: {text!r}.")
    return value


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
        from hf_optbench.optim.registry import check_optimizer_kwargs, resolve_optimizer_name
        from hf_optbench.optim.schedules import check_schedule_kwargs

        self.optimizer = resolve_optimizer_name(self.optimizer)
        self._kwargs = parse_json_mapping("optimizer_kwargs", self.optimizer_kwargs)
        self._schedule_kwargs = parse_json_mapping("schedule_kwargs", self.schedule_kwargs)
        # normalise so the resolved config.yaml holds canonical JSON
        self.optimizer_kwargs = json.dumps(self._kwargs, sort_keys=True)
        self.schedule_kwargs = json.dumps(self._schedule_kwargs, sort_keys=True)
        check_optimizer_kwargs(self.optimizer, self._kwargs)
        check_schedule_kwargs(self.schedule, self._schedule_kwargs)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise OptBenchError(
                f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}. GPT-3 uses 0.1 (cosine to 10% of the peak)."
            )
        if self.tuned_hparams_file and not os.path.isfile(self.tuned_hparams_file):
            raise OptBenchError(
                f"tuned_hparams_file '{self.tuned_hparams_file}' does not exist. Write it with `hf-optbench tune` or "
                "drop the key to use the registry's cited defaults."
            )

    def kwargs(self) -> dict[str, Any]:
        """The parsed ``optimizer_kwargs``."""
        return dict(self._kwargs)

    def add_kwargs(self, values: dict[str, Any]) -> None:
        """Add constructor arguments the tuned file gives (``config.hparams``: a group's tuned learning-rate ratio),
        checked like the user's, kept in ``optimizer_kwargs`` so that config.yaml reruns to the same optimizer."""
        from hf_optbench.optim.registry import check_optimizer_kwargs

        check_optimizer_kwargs(self.optimizer, values)
        self._kwargs.update(values)
        self.optimizer_kwargs = json.dumps(self._kwargs, sort_keys=True)

    def schedule_kwargs_dict(self) -> dict[str, Any]:
        """The parsed ``schedule_kwargs``."""
        return dict(self._schedule_kwargs)
