"""A sweep directory's run records: one flat record per run directory (its matrix point, final status and
summary.json's figures, the SLURM job it ran as, its data ratio ``budget_tpp`` and its report ``cell`` in a sweep with several) and
summary.csv. Read by the sweep (its end-of-sweep summary.csv), the tuner (the grid's
losses) and the report (:mod:`hf_optbench.report.analysis`), so it sits with the sweep, below the report.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.verdict import ratio_label
from hf_optbench.rundir import (
    MANIFEST_FILE,
    METRICS_FILE,
    STATE_FILE,
    STDOUT_FILE,
    SUMMARY_FILE,
    finished_status,
    parse_run_id,
    read_state,
    read_summary,
    runs_root,
    write_text_atomic,
)

SUMMARY_COLUMNS = (
    "run_id", "optimizer", "model_size", "seed", "lr_multiplier", "status", "error", "attempts", "job_id",
    "num_params", "num_params_non_embedding", "optimizer_impl", "learning_rate", "weight_decay", "precision",
    "world_size", "micro_batch_size", "block_size", "tokens_per_step", "steps", "tokens_seen",
    "final_train_loss", "final_eval_loss", "final_tuning_loss", "max_steps", "optimizer_state_bytes", "optimizer_state_bytes_per_param",
    "param_bytes", "grad_bytes", "peak_memory_bytes", "peak_memory_kind", "step_time_median_s", "step_time_p90_s",
    "tokens_per_s", "mfu", "loss_spikes", "max_loss_spike", "grad_norm_spikes", "diverged_step", "train_runtime_s",
    "budget_multiple", "tokens_per_param", "budget_tpp", "run_dir",
)

# A run directory a sweep moved aside (never deleted): an unfinished attempt (``.incomplete-N``) or a finished run
# whose settings the edited sweep file no longer gives (``.changed-N``, hf_optbench.study.kept_runs). Run ids may
# hold dots themselves (``lrx0.5``), hence the whole suffix.
ASIDE_RE = re.compile(r"\.(incomplete|changed)-\d+$")


def cell_label(size: Any, tpp: float | None) -> str:
    """The report's name of a (size, data ratio) cell: the size alone in a sweep with one ratio (``tpp`` None: its
    report reads as before), "tiny @ 0.5 tok/param" in a sweep with several."""
    return str(size) if tpp is None else f"{size} @ {ratio_label(tpp)}"


def cell_of(rec: Mapping[str, Any]) -> str:
    """A record's cell (:func:`cell_label`): what the report groups seeds by, where it used to group by size."""
    return str(rec.get("cell") or cell_label(rec.get("model_size"), rec.get("budget_tpp")))


def is_run_dir_name(name: str) -> bool:
    """Whether a directory of a sweep's ``runs/`` is one of its runs: not moved aside, not hidden (a staging or
    temporary folder: run ids never start with a dot)."""
    return not name.startswith(".") and not ASIDE_RE.search(name)


def _run_dirs(sweep_dir: Path) -> list[Path]:
    root = runs_root(sweep_dir)
    return sorted(p for p in root.iterdir() if p.is_dir() and is_run_dir_name(p.name)
                  and ((p / SUMMARY_FILE).is_file() or (p / METRICS_FILE).is_file()
                       or (p / STDOUT_FILE).is_file()))


def load_runs(sweep_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One flat record per run directory: the matrix point, the final status, summary.json's figures."""
    d = Path(sweep_dir)
    if not d.is_dir():
        raise OptBenchError(f"sweep directory not found: '{sweep_dir}'. Pass a sweep's output_dir.")
    manifest: dict[str, dict[str, Any]] = {}
    if (d / MANIFEST_FILE).is_file():
        manifest = {r["run_id"]: r for r in json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))["runs"]}
    rows = read_state(d / STATE_FILE)
    return [_record(run_dir, manifest.get(run_dir.name, {}), rows) for run_dir in _run_dirs(d)]


