"""Where each run's hyperparameters came from, and the tuning curve per optimizer and size (loss vs learning rate).

A comparison is only as fair as its learning rates, so the report shows both: the source of every run's learning
rate, weight decay and clipping (summary.json ``hyperparameter_sources``: "user", "tuned: <file>" or the registry's
citation), and, for the runs at learning-rate multipliers (a tuning sweep, or ``--tuning-dir``), the final loss
against the learning rate. The curve uses ``final_tuning_loss`` (a held-out tuning split, not the reported eval
split) when every tuning run has it, else ``final_eval_loss``, and says which.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.rundir import TUNING_DIR
from hf_optbench.study.records import Cell, RunRecord

HPARAM_KEYS = (("learning_rate", "lr"), ("weight_decay", "wd"), ("max_grad_norm", "clip"))
PLAIN_SOURCES = ("user", "transformers default", "registry default")


def short_source(text: str | None) -> str:
    """"user", "tuned: <file>", or "cited: <first author and year>" from a registry citation line."""
    if not text:
        return "unknown"
    text = str(text)
    if text.startswith("tuned: "):
        # The file's name only: it lies in the sweep directory the report is about, and a full path would print the
        # machine it ran on into a report that is committed and read elsewhere (docs/results/).
        return "tuned: " + Path(text[len("tuned: "):]).name
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


def _runs(records: Sequence[Mapping[str, Any]]) -> list[RunRecord]:
    """``records`` as run records (rows in their dict form are read into one)."""
    return [RunRecord.from_row(r) for r in records]


def _loss(r: RunRecord, key: str) -> Any:
    """A run's ``key``: its summary.json's where the summary has the key, else the record's column."""
    return r.summary.get(key, r.get(key))


def loss_key(records: Sequence[Mapping[str, Any]]) -> str:
    """final_tuning_loss when every completed tuning run has it, else final_eval_loss (``records``: run records,
    or rows in their dict form, as for every function here that takes records)."""
    done = [r for r in _runs(records) if r.status == "completed"]
    return "final_tuning_loss" if done and all(_loss(r, "final_tuning_loss") is not None for r in done) \
        else "final_eval_loss"


def _point(r: RunRecord) -> Any:
    """A tuning run's point (study.tuning.Coords: learning rate, weight decay, group ratio, budget multiples)."""
    from hf_optbench.rundir import parse_run_id
    from hf_optbench.study.tuning import Coords

    p = parse_run_id(r.run_id)
    wd = r.wd_multiplier if r.wd_multiplier is not None else p.get("wd_multiplier")
    return Coords.of(float(r.lr_multiplier), wd, p.get("nonmatrix_multiplier"), p.get("budget_multiple"))


def _is_lr_point(r: RunRecord) -> bool:
    """A run of the learning-rate curve at the compared budget (not of a weight-decay, group-ratio or rung axis)."""
    point = _point(r)
    return point.wd is None and point.nm is None and point.dx is None


def curve_frame(records: Sequence[Mapping[str, Any]]) -> tuple[Any, str]:
    """(DataFrame, loss key): one row per optimizer, size and multiplier of the learning-rate curve at the compared
    budget with the mean learning rate, the mean and sd of the final loss over the completed seeds, the seed counts
    and ``best`` (the lowest mean among the multipliers with no diverged or failed seed, the rule of
    hf_optbench.study.tuning)."""
    import pandas as pd

    key = loss_key(records)
    rows = []
    for r in _runs(records):
        if r.lr_multiplier is None or not _is_lr_point(r):  # another axis's run: not this curve
            continue
        loss = _loss(r, key) if r.status == "completed" else None
        rows.append({"optimizer": r.optimizer, "model_size": r.cell.label,
                     "lr_multiplier": float(r.lr_multiplier), "learning_rate": r.get("learning_rate"),
                     "loss": None if loss is None or not math.isfinite(float(loss)) else float(loss),
                     "bad": r.status != "completed"})
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


