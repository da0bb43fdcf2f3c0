"""What every plot of the report shares: the Agg backend, colours and markers per optimizer, k/M tick labels,
and saving (with the minor-tick labelling decided once the limits are known)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


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


def minor_labels(axis: Any, formatter: Any) -> None:
    """Label a log axis's minor ticks (4M, 6M) with ``formatter`` when it spans under ~1.5 decades (else it
    has few major ticks to read); across more decades they would collide, so they stay unlabelled. Call after
    plotting, when the limits are known."""
    import math

    from matplotlib.ticker import NullFormatter

    low, high = axis.get_view_interval()
    if axis.get_scale() == "log" and low > 0:
        few = math.log10(high / low) < 1.5
        axis.set_minor_formatter(formatter if few else NullFormatter())
        if few:
            axis.set_major_formatter(formatter)  # one style on the axis: 0.09 beside 0.1, not beside 10^-1


def save(fig: Any, path: Path) -> Path:
    from matplotlib.ticker import EngFormatter, FuncFormatter

    for ax in fig.axes:
        minor_labels(ax.xaxis, EngFormatter(sep=""))
        minor_labels(ax.yaxis, FuncFormatter(lambda v, _: f"{v:g}"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt_().close(fig)
    return path
