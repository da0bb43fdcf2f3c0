"""Every figure of the report (matplotlib, Agg backend: no display needed), one PNG each, drawn to be read, not
decoded: every seed is its own thin line, a parameter axis is ticked at the model sizes that were run and labelled
as parameter counts (110k, 1.5M, 124M, 1.5B), token axes read 150k / 2.7M, memory is on a log axis so a 0.01 MiB
optimizer state shows beside a 600 MiB peak, a panel where every value is 0 says so, and a question without a
single point gets no panel (the figure names it in one line instead of drawing empty axes).

The scaling plot shows each optimizer's paired ratio to the baseline against parameters, with the verdict's own
intervals and no fitted line: a line through points whose intervals include 1 reads as a trend the statistics do
not support. A filled marker is a difference beyond the equivalence margin (ahead/behind), a hollow one is not; the
shaded band is the margin itself. A sweep over several data ratios gets one scaling plot per ratio every size ran
and the data-axis plot: each optimizer's speedup against tokens per parameter, one line per size (the line only
joins a size's points; the legend gives the verdict along data), ticked at the ratios run.

:func:`write_plots` writes all of them and returns their paths by file name, the names the report embeds.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis, group, window
from hf_optbench.report.legends import confidence_range
from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import RunRecord, cells_of

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_readable = "{:g}".format  # 0.002, 0.5, 2: a tick label as written, not 5x10^-1
EMPTY_TEXT = {"loss_spikes_per_1k": "no loss spikes in any run", "diverged": "no run diverged"}


# ------------------------------------------------------------------------------------------------------- style
FILLED, HOLLOW, FADED = "filled: beyond the margin", "hollow: not beyond it", "faded: transient, out of the trend"


def fill_key(ax: Any, transient: bool = False) -> None:
    """Legend entries that say what a marker's fill means, drawn as the points are drawn: a series' own entry is an
    outline (its colour and shape), so the legend never shows a fill that some of its points do not have."""
    ax.plot([], [], "o", color="0.35", mfc="0.35", mew=1.3, ms=6, ls="none", label=FILLED)
    ax.plot([], [], "o", color="0.35", mfc="white", mew=1.3, ms=6, ls="none", label=HOLLOW)
    if transient:
        ax.plot([], [], "o", color="0.35", mfc="white", mew=1.3, ms=6, ls="none", alpha=0.35, label=FADED)


def point_style(p: Any, c: Any) -> dict[str, Any]:
    """How a verdict point is drawn: filled where beyond the margin (ahead or behind), hollow where not, faded where
    the cell is transient (shown, left out of the trend)."""
    return {"color": c, "mfc": c if p.significant else "white", "mew": 1.3, "ms": 7,
            "alpha": 0.35 if p.transient else 1.0}


TREND_KEY = "trend ln/decade, +: advantage grows"


def verdict_label(name: str, v: Any) -> str:
    """A series' legend text: its verdict and its advantage trend per decade (the legend's title,
    :data:`TREND_KEY`, states the orientation)."""
    a, ci = v.advantage_trend, v.advantage_ci
    trend = f"; trend {a:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if a is not None and ci is not None else ""
    return f"{name}: {v.word}{trend}"


def plt_() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors(optimizers: Sequence[str]) -> dict[str, Any]:
    cmap = plt_().get_cmap("tab10")
    return {o: cmap(i % 10) for i, o in enumerate(optimizers)}


def eng_axis(axis: Any) -> None:
    """Tick labels like 150k, 1.5M (EngFormatter) instead of 150000 colliding with its neighbour."""
    from matplotlib.ticker import EngFormatter

    axis.set_major_formatter(EngFormatter(sep=""))


def param_label(n: float) -> str:
    """A parameter count as people write it: 25k, 227k, 1.54M, 124M, 1.56B (three significant digits)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def param_axis(ax: Any, counts: Iterable[float]) -> None:
    """A log x axis ticked at the parameter counts plotted (the model sizes run), labelled as counts, no minor
    labels. Why not matplotlib's log ticks: between two sizes 7x apart they label every minor tick (500k600k700k
    running together), and an axis with nothing plotted reads 900m ... 10 as if it held parameters."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = sorted({float(c) for c in counts if c and c > 0})
    span = math.log10(ticks[-1] / ticks[0]) if ticks else 0.0
    kept: list[float] = []
    for t in ticks:  # a label needs about a tenth of the axis: sizes closer than that share the first one's
        if not kept or math.log10(t / kept[-1]) >= 0.12 * span:
            kept.append(t)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(kept))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: param_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) == 1:  # one size: a decade around it, not matplotlib's default of 10^-1 ... 10^1 times nothing
        ax.set_xlim(ticks[0] / 3, ticks[0] * 3)
    else:
        ax.margins(x=0.08)
    ax.set_xlabel("parameters (the sizes run)")


def minor_labels(axis: Any) -> None:
    """Label a log axis's minor ticks when it spans few decades, where it would show one or two labels: all of
    them under ~1.5 decades, the 2s and 5s under ~3 (more would collide). Call after plotting, when the limits are
    known. Axes with fixed ticks (param_axis) are left as they are."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    low, high = axis.get_view_interval()
    if axis.get_scale() != "log" or low <= 0 or isinstance(axis.get_major_locator(), FixedLocator):
        return
    decades = math.log10(high / low)

    def two_and_five(v: float, _: Any) -> str:
        return _readable(v) if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in (2, 5) else ""

    if decades < 1.5:
        axis.set_minor_formatter(FuncFormatter(lambda v, _: _readable(v)))
    elif decades < 3:
        axis.set_minor_formatter(FuncFormatter(two_and_five))
    else:
        axis.set_minor_formatter(NullFormatter())
        return
    axis.set_major_formatter(FuncFormatter(lambda v, _: _readable(v)))  # one style: 0.002 beside 0.001


