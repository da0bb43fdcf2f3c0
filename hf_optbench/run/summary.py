"""summary.json of one run, rendered from its plan: what was planned and resolved (written before training, so a
crash still leaves it), what was measured (filled in after training, whatever its outcome), and where the figures
came from (the code's git state, the package versions and the device, the machine's sharing).

The keys are the run-directory contract in docs/ARCHITECTURE.md ("summary.json keys"); the report, the sweep,
the model card and ``push`` read them, so a key is added here, never renamed or dropped. The optimizer's values
are the plan's record (``hf_optbench.run.plan.plan_record``), checked against the optimizer that was built.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.measure.provenance import RunFacts, precision_name, settings_summary, trained_summary
from hf_optbench.rundir import portable_path, run_status

if TYPE_CHECKING:
    from transformers import TrainerState

    from hf_optbench.run.identity import Resumption
    from hf_optbench.run.plan import RunPlan

# Set by a local sweep on each run it starts (hf_optbench.study.sweep_state.Slot): how many runs it runs at once on
# this machine (launcher.jobs), which slot this run took, and the cores that slot is pinned to.
CONCURRENT_RUNS_ENV = "HF_OPTBENCH_CONCURRENT_RUNS"
SLOT_ENV = "HF_OPTBENCH_SLOT"
CPUS_ENV = "HF_OPTBENCH_CPUS"


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


def build_summary(plan: RunPlan, prepared: Any, record: dict[str, Any], *, resumption: Resumption | None,
                  git: dict[str, Any]) -> dict[str, Any]:
    """The settings half of summary.json, rendered from the plan (:func:`hf_optbench.measure.provenance.
    settings_summary` writes the keys both paths share); ``status`` starts as "failed" until training says
    otherwise. The optimizer's values are its record (``plan_record``): ``hyperparameters`` ({key: {"value",
    "source"}}) and ``param_groups`` (each group's values and sources: no decay on biases and norms, Muon's matrices
    beside its AdamW groups). ``resumed_from`` names the checkpoint a resume loaded, and whether its identity was
    verified or forced. The run's own keys: the embedding state's precision, the TrainingArguments keys it was
    given, the tuning split's loss and how it shared the machine."""
    cfg, args, batch = plan.args, plan.args.training, plan.batch
    facts = RunFacts(
        record=record, model=prepared.model, model_size=plan.model.model_size, vocab_size=prepared.bundle.vocab_size,
        block_size=batch.block_size, micro_batch_size=batch.per_device_train_batch_size,
        gradient_accumulation_steps=batch.gradient_accumulation_steps, world_size=batch.world_size,
        tokens_per_step=batch.tokens_per_step, seed=args.seed,
        schedule_kwargs={"warmup_steps": args.warmup_steps, "min_lr_ratio": cfg.optim.min_lr_ratio,
                         **cfg.optim.schedule_kwargs_dict()},
        precision=precision_name(args), max_steps=plan.max_steps, plan_hash=plan.plan_hash,
        resumed_from=resumption.record() if resumption is not None else None,
        data={**portable_data_info(prepared.bundle.info),
              "content_fingerprint": f"{plan.data.kind}:{plan.data.fingerprint}"},
        git=git, recipe=_recipe(cfg.recipe_path))
    return {
        **settings_summary(facts),
        "embedding_state_32bit": plan.optimizer.embedding_state_32bit,
        "trainer_keys": cfg.trainer_keys.record(),  # TrainingArguments' own keys and what they became
        "status": run_status(None),  # until training says otherwise
        "final_tuning_loss": None,  # the tuning split's loss, for learning-rate selection only (never reported)
        **sharing(),
    }


def _recipe(path: str | None) -> str | None:
    """The recipe as given on the command line, an absolute path relative to the working directory (summary.json
    is uploaded: never this machine's absolute path)."""
    return portable_path(path, Path.cwd()) if path and os.path.isabs(path) else path


def portable_data_info(info: dict[str, Any]) -> dict[str, Any]:
    """The data pipeline's record of the data without this machine's cache path (summary.json is uploaded and
    committed): the cache entry relative to the data cache (``data/<fingerprint>``) instead."""
    out = {k: v for k, v in info.items() if k != "cache_path"}
    if info.get("cache_path"):
        entry = Path(str(info["cache_path"]))
        out["cache_entry"] = f"{entry.parent.name}/{entry.name}"
    return out


def record_failure(summary: dict[str, Any], exc: BaseException, started: float) -> None:
    """Error and traceback of a run that raised (its status: :func:`hf_optbench.rundir.run_status`)."""
    summary["error"] = f"{type(exc).__name__}: {exc}"
    summary["traceback"] = traceback.format_exc(limit=20)
    summary["train_runtime_s"] = time.time() - started


def finish_summary(summary: dict[str, Any], state: TrainerState, recorder: Any, optimizer: Any, *, built: str,
                   model: Any, raised: BaseException | None = None) -> None:
    """The measured half: steps and tokens done, final losses, the recorder's figures, the optimizer that actually
    stepped (DeepSpeed or Accelerate may have wrapped the one we built, ``built`` its builder's string, ``model``
    the model it was built over) and the run's status, from what the recorder measured and ``raised``, what ended
    the run (None: it trained to its end)."""
    from hf_optbench.optim.registry import describe_optimizer

    summary.update(trained_summary(state, summary["tokens_per_step"]))
    summary.update(recorder.summary())
    summary["optimizer_impl"] = describe_optimizer(optimizer, built=built, model=model)
    summary["status"] = run_status(recorder.status, raised)
