"""The scaling plot (each optimizer's paired ratio to the baseline against parameters, with the verdict's own
intervals and no fitted line) and the tuning curves (final loss against learning rate per optimizer and size).

No trend line is drawn: a line fitted through points whose intervals include 1 reads as a trend the statistics do
not support. Each point is the mean paired ratio with the verdict's t interval; a filled marker is a difference
beyond the equivalence margin (ahead/behind), a hollow one is not; the shaded band is the margin itself.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import BASELINE, Analysis
from hf_optbench.report.plot_style import MARKERS, colors, eng_axis, plt_, save


def _panel(ax: Any, an: Analysis, key: str, label: str, col: dict[str, Any]) -> list[float]:
    """One metric's panel; returns the plotted ratios (for the axis scale)."""
    from hf_optbench.measure.verdict import METRICS, RATIO_MARGIN

    margin = next((m.margin for m in METRICS if m.key == key), RATIO_MARGIN)

    values: list[float] = []
    opts = [o for o in an.optimizers if o != BASELINE]
    for k, v in enumerate(v for o in opts for v in an.verdicts if v.optimizer == o and v.metric.key == key):
        offset = 1.0 + 0.05 * (k - (len(opts) - 1) / 2)
        c, marker = col[v.optimizer], MARKERS[k % len(MARKERS)]
        for i, p in enumerate(v.points):
            x, y = p.num_params * offset, p.ratio()
            values.append(y)
            if math.isfinite(p.ci_low) and math.isfinite(p.ci_high):
                lo, hi = p.interval()
                ax.plot([x, x], [lo, hi], color=c, lw=1.2)
                values += [lo, hi]
            ax.plot(x, y, marker, color=c, mfc=c if p.significant else "white", mew=1.3, ms=7,
                    label=f"{v.optimizer}: {v.verdict}" if i == 0 else None)
        if key == "optimizer_state_bytes":
            pts = [p for p in an.predicted if p["optimizer"] == v.optimizer]
            if pts:
                ax.scatter([p["num_params"] for p in pts], [p["ratio"] for p in pts], facecolors="none",
                           edgecolors=c, marker="s", s=30, label=f"{v.optimizer}: planner prediction")
                values += [p["ratio"] for p in pts]
    ax.axhspan(math.exp(-margin), math.exp(margin), color="0.85", zorder=0)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    eng_axis(ax.xaxis)
    if values and min(values) > 0 and max(values) / min(values) > 3:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")  # ratios spanning decades (factored state)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.5, 2 rather than 5x10^-1
    ax.set_xlabel("parameters")
    ax.set_ylabel(f"{label} / {BASELINE}")
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    return values


def plot_scaling(an: Analysis, path: Path) -> Path:
    """One panel per ratio metric of the memory and convergence questions (see the module doc)."""
    from hf_optbench.measure.verdict import ALPHA

    plt = plt_()
    col = colors(an.optimizers)
    keys = list(dict.fromkeys((v.metric.key, v.metric.label) for v in an.verdicts
                              if v.metric.mode == "ratio" and v.metric.question in ("memory", "convergence")))
    ncols = min(3, max(1, len(keys)))
    nrows = math.ceil(max(1, len(keys)) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, (key, label) in zip(axes.flat, keys, strict=False):  # spare axes are hidden
        _panel(ax, an, key, label, col)
    fig.suptitle(f"ratio to {BASELINE} vs model size: mean paired ratio, bar = the verdict's interval (Holm, {ALPHA:.0%} "
                 "over the table); "
                 "filled = beyond the margin (grey band: ±3 % for speedup, ±2 % otherwise), hollow = not; no fitted line")
    return save(fig, path)


def plot_tuning(an: Analysis, size: str, path: Path) -> Path | None:
    """Final loss (mean over seeds, bar = sd) against learning rate (log x) per optimizer at one size; the best
    learning rate starred, the cited default (multiplier 1) ringed. None when the size has no tuning point."""
    from hf_optbench.report.tuning_curves import curve_frame

    frame, key = curve_frame([r for r in an.tuning if r.get("model_size") == size])
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