def _record(run_dir: Path, planned: Mapping[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A run's record: summary.json's figures, its matrix point (manifest, else its id), its status and error as
    the state file has them, and the whole summary under ``_summary``."""
    rid = run_dir.name
    summary = read_summary(run_dir) or {}
    point = {**parse_run_id(rid), **{k: v for k, v in planned.items()
                                      if k in ("optimizer", "model_size", "seed", "lr_multiplier", "max_steps",
                                               "budget_multiple", "budget_tpp")}}
    rec: dict[str, Any] = {k: summary.get(k) for k in SUMMARY_COLUMNS}
    rec.update({"run_id": rid, "run_dir": str(run_dir)})
    for key in ("optimizer", "model_size", "seed"):
        rec[key] = summary.get(key, point.get(key))
    rec["lr_multiplier"] = point.get("lr_multiplier")
    rec["budget_multiple"] = point.get("budget_multiple")
    rec["wd_multiplier"] = point.get("wd_multiplier")
    rec["budget_tpp"] = point.get("budget_tpp")
    rec["cell"] = cell_label(rec.get("model_size"), rec["budget_tpp"])
    rec["max_steps"] = summary.get("max_steps") or point.get("max_steps")
    ends = [r for r in rows if r.get("run_id") == rid and r.get("event") == "end"]
    rec["attempts"] = sum(1 for r in rows if r.get("run_id") == rid and r.get("event") in ("start", "submitted"))
    # the SLURM executor's job of the last attempt (None for a local run): the id the run recorded it ran under
    # (summary.json's env), else the one the sweep submitted
    rec["job_id"] = (summary.get("env") or {}).get("slurm_job_id") or (ends[-1].get("job_id") if ends else None)
    status = finished_status(run_dir, rows, rid) if rows else summary.get("status")
    rec["status"] = status or "running/unfinished"
    if ends and ends[-1].get("status") == rec["status"] and ends[-1].get("error") and not rec.get("error"):
        rec["error"] = ends[-1]["error"]
    if rec["status"] == "failed" and ends and ends[-1].get("status") == "oom":
        rec["status"] = "oom"
    if not summary and (run_dir / SUMMARY_FILE).is_file():  # there, but not readable: never counted as finished
        rec["status"], rec["error"] = "failed", f"{run_dir / SUMMARY_FILE} is unreadable (not a JSON object)"
    rec["_summary"] = summary
    return rec


def write_summary_csv(records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str],
                      extra: Sequence[str] = ()) -> Path:
    """One row per run (rewritten whole each time, atomically: never a duplicate or torn row)."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(SUMMARY_COLUMNS) + list(extra), extrasaction="ignore")
    writer.writeheader()
    for rec in records:
        row = {k: rec.get(k) for k in writer.fieldnames}
        if isinstance(row.get("error"), str):
            row["error"] = row["error"].strip().splitlines()[-1][:300] if row["error"].strip() else ""
        writer.writerow(row)
    return write_text_atomic(path, buf.getvalue())


def _csv_float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def compared_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The compared runs of a report's summary.csv (completed, the x1 budget, no learning-rate multiplier) as the
    verdict reads records (``speedup_censored`` / ``speedup_bound`` from the bound column): what a committed study
    keeps in place of its run directories. A figure the file lacks or cannot parse reads None."""
    out = []
    with Path(path).open(encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            if (r.get("status") != "completed" or r.get("lr_multiplier")
                    or r.get("budget_multiple") not in (None, "", "1", "1.0")):
                continue
            bound = r.get("speedup_bound") or ""
            out.append({"optimizer": r.get("optimizer") or "", "model_size": r.get("model_size") or "",
                        "num_params": _csv_float(r.get("num_params")), "seed": int(r.get("seed") or 0),
                        "budget_tpp": _csv_float(r.get("budget_tpp")), "speedup": _csv_float(r.get("speedup")),
                        "speedup_censored": bool(bound), "speedup_bound": bound or None})
    return out