def save(fig: Any, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    for ax in fig.axes:
        minor_labels(ax.xaxis)
        minor_labels(ax.yaxis)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt_().close(fig)
    return path


# ---------------------------------------------------------------------------------------------- per size
def _runs(an: Analysis, opt: str, size: str, by_size: bool = False) -> list[RunRecord]:
    """The finished runs of ``opt`` at cell ``size`` (with ``by_size``: at model size ``size``, every ratio)."""
    return [r for r in an.ok() if r.optimizer == opt and (r.model_size if by_size else r.cell.label) == size]


def _xy(rows: Sequence[Mapping[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r[x_key]), float(r[y_key])) for r in rows if r.get(x_key) is not None and r.get(y_key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smoothed(xs: Sequence[float], ys: Sequence[float], n: int) -> tuple[list[float], list[float]]:
    """Trailing mean of ``n`` (the recorder's target rule), cut at the first NaN/Inf (a divergence)."""
    import pandas as pd

    end = next((i for i, y in enumerate(ys) if not math.isfinite(y)), len(ys))
    return list(xs[:end]), pd.Series(ys[:end], dtype="float64").rolling(n, min_periods=1).mean().tolist()


def _label_targets(ax, targets: list) -> None:
    """Name each target line at the right edge, above it; a label whose line sits closer than 4 % of the axis to the
    next line up goes below its line instead (the 75 % and 100 % targets of a run past the transient are often a few
    hundredths of a nat apart, and two labels above their lines printed over each other)."""
    lo, hi = ax.get_ylim()
    gap = 0.04 * (hi - lo)
    losses = sorted(t.loss for t in targets)
    for t in targets:
        above = [x for x in losses if x > t.loss]
        crowded = bool(above) and min(above) - t.loss < gap
        ax.annotate(t.name, (1.0, t.loss), xycoords=("axes fraction", "data"), fontsize=7, color="grey",
                    ha="right", va="top" if crowded else "bottom")


def plot_loss(an: Analysis, size: str, path: Path) -> Path:
    """Train loss (trailing mean, one thin line per seed) and eval loss (markers per seed) of one size against
    steps, tokens and train seconds, with the size's targets: an optimizer can win per step and lose per second."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), sharey=True)
    tops, lows = [], []
    for ax, (x_key, label) in zip(axes, (("step", "optimizer steps"), ("tokens", "tokens"),
                                         ("elapsed_s", "train seconds (wall clock)")), strict=True):
        for opt in an.optimizers:
            for i, r in enumerate(_runs(an, opt, size)):
                m = an.metrics.get(r.run_id, {})
                xs, ys = _smoothed(*_xy(m.get("train", []), x_key, "loss"), window(r))
                ax.plot(xs, ys, color=col[opt], lw=0.8, alpha=0.8, label=opt if i == 0 else None)
                if ys:
                    tops.append(ys[len(ys) // 10])
                    lows.append(min(ys))
                if r.status == "diverged" and ys:
                    ax.plot(xs[-1], ys[-1], "x", color=col[opt], ms=9, mew=2, label=f"{opt} diverged")
                ex, ey = _xy(m.get("eval", []), x_key, "eval_loss")
                ax.plot(ex, ey, "o", color=col[opt], ms=3.5, mfc="none", mew=0.8)
        for t in an.targets.get(size, []):
            ax.axhline(t.loss, color="grey", ls=":", lw=0.9)
        ax.set_xlabel(label)
        if x_key == "tokens":
            eng_axis(ax.xaxis)
        ax.grid(alpha=0.3)
    if tops and lows:
        span = max(tops) - min(lows)
        axes[0].set_ylim(min(lows) - 0.05 * span, max(tops) + 0.05 * span)
    for ax in axes:
        _label_targets(ax, an.targets.get(size, []))
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{size}: train loss (trailing mean, one line per seed), eval loss (circles), targets (dotted); "
                 "y axis starts after the first 10 % of steps")
    return save(fig, path)


def plot_lr_gradnorm(an: Analysis, size: str, path: Path) -> Path:
    """Learning rate and pre-clip gradient norm of one size against steps, one thin line per seed."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key in zip(axes, ("lr", "grad_norm"), strict=True):
        for opt in an.optimizers:
            for i, r in enumerate(_runs(an, opt, size)):
                xs, ys = _xy(an.metrics.get(r.run_id, {}).get("train", []), "step", key)
                ax.plot(xs, ys, color=col[opt], lw=0.7, alpha=0.8, label=opt if i == 0 else None)
        ax.set_xlabel("optimizer steps")
        ax.set_ylabel("learning rate" if key == "lr" else "gradient norm (pre-clip)")
        if key == "grad_norm":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{size}: learning rate and gradient norm (one line per seed)")
    return save(fig, path)


def plot_memory(an: Analysis, path: Path) -> Path:
    """Per size, two panels: what the model and its optimizer hold (parameters, gradients, optimizer state: side-by-
    side bars per optimizer on a log axis, where a factored state of ~1e-4 of the parameters still shows) and the
    peak the process reached, on its own axis (on a CPU it is mostly the runtime: hundreds of MiB beside a state of
    kilobytes on one axis would read as nothing). The legend is the figure's, under the title."""
    plt = plt_()
    sizes = an.model_sizes  # a model's memory is the same at every data ratio: one column per size
    fig, axes = plt.subplots(2, len(sizes), figsize=(max(6.4, 4.6 * len(sizes)), 7.4), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    parts = (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_state_bytes", "optimizer state"))
    width = 0.8 / len(parts)
    kinds = {r.get("peak_memory_kind") for r in an.ok() if r.get("peak_memory_kind")}
    for col, size in enumerate(sizes):
        ax, peak_ax = axes[0][col], axes[1][col]
        for j, (key, label) in enumerate(parts):
            xs, vals = [], []
            for i, o in enumerate(an.optimizers):
                v = (group(an.records, key, o, size, by_size=True) or {}).get("mean")
                if v:  # 0 (a stateless optimizer) has no place on a log axis: the memory table shows it
                    xs.append(i - 0.4 + width * (j + 0.5))
                    vals.append(v / 2**20)
            bars = ax.bar(xs, vals, width=width, label=label, color=f"C{j}")
            ax.bar_label(bars, labels=[f"{v:.3g}" for v in vals], fontsize=6, rotation=90, padding=2)
        ax.set_yscale("log")
        ax.margins(y=0.3)
        ax.set_xticks(range(len(an.optimizers)), [])
        ax.set_title(size)
        ax.set_ylabel("MiB (log)")
        ax.grid(axis="y", alpha=0.3, which="both")
        peaks = [(group(an.records, "peak_memory_bytes", o, size, by_size=True) or {}).get("mean")
                 for o in an.optimizers]
        xs = [i for i, v in enumerate(peaks) if v]
        bars = peak_ax.bar(xs, [peaks[i] / 2**20 for i in xs], width=0.5, color="C3")
        peak_ax.bar_label(bars, labels=[f"{peaks[i] / 2**20:.4g}" for i in xs], fontsize=7, padding=2)
        peak_ax.margins(y=0.25)
        peak_ax.set_xticks(range(len(an.optimizers)), an.optimizers, rotation=30, fontsize=8)
        peak_ax.set_ylabel(f"peak MiB ({', '.join(sorted(kinds)) or 'n/a'})", fontsize=8)
        peak_ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=len(parts), fontsize=8,
               bbox_to_anchor=(0.5, 0.925), frameon=False)
    title = ("memory per optimizer and size, mean over seeds: what the model and the optimizer hold (top, log axis) "
             "and the process's peak (bottom, its own axis)")
    fig.suptitle(textwrap.fill(title, width=int(11 * max(6.4, 4.6 * len(sizes)))), fontsize=10)
    return save(fig, path, rect=(0, 0, 1, 0.92))


# ------------------------------------------------------------------------------------------- against size
def plot_by_params(an: Analysis, panels: Sequence[tuple[str, str]], title: str, path: Path,
                   log_y: bool = False, dodge: bool = False) -> Path:
    """One panel per (key, label): every seed as a dot and the seeds' mean as a line, against parameters; each
    optimizer with its own marker and, with ``dodge``, a small sideways offset, so equal values (all 0) do not
    hide each other (only for counts: on a sloped curve an offset would read as a difference)."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        values, counts = [], []
        for k, opt in enumerate(an.optimizers):
            offset = 1.0 + 0.04 * (k - (len(an.optimizers) - 1) / 2) if dodge else 1.0
            xs, means = [], []
            for size in an.model_sizes:  # every data ratio's runs of a size pooled: step time does not depend on it
                runs = [r for r in _runs(an, opt, size, by_size=True) if r.get(key) is not None and r.get("num_params")]
                if not runs:
                    continue
                counts.append(float(runs[0]["num_params"]))
                x = counts[-1] * offset
                ys = [float(r[key]) for r in runs]
                values += ys
                ax.scatter([x] * len(ys), ys, color=col[opt], marker=MARKERS[k % len(MARKERS)], s=14, alpha=0.6)
                xs.append(x)
                means.append(sum(ys) / len(ys))
            if len(xs) > 1:
                ax.plot(xs, means, color=col[opt], marker=MARKERS[k % len(MARKERS)], lw=1, label=opt)
            elif xs:  # one size: the mean as a short bar across its dots (no line joins one point)
                ax.plot(xs, means, color=col[opt], marker="_", ms=16, mew=2, ls="none", label=opt)
        param_axis(ax, counts)
        if log_y and values and min(values) > 0 and max(values) / min(values) > 10:
            ax.set_yscale("log")  # under a decade a log axis has no labelled tick: linear reads better
        if values and key in EMPTY_TEXT:  # counts and fractions: from 0 up (not -0.04 ... 0.04 around all-zero)
            top = max(1.0, max(values))
            ax.set_ylim(-0.05 * top, 1.05 * top)
            if not any(values):
                ax.text(0.5, 0.6, EMPTY_TEXT[key], transform=ax.transAxes, ha="center", fontsize=11, color="0.3")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


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
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _readable(v)))  # 0.5, 2 rather than 5x10^-1
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


# ------------------------------------------------------------------------------------------- against data
def ratio_axis(ax: Any, ratios: Iterable[float]) -> None:
    """A log x axis ticked at the data ratios run, each labelled as the tables write it ("0.5 tok/param": not "0.5x",
    which reads as a multiple of Chinchilla's 20 tokens per parameter, or of a ladder's budget), no minor labels; a
    decade around a single ratio."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from hf_optbench.measure.verdict import ratio_label

    ticks = sorted({float(r) for r in ratios if r and r > 0})
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: ratio_label(round(v, 6))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=8)
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 3, ticks[0] * 3)
    elif ticks:
        span = ticks[-1] / ticks[0]
        ax.set_xlim(ticks[0] / span ** 0.15, ticks[-1] * span ** 0.15)
    ax.set_xlabel("training tokens per non-embedding parameter (the budgets run)")


def plot_data_axis(an: Analysis, path: Path, key: str = "speedup") -> Path | None:
    """Each optimizer's ratio to the baseline (its speedup, by default) against tokens per parameter, one panel per
    optimizer, one line per size joining its points (the size's verdict along data in the legend), bars the
    verdict's own intervals, filled where beyond the margin; None when no data-axis verdict has a point."""
    from matplotlib.ticker import FuncFormatter

    from hf_optbench.measure.verdict import METRICS

    spec = next(m for m in METRICS if m.key == key)
    opts = [o for o in an.optimizers if o != BASELINE]
    found = {o: [v for v in an.verdicts_along("data") if v.optimizer == o and v.metric.key == key and v.points]
             for o in opts}
    opts = [o for o in opts if found[o]]
    if not opts:
        return None
    plt = plt_()
    ncols = min(3, len(opts))
    nrows = math.ceil(len(opts) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows + 0.5), squeeze=False, sharey=True)
    for ax in axes.flat[len(opts):]:
        ax.set_visible(False)
    col = colors(an.model_sizes)
    values: list[float] = [1.0]  # the axis is set by the points and the baseline's 1, not by the widest interval
    for ax, opt in zip(axes.flat, opts, strict=False):
        for k, v in enumerate(found[opt]):
            n = len(found[opt])
            # Sizes side by side at one ratio, far enough apart on a log axis spanning a decade or more that their
            # markers and bars do not sit on each other (3 % did, in the CPU study's plot); each size's labels on its
            # own side: the first left, the last right, any between above.
            offset = 1.0 + 0.09 * (k - (n - 1) / 2)
            side = ((-6, -3), "right") if k == 0 and n > 1 else ((6, -3), "left") if k == n - 1 else ((0, 7), "center")
            c, marker = col.get(v.at, "black"), MARKERS[k % len(MARKERS)]
            xs = [p.num_params * offset for p in v.points]
            ys = [p.ratio() for p in v.points]
            ax.plot(xs, ys, color=c, lw=0.9, ls="--", alpha=0.7)
            for x, y, p in zip(xs, ys, v.points, strict=True):
                if math.isfinite(p.ci_low) and math.isfinite(p.ci_high):
                    lo, hi = p.interval()
                    ax.plot([x, x], [lo, hi], color=c, lw=1.2)
                ax.plot(x, y, marker, **point_style(p, c))
                ax.annotate(f"{p.bound_sign()}{y:.3g}", (x, y), textcoords="offset points", xytext=side[0], fontsize=7,
                            color=c, ha=side[1])
                values.append(y)
            ax.plot([], [], marker, color=c, mfc="none", mew=1.3, ls="--", label=verdict_label(v.at, v))
        ax.axhspan(math.exp(-spec.margin), math.exp(spec.margin), color="0.85", zorder=0)
        ax.axhline(1.0, color="grey", lw=0.8)
        ratio_axis(ax, [p.num_params for v in found[opt] for p in v.points])
        ax.set_title(opt, fontsize=10)
        ax.set_ylabel(f"{spec.label} / {BASELINE}" if spec.baseline_value is None else f"{opt}'s {spec.label}")
        ax.grid(alpha=0.3)
        fill_key(ax, any(p.transient for v in found[opt] for p in v.points))
        ax.legend(fontsize=6.5, title=TREND_KEY, title_fontsize=6.5)
    low, high = min(values), max(values)
    if high / low > 3:
        axes[0][0].set_yscale("log")  # shared: every panel
        axes[0][0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: _readable(v)))
        axes[0][0].set_ylim(low / 1.6, high * 1.6)
    else:
        pad = 0.35 * (high - low) + 0.1
        axes[0][0].set_ylim(max(0.0, low - pad), high + pad)  # an interval wider than this runs off the axis
    drawn = confidence_range(p for o in opts for v in found[o] for p in v.points) or "n/a"
    title = (f"{spec.label} against data per parameter, per size: the mean paired value, bar = its interval at the "
             f"level Holm's procedure gave its verdict cell ({drawn} confidence, cut at the axis); filled = beyond the "
             "margin (grey band), hollow = not; the dashed line only joins one size's points; trend per decade, "
             "+: advantage grows")
    fig.suptitle(textwrap.fill(title, width=int(14 * 5.2 * ncols)), fontsize=9)
    return save(fig, path)


