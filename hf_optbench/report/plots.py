"""The report's plots (matplotlib, Agg backend: no display needed), one PNG each, drawn to be read, not decoded:
every seed is its own thin line, token and parameter axes read 150k / 2.7M (matplotlib's EngFormatter), memory is on
a log axis so a 0.01 MiB optimizer state shows beside a 600 MiB peak, and a panel where every value is 0 says so.

:func:`write_plots` writes all of them and returns their paths by file name, the names the report embeds. The
scaling and tuning plots are in :mod:`hf_optbench.report.plots_scaling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis, group, window
from hf_optbench.report.plot_style import MARKERS, colors, eng_axis, plt_, save


def _runs(an: Analysis, opt: str, size: str) -> list[dict[str, Any]]:
    return [r for r in an.ok() if r["optimizer"] == opt and r["model_size"] == size]


def _xy(rows: Sequence[Mapping[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r[x_key]), float(r[y_key])) for r in rows if r.get(x_key) is not None and r.get(y_key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smoothed(xs: Sequence[float], ys: Sequence[float], n: int) -> tuple[list[float], list[float]]:
    """Trailing mean of ``n`` (the recorder's target rule), cut at the first NaN/Inf (a divergence)."""
    import math

    import pandas as pd

    end = next((i for i, y in enumerate(ys) if not math.isfinite(y)), len(ys))
    return list(xs[:end]), pd.Series(ys[:end], dtype="float64").rolling(n, min_periods=1).mean().tolist()


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
                m = an.metrics.get(r["run_id"], {})
                xs, ys = _smoothed(*_xy(m.get("train", []), x_key, "loss"), window(r))
                ax.plot(xs, ys, color=col[opt], lw=0.8, alpha=0.8, label=opt if i == 0 else None)
                if ys:
                    tops.append(ys[len(ys) // 10])
                    lows.append(min(ys))
                if r["status"] == "diverged" and ys:
                    ax.plot(xs[-1], ys[-1], "x", color=col[opt], ms=9, mew=2, label=f"{opt} diverged")
                ex, ey = _xy(m.get("eval", []), x_key, "eval_loss")
                ax.plot(ex, ey, "o", color=col[opt], ms=3.5, mfc="none", mew=0.8)
        for t in an.targets.get(size, []):
            ax.axhline(t.loss, color="grey", ls=":", lw=0.9)
            ax.annotate(t.name, (1.0, t.loss), xycoords=("axes fraction", "data"), fontsize=7, color="grey",
                        ha="right", va="bottom")
        ax.set_xlabel(label)
        if x_key == "tokens":
            eng_axis(ax.xaxis)
        ax.grid(alpha=0.3)
    if tops and lows:
        span = max(tops) - min(lows)
        axes[0].set_ylim(min(lows) - 0.05 * span, max(tops) + 0.05 * span)
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
                xs, ys = _xy(an.metrics.get(r["run_id"], {}).get("train", []), "step", key)
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
    """Parameters, gradients, optimizer state and peak as side-by-side bars per optimizer, one panel per size, on
    a log axis (the state of a factored optimizer is ~1e-4 of a CPU peak that includes the runtime)."""
    plt = plt_()
    fig, axes = plt.subplots(1, len(an.sizes), figsize=(4.6 * len(an.sizes), 4.2), squeeze=False)
    parts = (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_state_bytes", "optimizer state"),
             ("peak_memory_bytes", "peak"))
    width = 0.8 / len(parts)
    for ax, size in zip(axes[0], an.sizes, strict=True):
        for j, (key, label) in enumerate(parts):
            xs, vals = [], []
            for i, o in enumerate(an.optimizers):
                v = (group(an.records, key, o, size) or {}).get("mean")
                if v:  # 0 (a stateless optimizer) has no place on a log axis: the memory table shows it
                    xs.append(i - 0.4 + width * (j + 0.5))
                    vals.append(v / 2**20)
            bars = ax.bar(xs, vals, width=width, label=label, color=f"C{j}")
            ax.bar_label(bars, labels=[f"{v:.3g}" for v in vals], fontsize=6, rotation=90, padding=2)
        ax.set_yscale("log")
        ax.margins(y=0.25)
        ax.set_xticks(range(len(an.optimizers)), an.optimizers, rotation=30, fontsize=8)
        ax.set_title(size)
        ax.set_ylabel("MiB (log)")
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7, loc="lower left")
    kinds = {r.get("peak_memory_kind") for r in an.ok() if r.get("peak_memory_kind")}
    fig.suptitle(f"memory per optimizer and size, mean over seeds (peak: {', '.join(sorted(kinds)) or 'n/a'})")
    return save(fig, path)


EMPTY_TEXT = {"loss_spikes_per_1k": "no loss spikes in any run", "diverged": "no run diverged"}


def plot_by_params(an: Analysis, panels: Sequence[tuple[str, str]], title: str, path: Path,
                   log_y: bool = False, dodge: bool = False) -> Path:
    """One panel per (key, label): every seed as a dot and the seeds' mean as a line, against parameters; each
    optimizer with its own marker and, with ``dodge``, a small sideways offset, so equal values (all 0) do not
    hide each other (only for counts: on a sloped curve an offset would read as a difference)."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        values = []
        for k, opt in enumerate(an.optimizers):
            offset = 1.0 + 0.04 * (k - (len(an.optimizers) - 1) / 2) if dodge else 1.0
            xs, means = [], []
            for size in an.sizes:
                runs = [r for r in _runs(an, opt, size) if r.get(key) is not None and r.get("num_params")]
                if not runs:
                    continue
                x = float(runs[0]["num_params"]) * offset
                ys = [float(r[key]) for r in runs]
                values += ys
                ax.scatter([x] * len(ys), ys, color=col[opt], marker=MARKERS[k % len(MARKERS)], s=14, alpha=0.6)
                xs.append(x)
                means.append(sum(ys) / len(ys))
            if xs:
                ax.plot(xs, means, color=col[opt], marker=MARKERS[k % len(MARKERS)], lw=1, label=opt)
        ax.set_xscale("log")
        eng_axis(ax.xaxis)
        if log_y and values and min(values) > 0:
            ax.set_yscale("log")
        if values and not any(values) and key in EMPTY_TEXT:
            ax.text(0.5, 0.6, EMPTY_TEXT[key], transform=ax.transAxes, ha="center", fontsize=11, color="0.3")
        ax.set_xlabel("parameters")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def write_plots(an: Analysis, out: Path) -> dict[str, Path]:
    """Every plot the analysis supports, written into ``out``: {file name: path}. {} without a finished run."""
    from hf_optbench.report.plots_scaling import plot_scaling, plot_tuning

    files: dict[str, Path] = {}
    if an.ok():
        for size in an.sizes:
            if any(r["model_size"] == size for r in an.ok()):
                files[f"loss_{size}.png"] = plot_loss(an, size, out / f"loss_{size}.png")
                files[f"lr_gradnorm_{size}.png"] = plot_lr_gradnorm(an, size, out / f"lr_gradnorm_{size}.png")
        files["memory.png"] = plot_memory(an, out / "memory.png")
        files["throughput.png"] = plot_by_params(
            an, (("step_time_median_s", "median step time (s)"), ("tokens_per_s", "tokens / s")),
            "step time and throughput (wall clock: dots = seeds, line = mean)", out / "throughput.png", log_y=True)
        files["stability.png"] = plot_by_params(
            an, (("loss_spikes_per_1k", "loss spikes per 1k steps"), ("diverged", "diverged (1) or not (0)")),
            "stability (dots = seeds, line = mean over seeds; optimizers offset sideways)", out / "stability.png",
            dodge=True)
    if an.verdicts:
        files["scaling.png"] = plot_scaling(an, out / "scaling.png")
    for size in sorted({str(r.get("model_size")) for r in an.tuning if r.get("model_size")}):
        path = plot_tuning(an, size, out / f"tuning_{size}.png")
        if path is not None:
            files[f"tuning_{size}.png"] = path
    return files
