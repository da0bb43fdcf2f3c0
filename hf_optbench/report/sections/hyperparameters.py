"""The hyperparameters section: where each run's learning rate, weight decay and clipping came from, the tuned values
of every parameter group, the tuning curves, the sensitivity to the learning rate and the tuned values as ratios to
the baseline's; and the note under the verdict (and in report.md) on whether every tuned optimum was bracketed.
The sources and the curves are read by :mod:`hf_optbench.report.tuning_curves` (the Runs table reads the sources
too); the tuning plots are drawn here.

Sensitivity as a result: how forgiving each optimizer is to its learning rate, read from the tuning runs.
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
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.report.plots import colors, plt_, save
from hf_optbench.report.tables import fmt_mean_sd
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


# ------------------------------------------------------------------------------------------------ the section
def bracketing_note(doc: Any, an: Analysis) -> None:
    """Under the verdict table and in report.md (``doc``: report.build.Doc): whether every tuned optimum was
    bracketed (the loss rises on both sides of it)."""
    from hf_optbench.report.tuning_curves import bracketed_optima
    from hf_optbench.study.tuning_phase import lost_tuning_points

    lost = lost_tuning_points(an.sweep_dir) if an.sweep_dir else []
    if lost:
        doc.p(f"**Warning: tuning points lost to failed runs: {'; '.join(lost)}.** Each counted as a rise of the "
              "loss, so these tuned values were chosen without them (missing_points in tuned_hparams.yaml).")
    found = {k: v for k, v in bracketed_optima(an.sweep_dir).items() if k[0] in an.optimizers} if an.sweep_dir else {}
    if not found:
        return
    edge = sorted(f"{o}/{s}" for (o, s), ok in found.items() if not ok)
    if edge:
        doc.p(f"**Warning: {len(edge)} tuned optimum(s) not bracketed: {', '.join(edge)}.** The best tuning point is "
              "still at an edge of the grid after the tuner's extensions (tuned_hparams.yaml), so these "
              "comparisons start from a rate that may not be the optimizer's best, and their verdicts may understate "
              "it.")
    else:
        doc.p(f"Every tuned optimum compared here is bracketed ({len(found)} optimizer x size pairs): the tuning "
              "loss rises on both sides of the chosen learning rate (and weight decay, the non-matrix group's rate and "
              "each ladder rung's rate, where tuned).")


def hyperparameters_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's hyperparameters section (``doc``: report.build.Doc): the sources, the tuned values, the tuning
    curves with their plots, the sensitivity and the tuned values as ratios to the baseline's."""
    from hf_optbench.report.tuning_curves import sources_cell, tuned_bracketing

    doc.h(2, "Hyperparameters: where each came from, and the tuning curves")
    seen: dict[tuple[str, str], set[str]] = {}
    for r in an.records:
        seen.setdefault((r.optimizer, r.cell.label), set()).add(sources_cell(r.summary.get("hyperparameter_sources")))
    doc.table(["optimizer", "size", "learning rate, weight decay, clipping from"],
              [[o, s, " / ".join(sorted(seen[(o, s)]))] for o in an.optimizers for s in an.sizes if (o, s) in seen])
    doc.p("cited: the optimizer registry's default for the size, with its citation (`hf-optbench optimizers`); tuned: "
          "the tuned_hparams_file that gave it; user: set in the recipe or on the command line. Per run: the Runs table.")
    tuned_values_section(doc, an)
    header, rows, key = tuning_table(an)
    if not rows:
        doc.p("No tuning runs (runs at learning-rate multipliers) in this sweep: pass a tuning sweep with "
              "`--tuning-dir` to show the tuning curves.")
        return
    doc.p(f"Tuning curves: {key.replace('_', ' ')} "
          + ("(the held-out tuning split, not the reported eval split)" if key == "final_tuning_loss" else
             "(the reported eval split: these runs have no final_tuning_loss, so selection and report share a split)")
          + " per learning rate, mean ± sd over seeds; best: the lowest mean among learning rates with no diverged or "
          "failed seed (the rule of `hf-optbench tune`).")
    doc.table(header, rows)
    for name in sorted(k for k in files if k.startswith("tuning_")):
        doc.img(files[name], name)
    doc.h(3, "Sensitivity: the learning-rate range within 1 % of the best tuning loss, and bracketing")
    sensitivity_section(doc, an.tuning, tuned_bracketing(an.sweep_dir))
    header, rows = tuned_ratio_table(an.ok(), BASELINE)
    if rows:
        doc.h(3, f"Tuned values as ratios to {BASELINE}'s, beside the published bands")
        doc.table(header, rows)


def tuning_table(an: Analysis) -> tuple[list[str], list[list[str]], str]:
    """(header, rows, loss key) of the tuning curve: one row per optimizer, size and multiplier."""
    from hf_optbench.report.tuning_curves import curve_frame

    frame, key = curve_frame(an.tuning)
    header = ["optimizer", "size", "lr multiplier", "learning rate", key.replace("_", " "), "completed seeds",
              "diverged/failed", "best"]
    if frame.empty:
        return header, [], key
    rows = [[r.optimizer, r.model_size, f"{r.lr_multiplier:g}", f"{r.learning_rate:.3g}",
             fmt_mean_sd(r.loss, r.loss_sd, int(r.seeds), "{:.4f}"), str(int(r.seeds)), str(int(r.bad)),
             "best" if r.best else ""] for r in frame.itertuples()]
    return header, rows, key


# ------------------------------------------------------------------------------------------------ figures
def plot_tuning(an: Analysis, size: str, path: Path) -> Path | None:
    """Final loss (mean over seeds, bar = sd) against learning rate (log x) per optimizer at one size; the best
    learning rate starred, the cited default (multiplier 1) ringed. None when the size has no tuning point."""
    from hf_optbench.report.tuning_curves import curve_frame

    frame, key = curve_frame([r for r in an.tuning if r.cell.label == size])
    if frame.empty or frame["loss"].notna().sum() == 0:
        return None
    plt = plt_()
    col = colors(sorted(frame["optimizer"].unique(), key=lambda o: (o != BASELINE, o)))
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for opt, part in frame.groupby("optimizer"):
        part = part.sort_values("learning_rate")
        ax.errorbar(part["learning_rate"], part["loss"], yerr=part["loss_sd"].fillna(0.0), fmt="o-", color=col[opt],
                    capsize=3, ms=4, lw=1, label=str(opt))
        best = part[part["best"]]
        ax.plot(best["learning_rate"], best["loss"], "*", color=col[opt], ms=14, mec="black", mew=0.6)
        default = part[part["lr_multiplier"] == 1.0]
        ax.plot(default["learning_rate"], default["loss"], "o", ms=13, mfc="none", mec=col[opt], mew=1.2)
        for row in part[part["bad"] > 0].itertuples():
            ax.annotate(f"{int(row.bad)} diverged/failed", (row.learning_rate, row.loss if row.loss == row.loss
                        else part["loss"].max()), fontsize=6, color=col[opt])
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (log)")
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"{size}: {key.replace('_', ' ')} vs learning rate (star = best, ring = cited default)", fontsize=9)
    return save(fig, path)
