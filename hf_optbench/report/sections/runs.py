"""The runs section: one row per run of the sweep (every status), with its learning rate, where its hyperparameters
came from (:func:`hf_optbench.report.tuning_curves.sources_cell`), its steps, final eval loss, attempts and the last
line of its error; the same runs are in summary.csv and runs.parquet."""

from __future__ import annotations

from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.report.tables import Column, fmt_num, render
from hf_optbench.study.records import RunRecord


def runs_section(doc: Any, an: Analysis) -> None:
    """The evidence's last section (``doc``: report.build.Doc): one row per run, and where the machine-readable
    files are."""
    doc.h(2, "Runs")
    doc.table(*render(RUNS, an.all_records))
    doc.p("Machine-readable: summary.csv (one row per run, with the derived target columns) and runs.parquet (every "
          "metrics row of every run, tidy: `pandas.read_parquet(\"runs.parquet\")` or "
          "`datasets.load_dataset(\"parquet\", data_files=\"runs.parquet\")`).")


def _last_error_line(r: dict[str, Any]) -> str:
    return (str(r.get("error") or "").strip().splitlines() or [""])[-1][:160]


def _sources(r: RunRecord) -> str:
    from hf_optbench.report.tuning_curves import sources_cell

    return sources_cell(r.summary.get("hyperparameter_sources"))


RUNS = [  # one row per run record
    Column("run", lambda r: r.run_id),
    Column("status", lambda r: r.status),
    Column("lr multiplier", lambda r: "–" if r.lr_multiplier is None else f"{float(r.lr_multiplier):g}"),
    Column("lr", lambda r: fmt_num(r.get("learning_rate"), "{:.3g}")),
    Column("hyperparameters from", _sources),
    Column("steps", lambda r: fmt_num(r.get("steps"), "{:.0f}")),
    Column("final eval loss", lambda r: fmt_num(r.get("final_eval_loss"))),
    Column("attempts", lambda r: r.get("attempts") or ""),
    Column("error", _last_error_line),
]