def point_losses(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[Any, float | None]]:
    """{(optimizer, size): {point: mean loss}} of the tuning runs (the loss of :func:`loss_key`; the point a
    study.tuning.Coords); None where a seed diverged or failed or has no loss (the selection rule: such a point
    loses)."""
    key = loss_key(records)
    seen: dict[tuple[str, str], dict[Any, list[float | None]]] = {}
    for r in _runs(records):
        if r.lr_multiplier is None:
            continue
        loss = _loss(r, key) if r.status == "completed" else None
        ok = loss is not None and math.isfinite(float(loss))
        seen.setdefault((str(r.optimizer), r.cell.label), {}).setdefault(_point(r), []).append(
            float(loss) if ok else None)
    return {pair: {p: None if None in v else sum(x for x in v if x is not None) / len(v) for p, v in points.items()}
            for pair, points in seen.items()}


def _interior(curve: Mapping[float, float | None], floor: float | None = None) -> bool:
    """Whether the best point (ties to x1, hf_optbench.study.tuning.choose) lies strictly inside the grid, or at
    ``floor``, the edge of the hyperparameter's domain (0 for weight decay: nothing lies beyond it)."""
    from hf_optbench.study.tuning import choose, is_bracketed

    return bool(curve) and is_bracketed(list(curve), choose({m: math.inf if v is None else v for m, v in curve.items()}),
                                        floor)


def bracketed_from_records(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], bool]:
    """{(optimizer, size): bracketed} from tuning runs: every axis's best inside its grid (the learning-rate curve;
    the weight-decay curve with the learning-rate best as x1, its floor 0; the group ratio's with the best before it
    as x1; each rung's learning-rate curve), where that axis ran."""
    out = {}
    for pair, points in point_losses(records).items():
        lr_curve = {p.lr: v for p, v in points.items() if p.wd is None and p.nm is None and p.dx is None}
        ok = _interior(lr_curve)
        wd_runs = {p: v for p, v in points.items() if p.wd is not None and p.dx is None}
        for lr in sorted({p.lr for p in wd_runs}):
            ok = ok and _interior({1.0: lr_curve.get(lr), **{p.wd: v for p, v in wd_runs.items() if p.lr == lr}},
                                  floor=0.0)
        nm_runs = {p: v for p, v in points.items() if p.nm is not None and p.dx is None}
        for lr, wd in sorted({(p.lr, p.wd or 1.0) for p in nm_runs}):
            x1 = next((v for p, v in points.items() if p.lr == lr and (p.wd or 1.0) == wd and p.nm is None
                       and p.dx is None), None)
            ok = ok and _interior({1.0: x1, **{p.nm: v for p, v in nm_runs.items() if p.lr == lr}})
        for dx in sorted({p.dx for p in points if p.dx is not None}):
            ok = ok and _interior({p.lr: v for p, v in points.items() if p.dx == dx})
        out[pair] = ok
    return out


def tuned_bracketing(sweep_dir: str | os.PathLike[str] | None) -> dict[tuple[str, str], bool]:
    """{(optimizer, cell): bracketed} as the sweep's tuned files record it ({} without one): ``bracketed``, which
    the tuning phase wrote by the tuning rule (:mod:`hf_optbench.study.tuning`); an older file without it: its
    learning-rate curve's best inside the grid."""
    from hf_optbench.study.tuning_phase import tuned_files
    from hf_optbench.yaml_file import read_yaml_or_empty

    files = tuned_files(Path(sweep_dir)) if sweep_dir is not None else {}
    return {(str(o), Cell(s, tpp).label): bool(e["bracketed"]) if "bracketed" in e else
            _interior({float(c["multiplier"]): c.get("tuning_loss") for c in e.get("curve") or []})
            for tpp, path in files.items() for o, sizes in read_yaml_or_empty(path).items()
            if isinstance(sizes, dict) for s, e in sizes.items() if isinstance(e, dict)}


def bracketed_optima(sweep_dir: str | os.PathLike[str]) -> dict[tuple[str, str], bool]:
    """{(optimizer, size): bracketed bool} of a sweep (the size a cell, "tiny @ 0.5 tok/param", in a sweep over data
    ratios): from its tuned files (:func:`tuned_bracketing`), else from its tuning runs (``<sweep_dir>/tuning``, or
    the directory itself for a tuning grid run by hand, which has no tuned file). For the verdict table: a
    comparison never starts from an unbracketed optimum without the report saying so."""
    from hf_optbench.study.records import load_records

    d = Path(sweep_dir)
    found = tuned_bracketing(d)
    if found:
        return found
    runs = d / TUNING_DIR if (d / TUNING_DIR).is_dir() else d
    return bracketed_from_records(load_records(runs)) if runs.is_dir() else {}
