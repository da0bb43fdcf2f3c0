"""Where each run's hyperparameters came from, and the tuning curve per optimizer and size (loss vs learning rate).

A comparison is only as fair as its learning rates, so the report shows both: the source of every run's learning
rate, weight decay and clipping (summary.json ``hyperparameter_sources``: "user", "tuned: <file>" or the registry's
citation), and, for the runs at learning-rate multipliers (a tuning sweep, or ``--tuning-dir``), the final loss
against the learning rate. The curve uses ``final_tuning_loss`` (a held-out tuning split, not the reported eval
split) when every tuning run has it, else ``final_eval_loss``, and says which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

HPARAM_KEYS = (("learning_rate", "lr"), ("weight_decay", "wd"), ("max_grad_norm", "clip"))
PLAIN_SOURCES = ("user", "transformers default", "registry default")


def short_source(text: str | None) -> str:
    """"user", "tuned: <file>", or "cited: <first author and year>" from a registry citation line."""
    if not text:
        return "unknown"
    text = str(text)
    if text in PLAIN_SOURCES or text.startswith("tuned"):
        return text
    first = text.split(" | ")[0].split(",")[0].split(" (")[0].strip()
    return "cited: " + (first if len(first) <= 40 else first[:39] + "…")


def sources_cell(sources: Mapping[str, Any] | None) -> str:
    """One cell for a run: "all cited: Chen et al. 2023" when the three agree, else "lr ...; wd ...; clip ..."."""
    if not sources:
        return "–"
    short = {label: short_source(sources.get(key)) for key, label in HPARAM_KEYS if key in sources}
    if len(set(short.values())) == 1 and len(short) == len(HPARAM_KEYS):
        return "all " + next(iter(short.values()))
    return "; ".join(f"{label} {src}" for label, src in short.items())


def loss_key(records: Sequence[Mapping[str, Any]]) -> str:
    """final_tuning_loss when every completed tuning run has it, else final_eval_loss."""
    done = [r for r in records if r.get("status") == "completed"]
    has = [(r.get("_summary") or {}).get("final_tuning_loss", r.get("final_tuning_loss")) for r in done]
    return "final_tuning_loss" if done and all(v is not None for v in has) else "final_eval_loss"


def curve_frame(records: Sequence[Mapping[str, Any]]) -> tuple[Any, str]:
    """(DataFrame, loss key): one row per optimizer, size and multiplier with the mean learning rate, the mean and
    sd of the final loss over the completed seeds, the seed counts and ``best`` (the lowest mean among the
    multipliers with no diverged or failed seed, the rule of hf_optbench.study.tuning)."""
    import pandas as pd

    key = loss_key(records)
    rows = []
    for r in records:
        if r.get("lr_multiplier") is None:
            continue
        loss = (r.get("_summary") or {}).get(key, r.get(key)) if r.get("status") == "completed" else None
        rows.append({"optimizer": r.get("optimizer"), "model_size": r.get("model_size"),
                     "lr_multiplier": float(r["lr_multiplier"]), "learning_rate": r.get("learning_rate"),
                     "loss": None if loss is None or not math.isfinite(float(loss)) else float(loss),
                     "bad": r.get("status") != "completed"})
    if not rows:
        return pd.DataFrame(), key
    frame = pd.DataFrame(rows).astype({"learning_rate": "float64", "loss": "float64"})
    out = (frame.groupby(["optimizer", "model_size", "lr_multiplier"], as_index=False)
           .agg(learning_rate=("learning_rate", "mean"), loss=("loss", "mean"), loss_sd=("loss", "std"),
                seeds=("loss", "count"), bad=("bad", "sum")))
    clean = out[(out["bad"] == 0) & out["loss"].notna()]
    best = clean.loc[clean.groupby(["optimizer", "model_size"])["loss"].idxmin()] if len(clean) else clean
    out["best"] = out.index.isin(best.index)
    return out, key
