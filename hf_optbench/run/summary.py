"""summary.json of one run: what was asked and resolved (written before training, so a crash still leaves it)
and what was measured (filled in after training, whatever its outcome).

The keys are the run-directory contract in docs/ARCHITECTURE.md ("summary.json keys"); the report, the sweep,
the model card and ``push`` read them, so a key is added here, never renamed or dropped.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import TYPE_CHECKING, Any

from hf_optbench.run.provenance import environment

if TYPE_CHECKING:
    from transformers import TrainerState

    from hf_optbench.config.parse import RunConfig

# Set by a local sweep on each run it starts (hf_optbench.study.sweep_state.Slot): how many runs it runs at once on
# this machine (launcher.jobs), which slot this run took, and the cores that slot is pinned to.
CONCURRENT_RUNS_ENV = "HF_OPTBENCH_CONCURRENT_RUNS"
SLOT_ENV = "HF_OPTBENCH_SLOT"
CPUS_ENV = "HF_OPTBENCH_CPUS"


def precision_name(args: Any) -> str:
    """bf16 / fp16 / fp32 from TrainingArguments' flags."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def sharing() -> dict[str, Any]:
    """How this run shared the machine: ``concurrent_runs`` (how many runs its sweep ran at once here; null outside
    a local sweep, which says nothing about other load) and ``pinning`` (its sweep slot, the cores it may run on as
    the kernel reports them, its CUDA_VISIBLE_DEVICES). Why: runs side by side compete for memory bandwidth and
    caches even on cores of their own, so wall-clock figures of a shared machine are not those of an idle one, and
    the report says so (hf_optbench.report.noise)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"concurrent_runs": _env_int(CONCURRENT_RUNS_ENV),
            "pinning": {"slot": _env_int(SLOT_ENV), "cpus": cpus,
                        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}}


def build_summary(cfg: RunConfig, prepared: Any, record: dict[str, Any], *, schedule: str,
                  hparams: dict[str, Any], tokens_per_step: int, git: dict[str, Any]) -> dict[str, Any]:
    """The settings half of summary.json; ``status`` starts as "failed" until training says otherwise. The
    optimizer's values are the record of what ran (``hf_optbench.run.what_ran.what_ran``): ``hyperparameters``
    ({key: {"value", "source"}}: betas, eps, momentum... as the optimizer holds them) and ``param_groups`` (each
    group's values: no decay on biases and norms, Muon's matrices beside its AdamW groups)."""
    from hf_optbench.models import count_parameters

    args = cfg.training
    ran = {k: v["value"] for k, v in record["hyperparameters"].items()}
    model = prepared.model
    non_embedding = count_parameters(model, exclude_embeddings=True)
    return {
        "optimizer": cfg.optim.optimizer,
        "optimizer_impl": record["optimizer_impl"],  # re-read after training: what actually stepped
        "model_size": cfg.model.model_size,
        "num_params": count_parameters(model),
        "num_params_non_embedding": non_embedding,
        "vocab_size": prepared.bundle.vocab_size,
        "embedding_rows": model.get_input_embeddings().num_embeddings,
        "block_size": cfg.data.block_size,
        "micro_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": args.world_size,
        "tokens_per_step": tokens_per_step,
        "seed": args.seed,
        "learning_rate": ran.get("learning_rate", args.learning_rate),
        "weight_decay": ran.get("weight_decay", args.weight_decay),
        "max_grad_norm": args.max_grad_norm,
        "hyperparameters": record["hyperparameters"],
        "param_groups": record["param_groups"],
        "hyperparameter_sources": {k: v["source"] for k, v in hparams.items()},
        "schedule": schedule,
        "schedule_resolved": record["schedule"],
        "schedule_kwargs": {"warmup_steps": args.warmup_steps, "min_lr_ratio": cfg.optim.min_lr_ratio,
                            **cfg.optim.schedule_kwargs_dict()},
        "embedding_state_32bit": cfg.optim.embedding_state_32bit,
        "precision": precision_name(args),
        "max_steps": args.max_steps,
        # the data budget per non-embedding parameter (Chinchilla's and Marin's unit: 20 = "1x Chinchilla")
        "tokens_per_param": args.max_steps * tokens_per_step / max(non_embedding, 1) if args.max_steps > 0 else None,
        "data": prepared.bundle.info,
        "env": environment(),
        "git": git,
        "recipe": cfg.recipe_path,
        "status": "failed",
        "error": None,
        "final_tuning_loss": None,  # the tuning split's loss, for learning-rate selection only (never reported)
        **sharing(),
    }


def record_failure(summary: dict[str, Any], exc: BaseException, started: float) -> None:
    """Status, error and traceback of a run that raised: an out-of-memory error is a result ("oom"), not a bug."""
    from hf_optbench.rundir import lost_status

    summary["status"] = lost_status(exc)
    summary["error"] = f"{type(exc).__name__}: {exc}"
    summary["traceback"] = traceback.format_exc(limit=20)
    summary["train_runtime_s"] = time.time() - started


def last_log(log_history: list[dict[str, Any]], key: str) -> float | None:
    """The latest value of ``key`` in Trainer's log history, or None."""
    for row in reversed(log_history):
        if key in row:
            return row[key]
    return None


def finish_summary(summary: dict[str, Any], state: TrainerState, recorder: Any, optimizer: Any,
                   tokens_per_step: int) -> None:
    """The measured half: steps and tokens done, final losses, the recorder's figures, and the optimizer that
    actually stepped (DeepSpeed or Accelerate may have wrapped the one we built). A divergence the recorder saw
    wins over any other status."""
    from hf_optbench.optim.registry import describe_optimizer

    summary["steps"] = state.global_step
    summary["tokens_seen"] = state.global_step * tokens_per_step
    summary["final_train_loss"] = last_log(state.log_history, "loss")
    summary["final_eval_loss"] = last_log(state.log_history, "eval_loss")
    summary.update(recorder.summary())
    summary["optimizer_impl"] = describe_optimizer(optimizer)
    if recorder.status == "diverged":
        summary["status"] = "diverged"
