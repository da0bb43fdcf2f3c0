"""The ratios section: each optimizer's paired ratio to the baseline per size (per cell, in a sweep over data ratios)
on every ratio metric (memory, tokens and time to target, the speedup), each cell the point of the verdict that
judges it, then the memory planner's predicted optimizer-state ratio at the GPT-2 sizes not run; the legend, written
from the margins and levels the cells were computed at, and the scaling plots.

The scaling plot shows each optimizer's paired ratio to the baseline against parameters, with the verdict's own
intervals and no fitted line: a line through points whose intervals include 1 reads as a trend the statistics do
not support. A filled marker is a difference beyond the equivalence margin (ahead/behind), a hollow one is not; the
shaded band is the margin itself. A sweep over several data ratios gets one scaling plot per ratio every size ran.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.measure.verdict import METRICS
from hf_optbench.report.analysis import Analysis, group
from hf_optbench.report.legends import confidence_range, margins_text
from hf_optbench.report.plots import (
    MARKERS,
    TREND_KEY,
    colors,
    fill_key,
    param_axis,
    plt_,
    point_style,
    readable,
    save,
    verdict_label,
)
from hf_optbench.report.tables import Cell, Column, fmt_num, ratio_cell, render
from hf_optbench.rundir import BASELINE


def ratios_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's ratio section (``doc``: report.build.Doc): the table, its legend and the scaling plots; nothing
    without a verdict."""
    if not an.verdicts:
        return
    doc.h(2, f"Ratios to {BASELINE} per model size" + (" and data ratio" if an.multi else ""))
    doc.table(*render(ratio_columns(), ratio_rows(an)), keep=2)
    doc.p(ratio_legend(an))
    for name in (n for n in files if n.startswith("scaling")):
        doc.img(files[name], name.removesuffix(".png"))


@dataclass(frozen=True)
class RatioRow:
    """A row of the ratio table: measured at a size the sweep ran, or predicted by the memory planner."""

    optimizer: str
    size: str
    params: str
    source: str
    ratios: dict[str, str]  # metric key -> cell


def _ratio_wall_note(an: Analysis, opt: str, size: str) -> str:
    from hf_optbench.report.noise import by_seed, wallclock_note

    note = wallclock_note(by_seed(an.ok(), "seconds_to_target", opt, size),
                          by_seed(an.ok(), "seconds_to_target", BASELINE, size))
    return f" {note}" if note else ""


def ratio_rows(an: Analysis) -> list[RatioRow]:
    """Each non-baseline optimizer's ratio to the baseline per size (cell) run, then its planner-predicted rows;
    each cell is the point of the verdict that judges it (:meth:`Analysis.point`)."""
    from hf_optbench.report.noise import WALL_CLOCK_KEYS

    rows = []
    for opt in (o for o in an.optimizers if o != BASELINE):
        for size in an.sizes:
            ratios, pairs = {}, 0
            for s in (s for s in METRICS if s.mode == "ratio"):
                p = an.point(opt, s.key, size)[1]
                ratios[s.key] = ratio_cell(p) + (_ratio_wall_note(an, opt, size) if s.key in WALL_CLOCK_KEYS else "")
                pairs = max(pairs, p.n_pairs if p else 0)
            ratios["pairs"] = str(pairs)
            n = group(an.records, "num_params", opt, size)
            rows.append(RatioRow(opt, size, fmt_num(n["mean"] if n else None, "{:,.0f}"), "measured", ratios))
        rows += [RatioRow(opt, p["model_size"], f"{p['num_params']:,}", "predicted (planner)",
                          {"optimizer_state_bytes": f"{p['ratio']:.3f}"})  # the planner predicts state only
                 for p in an.predicted if p["optimizer"] == opt]
    return rows


def ratio_columns() -> list[Column]:
    def cell(key: str) -> Cell:
        return lambda row: row.ratios.get(key, "–")

    return [Column("optimizer", lambda r: r.optimizer), Column("size", lambda r: r.size),
            Column("parameters", lambda r: r.params), Column("source", lambda r: r.source),
            Column("paired seeds", cell("pairs"))] \
        + [Column(s.label, cell(s.key)) for s in METRICS if s.mode == "ratio"]


def ratio_legend(an: Any) -> str:
    """The paragraph under the ratio table: each column's margin and the intervals' confidence, as computed."""
    ratio_specs = [s for s in METRICS if s.mode == "ratio"]
    points = [an.point(o, s.key, c)[1] for o in an.optimizers if o != BASELINE for s in ratio_specs for c in an.sizes]
    conf = confidence_range(points)
    return (f"Cells: mean paired ratio to {BASELINE} [its interval: two-sided, at half the level Holm's procedure gave "
            f"the verdict cell that judges it{f', {conf} here' if conf else ''}; each cell's in the Evidence table] and "
            "the stance (ahead / behind: the whole interval beyond the column's margin; level: inside it; no "
            f"difference: neither). Margins: {margins_text(ratio_specs)}. Bounds: pairs where a run never reached "
            "the target (counted at its budget) or a speedup lies beyond the ladder, estimated by the censored-normal "
            "likelihood, never averaged. A wall-clock figure whose per-seed ratios spread wider than its effect is "
            "marked not interpretable: the machine's load, not the optimizer, moved it. Predicted rows: the memory "
            "planner's optimizer-state ratio at GPT-2 sizes not run (`hf-optbench memory`), with GPT-2's 50,304-row "
            "embedding and 1,024 positions; the 8-bit optimizers as configured in this sweep (embedding state 32-bit "
            "or not).")


