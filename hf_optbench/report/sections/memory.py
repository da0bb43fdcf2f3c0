"""The memory section: per optimizer and size, what the parameters, gradients and optimizer state hold and the
process's peak (mean over seeds, in MiB), the optimizer state the memory planner predicted beside the measured one
(:mod:`hf_optbench.measure.planner`), and the memory plot (``memory.png``)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis, group
from hf_optbench.report.plots import plt_, save
from hf_optbench.report.tables import OPTIMIZER, SIZE, Column, Group, GroupTable, mib, pm, render


def memory_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's memory section (``doc``: report.build.Doc): the table, the kind of peak measured, the plot."""
    doc.h(2, "Memory (MiB, mean over seeds)")
    doc.table(*render(MEMORY.columns, MEMORY.rows(an)))
    kinds = sorted({str(r.get("peak_memory_kind")) for r in an.ok() if r.get("peak_memory_kind")})
    doc.p(f"Peak memory kind: {', '.join(kinds) or 'n/a'} (cpu_peak_rss includes the Python/torch runtime, which "
          "dominates the smallest models).")
    if files.get("memory.png"):
        doc.img(files["memory.png"], "memory")


def _planner_check(g: Group) -> str:
    measured, planned = g.mean("optimizer_state_bytes"), g.mean("planner_optimizer_state_bytes")
    if measured is None or planned is None:
        return "–"
    return "equal" if measured == planned else f"differs by {measured - planned:+,.0f} B"


_MEMORY_KEYS = ("param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_memory_bytes",
                "planner_optimizer_state_bytes", "optimizer_state_bytes_per_param")
MEMORY = GroupTable(keep=lambda g: any(g.agg(k) for k in _MEMORY_KEYS), columns=[
    SIZE, OPTIMIZER,
    Column("parameters", mib("param_bytes")),
    Column("gradients", mib("grad_bytes")),
    Column("optimizer state", mib("optimizer_state_bytes")),
    Column("peak", mib("peak_memory_bytes")),
    Column("state B/param", pm("optimizer_state_bytes_per_param", "{:.3f}")),
    Column("planner state", mib("planner_optimizer_state_bytes")),
    Column("planner vs measured", _planner_check),
])


# ------------------------------------------------------------------------------------------------ figures
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