# ------------------------------------------------------------------------------------------------- all of them
def write_plots(an: Analysis, out: Path) -> dict[str, Path]:
    """Every plot the analysis supports, written into ``out``: {file name: path}. {} without a finished run. Per cell
    (a size, or a size at a data ratio: ``Analysis.file_key`` names its files)."""
    files: dict[str, Path] = {}
    if an.ok():
        for size in an.sizes:
            if any(r.cell.label == size for r in an.ok()):
                name = an.file_key(size)
                files[f"loss_{name}.png"] = plot_loss(an, size, out / f"loss_{name}.png")
                files[f"lr_gradnorm_{name}.png"] = plot_lr_gradnorm(an, size, out / f"lr_gradnorm_{name}.png")
        files["memory.png"] = plot_memory(an, out / "memory.png")
        mean_mark = "line = mean over seeds)" if len(an.model_sizes) > 1 else "bar = mean over seeds)"
        files["throughput.png"] = plot_by_params(
            an, (("step_time_median_s", "median step time (s)"), ("tokens_per_s", "tokens / s")),
            f"step time and throughput (wall clock: dots = seeds, {mean_mark}", out / "throughput.png", log_y=True)
        files["stability.png"] = plot_by_params(
            an, (("loss_spikes_per_1k", "loss spikes per 1k steps"), ("diverged", "diverged (1) or not (0)")),
            f"stability (dots = seeds, {mean_mark[:-1]}; optimizers offset sideways)", out / "stability.png",
            dodge=True)
    for at in dict.fromkeys(v.at for v in an.verdicts_along("size")):  # one per ratio every size ran
        if an.multi and len(an.model_sizes) < 2:
            break  # one size: nothing to draw along size (the data axis has its own plot)
        if (scaling := plot_scaling(an, out / scaling_name(an, at), at)) is not None:
            files[scaling_name(an, at)] = scaling
    if an.multi and (data := plot_data_axis(an, out / "data_axis.png")) is not None:
        files["data_axis.png"] = data
    for size in cells_of(r for r in an.tuning if r.model_size):
        path = plot_tuning(an, size, out / f"tuning_{an.file_key(size)}.png")
        if path is not None:
            files[f"tuning_{an.file_key(size)}.png"] = path
    return files


def scaling_name(an: Analysis, at: str) -> str:
    """The scaling plot's file: "scaling.png", or "scaling__tpp0.5.png" for the size axis at one data ratio."""
    from hf_optbench.measure.verdict import ratio_label

    tpp = next((r for r in an.ratios if ratio_label(r) == at), None)
    return "scaling.png" if tpp is None else f"scaling__tpp{tpp:g}.png"