# ------------------------------------------------------------------------------------------------ figures
def _panel(ax: Any, an: Analysis, key: str, label: str, col: dict[str, Any], verdicts: Sequence[Any]) -> None:
    """One ratio metric's panel of the scaling plot (it has at least one point: see :func:`_scaling_keys`)."""
    from matplotlib.ticker import FuncFormatter

    from hf_optbench.measure.verdict import METRICS, RATIO_MARGIN

    margin = next((m.margin for m in METRICS if m.key == key), RATIO_MARGIN)
    values: list[float] = []
    counts: list[float] = []
    opts = [o for o in an.optimizers if o != BASELINE]
    for k, v in enumerate(v for o in opts for v in verdicts if v.optimizer == o and v.metric.key == key):
        offset = 1.0 + 0.05 * (k - (len(opts) - 1) / 2)
        c, marker = col[v.optimizer], MARKERS[k % len(MARKERS)]
        for p in v.points:
            x, y = p.num_params * offset, p.ratio()
            counts.append(p.num_params)
            values.append(y)
            if math.isfinite(p.ci_low) and math.isfinite(p.ci_high):
                lo, hi = p.interval()
                ax.plot([x, x], [lo, hi], color=c, lw=1.2)
                values += [lo, hi]
            ax.plot(x, y, marker, **point_style(p, c))
        ax.plot([], [], marker, color=c, mfc="none", mew=1.3, ms=7, ls="none", label=verdict_label(v.optimizer, v))
        pts = [p for p in an.predicted if p["optimizer"] == v.optimizer] if key == "optimizer_state_bytes" else []
        if pts:
            ax.scatter([p["num_params"] for p in pts], [p["ratio"] for p in pts], facecolors="none",
                       edgecolors=c, marker="s", s=30, label=f"{v.optimizer}: planner prediction")
            values += [p["ratio"] for p in pts]
            counts += [p["num_params"] for p in pts]
    ax.axhspan(math.exp(-margin), math.exp(margin), color="0.85", zorder=0)
    ax.axhline(1.0, color="grey", lw=0.8)
    param_axis(ax, counts)
    if values and min(values) > 0 and max(values) / min(values) > 3:
        ax.set_yscale("log")  # ratios spanning decades (factored state)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: readable(v)))  # 0.5, 2 rather than 5x10^-1
    ax.set_ylabel(f"{label} / {BASELINE}")
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        fill_key(ax, any(p.transient for v in verdicts for p in v.points))
        ax.legend(fontsize=6, title=TREND_KEY, title_fontsize=6)


def _scaling_keys(an: Analysis, verdicts: Sequence[Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """(key, label) of the ratio metrics of the memory and convergence questions that have a point to draw, and
    the labels of those that have none (too few paired seeds, no target)."""
    keys = list(dict.fromkeys((v.metric.key, v.metric.label) for v in verdicts
                              if v.metric.mode == "ratio" and v.metric.question in ("memory", "convergence")))
    drawn = {v.metric.key for v in verdicts if v.points}
    drawn |= {"optimizer_state_bytes"} if an.predicted else set()
    return [k for k in keys if k[0] in drawn], [label for key, label in keys if key not in drawn]


def plot_scaling(an: Analysis, path: Path, at: str = "") -> Path | None:
    """One panel per ratio metric with a point to draw (see the module doc), of the size-axis verdicts at data ratio
    ``at`` ("" for a single-ratio sweep); None when none has one."""
    verdicts = an.verdicts_along("size", at)
    keys, empty = _scaling_keys(an, verdicts)
    if not keys:
        return None
    plt = plt_()
    col = colors(an.optimizers)
    ncols = 2 if len(keys) == 4 else min(3, len(keys))  # 2 x 2 rather than 3 + 1
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows + 0.4), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, (key, label) in zip(axes.flat, keys, strict=False):  # spare axes are hidden
        _panel(ax, an, key, label, col, verdicts)
    # the level each bar was computed at (Holm's level of its verdict cell), not a fixed one: the caption names it
    drawn = confidence_range(p for v in verdicts for p in v.points) or "n/a"
    title = (f"ratio to {BASELINE} vs model size{f' at {at}' if at else ''}: mean paired ratio, bar = its paired "
             f"interval at the level Holm's procedure gave its verdict cell ({drawn} confidence); filled = beyond the "
             "margin (grey band), hollow = not; no fitted line")
    if empty:
        title += f" (no panel for {', '.join(empty)}: no size has the paired seeds or target it needs, see the report)"
    fig.suptitle(textwrap.fill(title, width=int(13 * 5.2 * ncols)), fontsize=10)  # wrapped to the figure: not clipped
    return save(fig, path)


def scaling_name(an: Analysis, at: str) -> str:
    """The scaling plot's file: "scaling.png", or "scaling__tpp0.5.png" for the size axis at one data ratio."""
    from hf_optbench.measure.verdict import ratio_label

    tpp = next((r for r in an.ratios if ratio_label(r) == at), None)
    return "scaling.png" if tpp is None else f"scaling__tpp{tpp:g}.png"
