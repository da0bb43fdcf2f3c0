"""Sensitivity as a result: how forgiving each optimizer is to its learning rate, read from the tuning runs.

Per optimizer and size, the width (a factor: "8x") of the learning-rate range whose tuning loss is within 1 % of the
best (a robustness figure users ask for and the published comparisons do not report). The range is the
contiguous run of grid points around the best whose mean loss is at most ``best + 1 % x |best|``; at each end the
crossing is interpolated linearly in log(learning rate) between the last point inside and the first outside. Where
the range reaches the end of the grid, or its neighbour diverged or failed (no loss to interpolate to), the true
crossing lies further out: the width is a lower bound and says so ("≥ 8x"). A wide range means a tuning error of
that factor costs under 1 % of loss; a narrow one, that the comparison depends on tuning it well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import Cell, RunRecord

# How forgiving an optimizer is: the width of the learning-rate range whose tuning loss is within 1 % of the best.
TOLERANCE = 0.01


@dataclass(frozen=True)
class Sensitivity:
    """The learning-rate range within ``TOLERANCE`` of the best loss: its ends and width as multipliers of the
    cited rate, and whether an end is only a bound (the grid ends, or the next point diverged)."""

    best: float
    low: float
    high: float
    low_bound: bool
    high_bound: bool

    @property
    def width(self) -> float:
        return self.high / self.low

    @property
    def at_least(self) -> bool:
        return self.low_bound or self.high_bound

    def text(self) -> str:
        return f"{'≥ ' if self.at_least else ''}{self.width:.3g}x"


def _edge(points: Sequence[tuple[float, float | None]], i: int, step: int, limit: float) -> tuple[float, bool]:
    """log(multiplier) where the loss crosses ``limit`` walking from point ``i`` by ``step``; True when it is a bound
    (the grid ended, or the next point has no loss)."""
    j = i
    while True:
        k = j + step
        if not 0 <= k < len(points) or points[k][1] is None:
            return math.log(points[j][0]), True
        loss_j, loss_k = points[j][1], points[k][1]
        assert loss_j is not None and loss_k is not None
        if loss_k <= limit:
            j = k
            continue
        t = (limit - loss_j) / (loss_k - loss_j)
        return math.log(points[j][0]) + t * (math.log(points[k][0]) - math.log(points[j][0])), False


def lr_sensitivity(curve: Mapping[float, float | None], tolerance: float = TOLERANCE) -> Sensitivity | None:
    """The range of ``curve`` ({lr multiplier: mean tuning loss, None where a seed diverged or failed}) within
    ``tolerance`` of the best (ties to x1); None when no point has a loss."""
    points = sorted((float(m), None if v is None or not math.isfinite(v) else float(v)) for m, v in curve.items())
    finite = [(m, v) for m, v in points if v is not None]
    if not finite:
        return None
    best, loss = min(finite, key=lambda p: (p[1], abs(math.log(p[0]))))
    limit = loss + tolerance * abs(loss)
    i = [m for m, _ in points].index(best)
    low, low_bound = _edge(points, i, -1, limit)
    high, high_bound = _edge(points, i, +1, limit)
    return Sensitivity(best, math.exp(low), math.exp(high), low_bound, high_bound)


def sensitivity_table(records: Sequence[Mapping[str, Any]], tuned: Mapping[tuple[str, str], bool] | None = None
                      ) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's sensitivity table: per optimizer and size of the tuning runs, the best
    learning-rate multiplier, the range within 1 % of its loss and its width, and whether the optimum is bracketed:
    as ``tuned`` says ({(optimizer, cell): bracketed}, what the sweep's tuned files record), else read from the runs
    (learning rate, and weight decay where it was tuned)."""
    from hf_optbench.report.tuning_curves import bracketed_from_records, loss_key, point_losses

    header = ["optimizer", "size", "best lr multiplier", "lr range within 1 % of the best",
              "width (how forgiving)", "optimum bracketed"]
    tuning = [r for r in records if r.get("lr_multiplier") is not None]
    if not tuning:
        return header, []
    bracketed = {**bracketed_from_records(tuning), **(tuned or {})}
    rows = []
    for (opt, size), points in sorted(point_losses(tuning).items()):
        s = lr_sensitivity({p.lr: v for p, v in points.items() if p.wd is None and p.nm is None and p.dx is None})
        if s is None:
            rows.append([opt, size, "–", "every point diverged or failed", "–", "no"])
            continue
        rng = f"{'≤ ' if s.low_bound else ''}x{s.low:.3g} – {'≥ ' if s.high_bound else ''}x{s.high:.3g}"
        rows.append([opt, size, f"x{s.best:g}", rng, s.text(),
                     "yes" if bracketed.get((opt, size)) else "**no**: the best is at an edge of the grid"])
    header[3] += f" ({loss_key(tuning).replace('_', ' ')})"
    return header, rows


