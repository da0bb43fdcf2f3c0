"""A run's identity: the resolved settings that decide its result, recorded when it starts and checked on resume.

Why: a resume restores the checkpoint's weights, optimizer and scheduler state and continues them. A resume given
another learning rate, optimizer, seed or model would train on the old state (or fail after the data and model
work) while config.yaml and summary.json were relabelled with the new values, so the result would no longer be
what its label says. The identity is written to ``output_dir/run_identity.json`` at the start of a run; a resume
whose identity differs is refused before any data or model work, naming each key that changed.

What is left out does not change what is trained: where the run writes (output_dir), how often it logs, evaluates
or saves, where it reports, hub settings, the resume flag itself, data-loading workers and caches, and the
measurement settings of the callbacks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_optbench.config.checks import zero_stage
from hf_optbench.config.parse import RunConfig
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import constructor_kwargs
from hf_optbench.rundir import IDENTITY_FILE, write_json_atomic

# The TrainingArguments fields that change what is trained (an allow-list: TrainingArguments holds ~120 fields,
# most of them about logging, saving and publishing). Not adam_beta1/adam_beta2/adam_epsilon: where they apply (the
# AdamW family) config.checks folds the ones set into optimizer_kwargs, elsewhere they are refused, so the
# optimizer's constructor values (below) hold what they did.
TRAINING_KEYS = (
    "learning_rate", "weight_decay", "max_grad_norm", "max_steps",
    "warmup_steps", "seed", "data_seed", "full_determinism", "per_device_train_batch_size",
    "gradient_accumulation_steps", "average_tokens_across_devices", "label_smoothing_factor", "neftune_noise_alpha",
    "bf16", "fp16", "tf32", "gradient_checkpointing", "torch_compile", "dataloader_drop_last",
    "train_sampling_strategy", "fsdp",
)
# Fields of hf_optbench's own argument dataclasses that do not change what is trained (every other one does, so a
# new field is part of the identity unless it is listed here).
OWN_KEYS_IGNORED = frozenset({
    "overwrite_output_dir", "require_clean_git", "write_model_card", "save_final_model",  # RunArguments
    "preprocessing_num_workers", "data_cache_dir", "overwrite_data_cache",  # DataArguments: how, not what
    "tuned_hparams_file",  # a path; the values it gave are resolved into learning_rate / weight_decay
    "target_losses", "eval_target_losses", "target_smoothing_steps", "spike_window", "spike_threshold",
    "spike_min_history", "timing_warmup_steps", "measure_memory", "device_peak_tflops",
    "metrics_flush_every",  # BenchArguments: what is measured about the run, not the run
})
_SCHEMA = 1


def run_identity(cfg: RunConfig) -> dict[str, Any]:
    """{key: value} of every resolved setting that changes the result (call after ``resolve_hyperparameters``,
    which fills learning_rate / weight_decay / max_grad_norm). Values are JSON-normalised so that a stored
    identity compares equal to a fresh one."""
    import dataclasses

    ident: dict[str, Any] = {}
    for part in (cfg.model, cfg.run, cfg.data, cfg.optim, cfg.bench):
        for f in dataclasses.fields(part):
            if f.name not in OWN_KEYS_IGNORED:
                ident[f.name] = getattr(part, f.name)
    # what the optimizer is built with (cited values + optimizer_kwargs), not how it was asked for: a run's own
    # config.yaml sets the cited betas explicitly, and must resume it
    del ident["optimizer_kwargs"]
    ident["optimizer_constructor"] = constructor_kwargs(cfg.optim.optimizer, cfg.model.model_size, cfg.optim.kwargs())
    ident["n_positions"] = cfg.model.n_positions or cfg.data.block_size
    args = cfg.training
    for key in TRAINING_KEYS:
        ident[key] = getattr(args, key, None)
    ident["world_size"] = args.world_size
    ident["zero_stage"] = zero_stage(args)
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def record_identity(cfg: RunConfig, out: Path) -> None:
    """Write ``out/run_identity.json`` (main process): the identity this run's checkpoints will be trained with."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / IDENTITY_FILE, {"schema": _SCHEMA, "identity": run_identity(cfg)})


def read_identity(out: Path) -> dict[str, Any] | None:
    """The identity recorded in ``out``, or None (a run directory from before identities, or an unreadable file)."""
    try:
        data = json.loads((out / IDENTITY_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    ident = data.get("identity") if isinstance(data, dict) else None
    return ident if isinstance(ident, dict) else None


def identity_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new)} for the keys both identities hold with different values (a key only one of them knows,
    from another version of hf_optbench, is not a change)."""
    return {k: (old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}


def check_resume_identity(cfg: RunConfig, out: Path) -> None:
    """Refuse to resume ``out`` with settings that differ from those its checkpoints were trained with. A run
    directory without a recorded identity (written before identities existed) resumes as before."""
    old = read_identity(out)
    if old is None:
        return
    changes = identity_changes(old, run_identity(cfg))
    if changes:
        listed = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())
        raise OptBenchError(
            f"cannot resume '{out}' with a changed configuration: {listed}. Its checkpoints were trained with the "
            "old values, so the resumed run would continue the old training under the new labels. Resume with the "
            "old values, use a new --output_dir, or --overwrite_output_dir true (without --resume_from_checkpoint) "
            "to start over."
        )


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value
