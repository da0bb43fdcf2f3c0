"""Rate transfer: what it costs to use the learning rate tuned at the next smaller size, or at the next
smaller data ratio, instead of a cell's own, read from the tuning curves the sweep already ran.

Why: "which hyperparameters affect convergence speed" is the practitioner's first question after "which optimizer",
and the answer decides whether a rate tuned small can be used large (muP's promise, Yang et al. 2022,
arXiv:2203.03466) or must be tuned again at every size and horizon. No published optimizer benchmark reports it.

The rule, per optimizer and cell (a size at a data ratio): the cell's own learning-rate curve (its tuned file's
``curve``: the mean tuning loss at each rate of its grid and extensions, the other axes at their cited values) is
read at the rate the next smaller size tuned at the same ratio (and the next smaller ratio at the same size), minus
the curve at the cell's own choice: the loss cost in nats on the tuning split. A rate on the grid is read as it
is; one between two grid points is interpolated linearly in log-rate (and said); one beyond the grid, or next to a
point that diverged or failed, is not measured (said); a grid point that diverged is a cost of "diverged".

As a speedup factor: the cost is added to the optimizer's mean final eval loss at the cell, and both losses are
read off the baseline's mean ladder there (``measure.speedup.speedup`` with the first as its reference): the factor
by which the borrowed rate would divide the optimizer's speedup (x0.9: a tenth less). The tuning split and the eval
split are drawn from the same source, so a cost on one is read as the same cost on the other (an approximation, said).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.measure.verdict import LOSS_MARGIN_NATS
from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import Cell

SIZE, RATIO = "size", "ratio"
REL_TOL = 1e-6  # two rates printed to 6 significant digits (the tuned file's) are the same rate


@dataclass(frozen=True)
class Cost:
    """The cost at one cell of a borrowed rate: ``nats`` (inf: the rate diverged there; None: not measured),
    ``how`` it was read ("on the grid", "interpolated", or why not), the ``factor`` off the ladder (None: not read)
    and whether that factor is only a bound (``bound``: "≥ ", "≤ " or "")."""

    source: str  # the cell whose tuned rate was borrowed
    rate: float
    nats: float | None
    how: str
    factor: float | None = None
    bound: str = ""

    def text(self) -> str:
        if self.nats is None:
            return f"{self.rate:.3g}: not measured ({self.how})"
        if math.isinf(self.nats):
            return f"{self.rate:.3g}: diverged on this cell's grid"
        factor = "" if self.factor is None else f", speedup x{self.bound}{self.factor:.3g}"
        how = "" if self.how == "on the grid" else f" ({self.how})"
        return f"{self.rate:.3g}: {self.nats:+.3g} nats{factor}{how}"


@dataclass(frozen=True)
class Row:
    optimizer: str
    cell: str
    own_rate: float
    costs: dict[str, Cost]  # SIZE / RATIO -> cost


def curve_loss(curve: Sequence[Mapping[str, Any]], rate: float) -> tuple[float | None, str]:
    """(the curve's tuning loss at ``rate``, how it was read): see the module doc."""
    points = sorted((float(p["learning_rate"]), p.get("tuning_loss")) for p in curve
                    if p.get("learning_rate") is not None)
    if not points:
        return None, "no curve"
    for r, loss in points:
        if math.isclose(r, rate, rel_tol=REL_TOL):
            return (math.inf if loss is None else float(loss)), "on the grid"
    if not points[0][0] < rate < points[-1][0]:
        return None, f"beyond the grid {points[0][0]:.3g}-{points[-1][0]:.3g}"
    (r0, l0), (r1, l1) = next((a, b) for a, b in zip(points, points[1:], strict=False) if a[0] < rate < b[0])
    if l0 is None or l1 is None:
        return None, "next to a rate that diverged"
    t = (math.log(rate) - math.log(r0)) / (math.log(r1) - math.log(r0))
    return float(l0) + t * (float(l1) - float(l0)), "interpolated in log-rate"


def _entries(an: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """{(optimizer, cell): its tuned entry}, every tuned file of the sweep read once."""
    from hf_optbench.study.tuning_phase import tuned_files
    from hf_optbench.yaml_file import read_yaml_or_empty

    out: dict[tuple[str, str], dict[str, Any]] = {}
    if an.sweep_dir is None:
        return out
    for tpp, path in tuned_files(Path(an.sweep_dir)).items():
        for opt, sizes in (read_yaml_or_empty(path) or {}).items():
            for size, entry in (sizes or {}).items() if isinstance(sizes, dict) else ():
                if isinstance(entry, dict) and entry.get("curve") and entry.get("learning_rate"):
                    out[(str(opt), Cell(size, tpp).label)] = entry
    return out


def _mean_ladder(an: Any, cell: str) -> Any:
    """The baseline's ladder at ``cell`` with each rung's final eval loss averaged over seeds (one curve)."""
    from hf_optbench.measure.speedup import fit_ladder
    from hf_optbench.study.budget import budget_tokens

    rungs: dict[float, list[float]] = {}
    for r in an.records + an.ladder:
        if r.optimizer == BASELINE and r.cell.label == cell and r.status == "completed" \
                and r.get("final_eval_loss") is not None and budget_tokens(r):
            rungs.setdefault(float(budget_tokens(r)), []).append(float(r["final_eval_loss"]))
    return fit_ladder(list(rungs), [statistics.fmean(v) for v in rungs.values()]) if len(rungs) >= 2 else None


def _factor(an: Any, optimizer: str, cell: str, nats: float, fits: dict[str, Any]) -> tuple[float | None, str]:
    """(the speedup factor of a loss cost of ``nats`` at ``cell``, its bound sign): module doc."""
    from hf_optbench.measure.speedup import speedup
    from hf_optbench.study.budget import budget_tokens

    if cell not in fits:
        fits[cell] = _mean_ladder(an, cell)
    fit = fits[cell]
    mine = [r for r in an.ok() if r.optimizer == optimizer and r.cell.label == cell
            and r.status == "completed" and r.get("final_eval_loss") is not None]
    if fit is None or not mine or not math.isfinite(nats):
        return None, ""
    loss = statistics.fmean(float(r["final_eval_loss"]) for r in mine)
    if not fit.loss_at(fit.tokens[-1]) <= loss <= fit.loss_at(fit.tokens[0]):
        return None, ""  # the optimizer's own loss lies beyond the ladder: no ratio of two readings
    s = speedup(fit, loss + nats, float(budget_tokens(mine[0]) or 1.0), reference_loss=loss)
    return s.value, {"above": "≥ ", "below": "≤ ", None: ""}[s.censored]


def transfer_rows(an: Any) -> list[Row]:
    """Every optimizer x cell with a tuned curve and a smaller neighbour (size or ratio) with a tuned rate."""
    entries = _entries(an)
    fits: dict[str, Any] = {}
    rows = []
    for opt in an.optimizers:
        for cell in an.sizes:
            own = entries.get((opt, cell))
            if own is None:
                continue
            size, tpp = an.cell_size.get(cell, cell), an.cell_tpp.get(cell)
            i, sizes = an.model_sizes.index(size) if size in an.model_sizes else 0, an.model_sizes
            j = an.ratios.index(tpp) if tpp in an.ratios else 0
            sources = {SIZE: Cell(sizes[i - 1], tpp).label if i > 0 else None,
                       RATIO: Cell(size, an.ratios[j - 1]).label if j > 0 else None}
            own_loss, _ = curve_loss(own["curve"], float(own["learning_rate"]))
            costs = {}
            for axis, source in sources.items():
                theirs = entries.get((opt, source)) if source else None
                if theirs is None or own_loss is None or not math.isfinite(own_loss):
                    continue
                rate = float(theirs["learning_rate"])
                loss, how = curve_loss(own["curve"], rate)
                nats = None if loss is None else loss - own_loss
                factor, bound = _factor(an, opt, cell, nats, fits) if nats is not None else (None, "")
                costs[axis] = Cost(source, rate, nats, how, factor, bound)
            if costs:
                rows.append(Row(opt, cell, float(own["learning_rate"]), costs))
    return rows


def transfer_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    header = ["optimizer", "cell", "own tuned rate", "next smaller size's rate: cost",
              "next smaller ratio's rate: cost"]
    return header, [[r.optimizer, r.cell, f"{r.own_rate:.3g}", *[r.costs[a].text() if a in r.costs else "–"
                                                                  for a in (SIZE, RATIO)]] for r in rows]


def _summary(costs: Sequence[Cost], across: str) -> str | None:
    """"transfers across sizes within 0.004 nats", "costs up to 0.05 nats across sizes (speedup x0.8)", "diverges
    at 1 of 3 cells across sizes"; None when nothing was measured."""
    measured = [c for c in costs if c.nats is not None]
    if not measured:
        return None
    diverged = sum(1 for c in measured if math.isinf(c.nats))
    if diverged:
        return f"diverges at {diverged} of {len(measured)} cell(s) across {across}"
    worst = max(measured, key=lambda c: (c.nats, -(c.factor or 1.0)))  # the costliest, then the largest loss of speedup
    if worst.nats <= LOSS_MARGIN_NATS:
        return f"transfers across {across} within {max(worst.nats, 0.0):.2g} nats"
    factor = "" if worst.factor is None else f" (speedup x{worst.bound}{worst.factor:.2g} at {worst.source}'s rate)"
    return f"costs up to {worst.nats:.2g} nats across {across}{factor}"


def transfer_line(rows: Sequence[Row]) -> str:
    """The short report's line: per optimizer, the worst cost of a borrowed rate across sizes and across ratios."""
    parts = []
    for opt in dict.fromkeys(r.optimizer for r in rows):
        said = [s for axis, across in ((SIZE, "sizes"), (RATIO, "data ratios"))
                if (s := _summary([r.costs[axis] for r in rows if r.optimizer == opt and axis in r.costs], across))]
        if said:
            parts.append(f"{opt}'s rate " + " and ".join(said))
    if not parts:
        return ("Rate transfer: not measured (it needs tuned curves at two sizes or two data ratios of one "
                "optimizer).")
    return (f"Rate transfer (the learning rate tuned at the next smaller size or data ratio, read on each cell's "
            f"tuning curve; within {LOSS_MARGIN_NATS:g} nats is inside the loss margin): " + "; ".join(parts) + ".")


def plot_transfer(rows: Sequence[Row], path: Path) -> Path | None:
    """rate_transfer.png: the cost in nats per cell, one panel per borrowed rate (smaller size, smaller ratio), one
    marker per optimizer (set apart sideways, so equal costs stay visible); a rate that diverged is drawn at the top
    of its panel, one not measured is left out."""
    from hf_optbench.report.plots import MARKERS, colors, plt_, save

    axes_used = [a for a in (SIZE, RATIO) if any(a in r.costs and r.costs[a].nats is not None for r in rows)]
    if not axes_used:
        return None
    plt = plt_()
    fig, axes = plt.subplots(1, len(axes_used), figsize=(6 * len(axes_used), 4.2), squeeze=False)
    col = colors(list(dict.fromkeys(r.optimizer for r in rows)))
    finite = [c.nats for r in rows for c in r.costs.values() if c.nats is not None and math.isfinite(c.nats)]
    top = max([*finite, LOSS_MARGIN_NATS]) * 1.2
    diverged = any(c.nats is not None and math.isinf(c.nats) for r in rows for c in r.costs.values())
    for ax, axis in zip(axes[0], axes_used, strict=True):
        cells = list(dict.fromkeys(r.cell for r in rows if axis in r.costs))
        for k, opt in enumerate(col):
            dodge = 0.1 * (k - (len(col) - 1) / 2)
            pts = [(cells.index(r.cell) + dodge, r.costs[axis].nats) for r in rows
                   if r.optimizer == opt and axis in r.costs and r.costs[axis].nats is not None]
            ax.scatter([x for x, _ in pts], [top if math.isinf(y) else y for _, y in pts], color=col[opt],
                       marker=MARKERS[k % len(MARKERS)], label=opt)
        ax.axhline(LOSS_MARGIN_NATS, color="grey", lw=0.8, ls="--", label=f"loss margin ({LOSS_MARGIN_NATS:g} nats)")
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_ylim(min([0.0, *finite]) - 0.05 * top, top * 1.08)
        ax.set_xticks(range(len(cells)), cells, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("tuning-loss cost (nats)" + ("; at the top: diverged" if diverged else ""))
        ax.set_title(f"the next smaller {'size' if axis == SIZE else 'data ratio'}'s tuned rate", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, 0.92))
    fig.suptitle("Cost of a borrowed learning rate, read on each cell's tuning curve")
    return save(fig, path, rect=(0, 0, 1, 0.86))


def transfer_section(doc: Any, rows: Sequence[Row], files: Mapping[str, Path]) -> None:
    """The evidence file's "Rate transfer" section (``doc``: report.build.Doc)."""
    doc.h(2, "Rate transfer: the cost of a learning rate tuned at a smaller size or data ratio")
    if not rows:
        doc.p("Not measured: it needs tuned learning-rate curves (tuned_hparams.yaml `curve`) at two sizes or two data "
              "ratios of one optimizer.")
        return
    doc.p("Per optimizer and cell: the cell's own tuned learning rate, and the tuning-loss cost on the cell's own "
          "learning-rate curve (the other axes at their cited values) of the rate tuned at the next smaller size (same "
          "data ratio) or at the next smaller data ratio (same size): read on the grid, interpolated in log-rate "
          "between two grid points (said), or not measured beyond the grid. The speedup factor adds the cost to the "
          "optimizer's mean final eval loss and reads both off the baseline's mean ladder at the cell (x0.9: a tenth "
          "of the speedup lost; the tuning and eval splits come from one source). hf_optbench/report/sections/rate_transfer.py.")
    doc.table(*transfer_table(rows), keep=2)
    doc.p(transfer_line(rows))
    if files.get("rate_transfer.png"):
        doc.img(files["rate_transfer.png"], "cost of a borrowed learning rate")