def sensitivity_section(doc: Any, records: Sequence[Mapping[str, Any]],
                        tuned: Mapping[tuple[str, str], bool] | None = None) -> None:
    """The report's sensitivity table (:func:`sensitivity_table`) with the sentence that says how to read it
    (``doc``: report.Doc)."""
    header, rows = sensitivity_table(records, tuned)
    if not rows:
        doc.p("No tuning runs: no sensitivity figure.")
        return
    doc.p("How forgiving each optimizer is: the width of the learning-rate range whose tuning loss is within 1 % of "
          "the best (interpolated in log learning rate between grid points; ≥ where the range reaches the end of the "
          "grid or a diverged point, so the true width is larger). A wide range means a learning rate off by that "
          "factor costs under 1 % of loss. Bracketed: the best point has a worse (or diverged) point on both sides "
          "for the learning rate, and for the weight decay where it was tuned; **no** means the comparison ran at a "
          "value that is not known to be the optimum.")
    doc.table(header, rows)


# Published ratios to AdamW's tuned values: (learning rate, weight decay, source). Lion: "a learning rate 3-10x
# smaller than AdamW's" and "decoupled weight decay 3-10x larger" (Chen et al. 2023, arXiv:2302.06675, Sec. 5).
PUBLISHED_RATIOS = {"lion": ((1 / 10, 1 / 3), (3.0, 10.0), "Chen et al. 2023 (Lion), Sec. 5")}


def tuned_ratio_table(records: Sequence[Mapping[str, Any]], baseline: str = BASELINE
                      ) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per optimizer and size, the learning rate and weight decay its compared runs used, as ratios
    to the baseline's at the same size, beside the published band where one exists. ``records``: run records, or
    rows in their dict form."""
    header = ["optimizer", "size", "lr / baseline lr", "weight decay / baseline's", "published band (lr; wd)"]
    used: dict[tuple[str, str], tuple[float, float]] = {}
    for r in map(RunRecord.from_row, records):
        if r.get("learning_rate") is not None and r.get("weight_decay") is not None:
            used.setdefault((str(r.optimizer), r.cell.label),
                            (float(r["learning_rate"]), float(r["weight_decay"])))
    rows = []
    for (opt, size), (lr, wd) in sorted(used.items()):
        base = used.get((baseline, size))
        if opt == baseline or base is None:
            continue
        band = PUBLISHED_RATIOS.get(opt)
        cite = (f"{band[0][0]:.2g}-{band[0][1]:.2g}; {band[1][0]:g}-{band[1][1]:g} ({band[2]})" if band else "–")
        wd_ratio = f"{wd / base[1]:.3g}" if base[1] else "–"
        rows.append([opt, size, f"{lr / base[0]:.3g}", wd_ratio, cite])
    return header, rows


def _g(value: Any) -> str:
    """A margin or noise from the tuned file, to two significant digits ("not measured" for none)."""
    if value is None:
        return "not measured"
    try:
        return f"{float(value):.2g}"
    except (TypeError, ValueError):
        return str(value)


def _noise_text(entry: Mapping[str, Any], prefix: str, label: str) -> str:
    """"lr: margin 0.0024 vs noise 0.0036 over 3 seeds, within the noise" from a tuned entry's fields."""
    if f"{prefix}margin" not in entry:
        return ""
    seeds = len(entry.get(f"{prefix}seeds") or [])
    text = f"{label}: margin {_g(entry[f'{prefix}margin'])} vs noise {_g(entry.get(f'{prefix}noise'))}"
    text += f" over {seeds} seed(s)"
    return text + (", within the noise" if entry.get(f"{prefix}within_noise") else "")


