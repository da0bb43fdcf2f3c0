"""The style of every figure of the report and the helpers they share (matplotlib, Agg backend: no display needed).
Each figure is one PNG drawn to be read, not decoded: every seed is its own thin line, a parameter axis is ticked at the model sizes that were run and labelled
as parameter counts (110k, 1.5M, 124M, 1.5B), token axes read 150k / 2.7M, memory is on a log axis so a 0.01 MiB
optimizer state shows beside a 600 MiB peak, a panel where every value is 0 says so, and a question without a
single point gets no panel (the figure names it in one line instead of drawing empty axes). A verdict's point is
filled where it lies beyond the equivalence margin (ahead/behind) and hollow where not (:func:`point_style`, with the
legend entries of :func:`fill_key`).

Each figure is drawn by the module of its section (:mod:`hf_optbench.report.sections`);
:func:`hf_optbench.report.figures.write_plots` writes all of them and returns their paths by file name, the names
the report embeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.study.records import RunRecord

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
readable = "{:g}".format  # 0.002, 0.5, 2: a tick label as written, not 5x10^-1


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
        return readable(v) if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in (2, 5) else ""

    if decades < 1.5:
        axis.set_minor_formatter(FuncFormatter(lambda v, _: readable(v)))
    elif decades < 3:
        axis.set_minor_formatter(FuncFormatter(two_and_five))
    else:
        axis.set_minor_formatter(NullFormatter())
        return
    axis.set_major_formatter(FuncFormatter(lambda v, _: readable(v)))  # one style: 0.002 beside 0.001


def save(fig: Any, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    for ax in fig.axes:
        minor_labels(ax.xaxis)
        minor_labels(ax.yaxis)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt_().close(fig)
    return path


# ------------------------------------------------------------------------------------------------------- runs
def finished_runs(an: Analysis, opt: str, size: str, by_size: bool = False) -> list[RunRecord]:
    """The finished runs of ``opt`` at cell ``size`` (with ``by_size``: at model size ``size``, every ratio)."""
    return [r for r in an.ok() if r.optimizer == opt and (r.model_size if by_size else r.cell.label) == size]


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
