"""Tracker grouping of a sweep's runs, passed to each run through its environment."""

from __future__ import annotations

import json
from typing import Any

SWEEP_POINT_ENV = "HF_OPTBENCH_SWEEP_POINT"  # the run's matrix point as JSON, for the run's tracker config


def tracker_env(spec: Any, run: Any) -> dict[str, str]:
    """W&B's grouping of one run, read by ``wandb.init`` from the environment (transformers' WandbCallback calls it
    without group or tags): the sweep as the group, the matrix point as tags, the run id as the name, the phase as
    the job type; and the matrix point as JSON (:data:`SWEEP_POINT_ENV`) for the run's own tracker config.
    (Not WANDB_CONFIG_PATHS: wandb 0.31 rejects it when read from the environment, a str where it wants a list.)"""
    tags = [f"optimizer:{run.optimizer}", f"model_size:{run.model_size}", f"seed:{run.seed}", f"phase:{run.phase}"]
    if run.lr_multiplier is not None:
        tags.append(f"lr_multiplier:{run.lr_multiplier:g}")
    point = {"sweep": spec.name, "phase": run.phase, "run_id": run.run_id, "optimizer": run.optimizer,
             "model_size": run.model_size, "seed": run.seed, "lr_multiplier": run.lr_multiplier}
    tpp = getattr(run, "budget_tpp", None)
    if tpp is not None:  # only in a sweep with several data ratios: a single-ratio run's tags stay as they were
        tags.append(f"tokens_per_param:{tpp:g}")
        point["budget_tpp"] = tpp
    return {"WANDB_RUN_GROUP": spec.name, "WANDB_TAGS": ",".join(tags), "WANDB_NAME": run.run_id,
            "WANDB_JOB_TYPE": run.phase, SWEEP_POINT_ENV: json.dumps(point, sort_keys=True)}