def tuned_values_table(tuned: Mapping[str, Any], optimizers: Sequence[str], tpp: float | None = None
                       ) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's tuned-values table, from tuned_hparams.yaml (the file of data ratio ``tpp`` in a
    sweep with several: its rows name the cell): per optimizer and size, every tuned hyperparameter as a first-class
    value (the learning rate, the weight decay, the non-matrix group's rate) with its multiplier, whether it
    is bracketed, and the margin it won by against the seed noise it was judged by."""
    header = ["optimizer", "size", "learning rate (x cited)", "weight decay", "non-matrix group's rate (x the rate)",
              "ladder rungs tuned", "bracketed", "margin vs seed noise"]
    rows = []
    for opt in optimizers:
        for size, e in (tuned.get(opt) or {}).items():
            if not isinstance(e, dict) or "learning_rate" not in e:
                continue
            wd = (f"{float(e['weight_decay']):.3g} (x{float(e['wd_multiplier']):g}, tuned)" if "wd_multiplier" in e
                  else f"cited{'; not tuned: ' + e['wd_not_tuned'] if e.get('wd_not_tuned') else ''}")
            nm = (f"{float(e['nonmatrix_lr']):.3g} (x{float(e['nonmatrix_lr_ratio']):g}"
                  f"{'' if e.get('nonmatrix_bracketed', True) else ', not bracketed'})" if "nonmatrix_lr" in e
                  else "the learning rate (one rate" + ("; not tuned: " + e["nonmatrix_not_tuned"]
                                                        if e.get("nonmatrix_not_tuned") else "") + ")")
            rungs = e.get("ladder") or []
            rung_text = f"{sum(1 for r in rungs if r.get('bracketed'))}/{len(rungs)} bracketed" if rungs else "–"
            noise = "; ".join(t for t in (_noise_text(e, "lr_", "lr"), _noise_text(e, "wd_", "wd"),
                                          _noise_text(e, "nonmatrix_", "non-matrix")) if t) or "–"
            rows.append([opt, Cell(size, tpp).label, f"{float(e['learning_rate']):.3g} (x{float(e.get('multiplier', 1)):g})",
                         wd, nm,
                         rung_text, "yes" if e.get("bracketed", True) else "**no**", noise])
    return header, rows


def tuned_values_section(doc: Any, an: Any) -> None:
    """The tuned-values table (``doc``: report.build.Doc), from the sweep's tuned_hparams.yaml where it has one (every
    ratio's, in a sweep with several)."""
    from hf_optbench.study.tuning_phase import tuned_files
    from hf_optbench.yaml_file import read_yaml_or_empty

    rows: list[list[str]] = []
    for tpp, path in (tuned_files(an.sweep_dir) if an.sweep_dir is not None else {}).items():
        header, found = tuned_values_table(read_yaml_or_empty(path), an.optimizers, tpp)
        rows += found
    if not rows:
        return
    doc.h(3, "Tuned values, every parameter group alike")
    doc.table(header, rows)
    doc.p("From the tuned file (tuned_hparams.yaml; in a sweep over data ratios one per ratio, "
          "tuned_hparams__tpp<ratio>.yaml; its curves and grids are there): each hyperparameter tuned one at a time at the "
          "others' best (learning rate, then weight decay where the optimizer's cited value is not AdamW's, then the "
          "non-matrix group's rate: embeddings, head, LayerNorm gains and biases, for AdamW and Muon alike; Muon's "
          "learning rate is its matrices'), then each ladder rung's own rate. Margin: the tuning-loss gap from the "
          "choice to its nearest neighbour; noise: the seed-to-seed sd of the final tuning loss; where the margin was "
          "within the noise the choice was decided over more seeds, and \"within the noise\" says the neighbours "
          "stayed equivalent even then. Every compared run's summary.json records each value with its source.")
