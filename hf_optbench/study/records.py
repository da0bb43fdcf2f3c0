"""A sweep directory's run records: one :class:`RunRecord` per run directory (its matrix point, final status and
summary.json's figures, the SLURM job it ran as, its data ratio ``budget_tpp`` and its report :class:`Cell`), and
summary.csv. Read by the sweep (its end-of-sweep summary.csv), the tuner (the grid's losses) and the report
(:mod:`hf_optbench.report.analysis`), so it sits with the sweep, below the report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Cell:
    """What the report groups seeds by: a model size at a data ratio (``ratio`` None in a sweep with one ratio,
    where the cell is the size itself)."""

    size: str
    ratio: float | None = None

    @property
    def label(self) -> str:
        """The cell as tables and file captions write it (:func:`cell_label`)."""
        return cell_label(self.size, self.ratio)


# The record's typed fields: its matrix point, where it ran and how it ended. Every other column of summary.csv
# (and each figure the report derives) is a named figure, read by key, since tables and the verdict address
# metrics by their names.
_FIELDS = ("run_id", "run_dir", "optimizer", "model_size", "seed", "lr_multiplier", "wd_multiplier",
           "budget_multiple", "budget_tpp", "max_steps", "status", "error", "attempts", "job_id")
# The two keys of the dict form that are no column: the cell's label and summary.json whole.
_CELL_KEY, _SUMMARY_KEY = "cell", "_summary"


@dataclass(frozen=True, eq=False)
class RunRecord(Mapping[str, Any]):
    """One run directory, read once (:func:`load_records`): its matrix point, final status and summary.json's figures.

    The study and the report read its fields as attributes (``rec.cell``, ``rec.summary``). It is also a read-only
    mapping with the keys of the flat dict form (summary.csv's columns, ``cell``, summary.json whole under
    ``_summary``), so the code that addresses figures by name (tables, the verdict's metrics, the tuner's metric)
    reads it as it reads a row. Figures derived later (the report's time to target, speedup) make a new record
    (:meth:`with_columns`): a record never changes under a reader.
    """

    run_id: str
    run_dir: str = ""
    optimizer: str | None = None
    model_size: str | None = None
    seed: Any = None
    lr_multiplier: float | None = None
    wd_multiplier: float | None = None
    budget_multiple: float | None = None
    budget_tpp: float | None = None
    max_steps: Any = None
    status: str | None = None
    error: str | None = None
    attempts: int | None = None
    job_id: Any = None
    figures: dict[str, Any] = field(default_factory=dict)  # every other column by name (None: not recorded)
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json whole ({}: none, or unreadable)

    @property
    def cell(self) -> Cell:
        """The (size, data ratio) cell the report groups this run's seed in."""
        return Cell(str(self.model_size), self.budget_tpp)

    def figure(self, key: str) -> Any:
        """A column of the record, else summary.json's key of that name (a report table can show any summary
        figure without adding it to summary.csv); None where neither has it."""
        return self[key] if key in self else self.summary.get(key)

    def recorded(self, key: str) -> Any:
        """summary.json's own ``key``, else (missing, or 0) the record's column: what the run itself wrote first, a
        planned value (max_steps from the manifest) only where the run wrote none."""
        return self.summary.get(key) or self.get(key)

    def with_columns(self, values: Mapping[str, Any]) -> RunRecord:
        """A copy with ``values`` set (fields by name, every other key as a figure)."""
        typed = {k: v for k, v in values.items() if k in _FIELDS}
        extra = {k: v for k, v in values.items() if k not in _FIELDS and k not in (_CELL_KEY, _SUMMARY_KEY)}
        return dataclasses.replace(self, **typed, figures={**self.figures, **extra})

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        """A record from its flat dict form (a row built by hand, or read back): the inverse of ``dict(record)``."""
        if isinstance(row, RunRecord):
            return row
        return cls(**{k: row.get(k) for k in _FIELDS if k != "run_id"}, run_id=str(row.get("run_id") or ""),
                   figures={k: v for k, v in row.items() if k not in _FIELDS and k not in (_CELL_KEY, _SUMMARY_KEY)},
                   summary=dict(row.get(_SUMMARY_KEY) or {}))

    # -- the mapping (the flat dict form)
    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            return getattr(self, key)
        if key in self.figures:
            return self.figures[key]
        if key == _CELL_KEY:
            return self.cell.label
        if key == _SUMMARY_KEY:
            return self.summary
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        columns = [k for k in SUMMARY_COLUMNS if k in _FIELDS or k in self.figures]
        yield from columns
        yield from (k for k in _FIELDS if k not in SUMMARY_COLUMNS)
        yield from (_CELL_KEY, _SUMMARY_KEY)
        yield from (k for k in self.figures if k not in SUMMARY_COLUMNS)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def set_columns(lists: Iterable[list[RunRecord]], records: Iterable[RunRecord],
                columns: Callable[[RunRecord], Mapping[str, Any]]) -> None:
    """Give each of ``records`` the derived ``columns(record)`` in every one of ``lists`` that holds it (in place:
    a record is frozen, so its copy with the columns set takes its place)."""
    new = {id(r): r.with_columns(columns(r)) for r in records}
    for held in lists:
        held[:] = [new.get(id(r), r) for r in held]


def cells_of(records: Iterable[RunRecord]) -> list[str]:
    """The labels of the cells ``records`` fall in, sorted."""
    return sorted({r.cell.label for r in records})


def is_run_dir_name(name: str) -> bool:
    """Whether a directory of a sweep's ``runs/`` is one of its runs: not moved aside, not hidden (a staging or
    temporary folder: run ids never start with a dot)."""
    return not name.startswith(".") and not ASIDE_RE.search(name)


def _run_dirs(sweep_dir: Path) -> list[Path]:
    root = runs_root(sweep_dir)
    return sorted(p for p in root.iterdir() if p.is_dir() and is_run_dir_name(p.name)
                  and ((p / SUMMARY_FILE).is_file() or (p / METRICS_FILE).is_file()
                       or (p / STDOUT_FILE).is_file()))


def load_records(sweep_dir: str | os.PathLike[str]) -> list[RunRecord]:
    """One record per run directory of a sweep (by run id): the matrix point, the final status, summary.json's
    figures."""
    d = Path(sweep_dir)
    if not d.is_dir():
        raise OptBenchError(f"sweep directory not found: '{sweep_dir}'. Pass a sweep's output_dir.")
    manifest: dict[str, dict[str, Any]] = {}
    if (d / MANIFEST_FILE).is_file():
        manifest = {r["run_id"]: r for r in json.loads((d / MANIFEST_FILE).read_text(encoding="utf-8"))["runs"]}
    rows = read_state(d / STATE_FILE)
    return [_record(run_dir, manifest.get(run_dir.name, {}), rows) for run_dir in _run_dirs(d)]


def load_runs(sweep_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """:func:`load_records` in the flat dict form, for the code that builds on a record as a dict."""
    return [dict(r) for r in load_records(sweep_dir)]


def _record(run_dir: Path, planned: Mapping[str, Any], rows: Sequence[dict[str, Any]]) -> RunRecord:
    """A run's record: summary.json's figures, its matrix point (manifest, else its id), its status and error as
    the state file has them, and the whole summary."""
    rid = run_dir.name
    summary = read_summary(run_dir) or {}
    point = {**parse_run_id(rid), **{k: v for k, v in planned.items()
                                      if k in ("optimizer", "model_size", "seed", "lr_multiplier", "max_steps",
                                               "budget_multiple", "budget_tpp")}}
    ends = [r for r in rows if r.get("run_id") == rid and r.get("event") == "end"]
    status = (finished_status(run_dir, rows, rid) if rows else summary.get("status")) or "running/unfinished"
    error = summary.get("error")
    if ends and ends[-1].get("status") == status and ends[-1].get("error") and not error:
        error = ends[-1]["error"]
    if status == "failed" and ends and ends[-1].get("status") == "oom":
        status = "oom"
    if not summary and (run_dir / SUMMARY_FILE).is_file():  # there, but not readable: never counted as finished
        status, error = "failed", f"{run_dir / SUMMARY_FILE} is unreadable (not a JSON object)"
    return RunRecord(
        run_id=rid, run_dir=str(run_dir),
        optimizer=summary.get("optimizer", point.get("optimizer")),
        model_size=summary.get("model_size", point.get("model_size")),
        seed=summary.get("seed", point.get("seed")),
        lr_multiplier=point.get("lr_multiplier"), wd_multiplier=point.get("wd_multiplier"),
        budget_multiple=point.get("budget_multiple"), budget_tpp=point.get("budget_tpp"),
        max_steps=summary.get("max_steps") or point.get("max_steps"), status=status, error=error,
        attempts=sum(1 for r in rows if r.get("run_id") == rid and r.get("event") in ("start", "submitted")),
        # the SLURM executor's job of the last attempt (None for a local run): the id the run recorded it ran under
        # (summary.json's env), else the one the sweep submitted
        job_id=(summary.get("env") or {}).get("slurm_job_id") or (ends[-1].get("job_id") if ends else None),
        figures={k: summary.get(k) for k in SUMMARY_COLUMNS if k not in _FIELDS}, summary=summary)


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
