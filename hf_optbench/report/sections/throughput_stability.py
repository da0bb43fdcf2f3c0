"""The step-time and throughput section and the stability section: per optimizer and size, the step time, tokens per
second and MFU (each wall-clock figure with the warning of :mod:`hf_optbench.report.noise` where the machine's load,
not the optimizer, may have moved it), and the loss and grad-norm spikes and divergences; each with its plot
(``throughput.png`` and ``stability.png``).

Adding a figure to either table is one line in its spec, e.g. in :data:`STABILITY`::

    Column("max grad-norm spike", pm("max_grad_norm_spike", "{:.3g}")),
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.report.plots import MARKERS, colors, finished_runs, param_axis, plt_, save
from hf_optbench.report.tables import OPTIMIZER, SIZE, Column, Group, GroupTable, pm, render, wall_note


def throughput_stability_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's two sections on how the runs ran (``doc``: report.build.Doc): step time and throughput, then
    stability, each a table and its plot."""
    doc.h(2, "Step time and throughput")
    doc.table(*render(THROUGHPUT.columns, THROUGHPUT.rows(an)))
    if files.get("throughput.png"):
        doc.img(files["throughput.png"], "throughput")
    doc.h(2, "Stability")
    doc.table(*render(STABILITY.columns, STABILITY.rows(an)))
    if files.get("stability.png"):
        doc.img(files["stability.png"], "stability")


def _diverged(g: Group) -> str:
    runs = g.runs()
    return f"{sum(1 for r in runs if r['status'] == 'diverged')}/{len(runs)}"


def _impl(g: Group) -> str:
    return next((r.get("optimizer_impl") for r in g.runs()), "") or ""


THROUGHPUT = GroupTable(keep=lambda g: g.agg("step_time_median_s") is not None, columns=[
    SIZE, OPTIMIZER,
    Column("implementation", _impl),
    Column("median step (s)", lambda g: pm("step_time_median_s", "{:.4f}")(g) + wall_note(g, "step_time_median_s")),
    Column("p90 step (s)", pm("step_time_p90_s", "{:.4f}")),
    Column("tokens/s", lambda g: pm("tokens_per_s", "{:,.0f}")(g) + wall_note(g, "tokens_per_s")),
    Column("MFU", pm("mfu", "{:.3f}")),
])
STABILITY = GroupTable(keep=lambda g: bool(g.runs()), columns=[
    SIZE, OPTIMIZER,
    Column("loss spikes", pm("loss_spikes", "{:.1f}")),
    Column("per 1k steps", pm("loss_spikes_per_1k", "{:.2f}")),
    Column("grad-norm spikes", pm("grad_norm_spikes", "{:.1f}")),
    Column("max loss spike", pm("max_loss_spike", "{:.3g}")),
    Column("diverged", _diverged),
])


# ------------------------------------------------------------------------------------------------ figures
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
        values, counts = [], []
        for k, opt in enumerate(an.optimizers):
            offset = 1.0 + 0.04 * (k - (len(an.optimizers) - 1) / 2) if dodge else 1.0
            xs, means = [], []
            for size in an.model_sizes:  # every data ratio's runs of a size pooled: step time does not depend on it
                runs = [r for r in finished_runs(an, opt, size, by_size=True) if r.get(key) is not None and r.get("num_params")]
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
