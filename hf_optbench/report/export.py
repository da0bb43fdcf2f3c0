"""The report's data in a form people load into their own tools: ``runs.parquet``, one tidy row per metrics row of
every run (train, eval and memory rows alike), with the run's matrix point on every row::

    import pandas as pd; df = pd.read_parquet("runs/cpu_demo/report/runs.parquet")
    import datasets; ds = datasets.load_dataset("parquet", data_files="runs/cpu_demo/report/runs.parquet")

pandas (a dependency of ``datasets``) builds the table and pyarrow (also one of ``datasets``) writes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.rundir import atomic_path

# Columns every row has, first, whatever its kind; the kind's own keys follow.
ID_COLUMNS = ("run_id", "optimizer", "model_size", "seed", "lr_multiplier", "status", "kind", "step", "tokens",
              "elapsed_s", "loss", "eval_loss")


def tidy_frame(records: Sequence[Mapping[str, Any]], metrics: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]
               ) -> Any:
    """A pandas DataFrame of every metrics row of every record that has metrics (ID_COLUMNS first, with the data
    ratio ``budget_tpp`` after the seed in a sweep over several). Nested values
    (a memory row's bytes by dtype) become JSON text, so every column has one Parquet type."""
    import pandas as pd

    ratio = ("budget_tpp",) if any(r.get("budget_tpp") is not None for r in records) else ()  # several ratios
    ids = list(ID_COLUMNS[:4]) + list(ratio) + list(ID_COLUMNS[4:])
    rows = []
    for rec in records:
        point = {k: rec.get(k) for k in ("run_id", "optimizer", "model_size", "seed", *ratio, "lr_multiplier",
                                          "status")}
        for kind, kind_rows in (metrics.get(rec["run_id"]) or {}).items():
            for row in kind_rows:
                flat = {k: json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v for k, v in row.items()}
                rows.append({**flat, **point, "kind": kind})
    frame = pd.DataFrame(rows)
    for col in ids:
        if col not in frame.columns:
            frame[col] = None
    frame = frame[ids + sorted(c for c in frame.columns if c not in ids)]
    frame["lr_multiplier"] = frame["lr_multiplier"].astype("float64")
    return frame.sort_values(["run_id", "kind", "step"], kind="stable").reset_index(drop=True)


def write_runs_parquet(records: Sequence[Mapping[str, Any]],
                       metrics: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
                       path: str | os.PathLike[str]) -> Path:
    """Write :func:`tidy_frame` to ``path`` through a temporary file and ``os.replace`` (a reader never sees half
    a file); returns the path."""
    with atomic_path(path) as tmp:
        tidy_frame(records, metrics).to_parquet(tmp, index=False)
    return Path(path)
