"""Figures true to their captions: every verdict point's fill says what the caption says (filled = beyond the
margin), every legend entry of a series is an outline (no fill some of its points lack) beside a key that draws both
fills, the legend names each series' verdict and its trend with the orientation, and the caption states the
intervals' confidence as the report does (never "100.0%")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hf_optbench.report import plots
from hf_optbench.report.analysis import analyse
from hf_optbench.report.sections import ratios, verdict

from fixtures.study_fixture import grid_sweep


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The data-axis and scaling figures of a two-size, three-ratio sweep (Lion's speedup falling with data), kept
    open: ``save`` is wrapped (where each section's module calls it) to hand each figure over before it is closed."""
    an = analyse(grid_sweep(tmp_path_factory.mktemp("legends"), {1.0: 2.0, 2.0: 1.6, 4.0: 1.3}))
    kept: dict[str, Any] = {}
    real = plots.save

    def keep(fig: Any, path: Path, rect: Any = None) -> Path:
        kept[path.name] = (fig, [ax.get_legend() for ax in fig.axes])
        fig.canvas.draw()
        return path

    verdict.save = ratios.save = keep
    try:
        out = tmp_path_factory.mktemp("out")
        verdict.plot_data_axis(an, out / "data_axis.png")
        ratios.plot_scaling(an, out / "scaling__tpp2.png", "2 tok/param")
    finally:
        verdict.save = ratios.save = real
    return {"an": an, **kept}


def _points(ax: Any) -> list[Any]:
    """The drawn verdict points: single-marker lines with data."""
    return [ln for ln in ax.lines if len(ln.get_xdata()) == 1 and ln.get_marker() not in (None, "None", "")]


@pytest.mark.parametrize("name", ["data_axis.png", "scaling__tpp2.png"])
def test_each_point_s_fill_is_its_verdict_s_and_the_legend_draws_both(figures: dict[str, Any], name: str) -> None:
    from matplotlib.colors import to_rgba

    fig, _ = figures[name]
    an = figures["an"]
    if name == "data_axis.png":
        ax = next(a for a in fig.axes if a.get_title() == "lion")
        verdicts = [v for v in an.verdicts_along("data") if v.metric.key == "speedup" and v.optimizer == "lion"]
    else:
        ax = next(a for a in fig.axes if a.get_title().startswith("speedup"))
        verdicts = [v for v in an.verdicts_along("size", "2 tok/param") if v.metric.key == "speedup"]
    points = [p for v in verdicts for p in v.points]
    drawn = _points(ax)
    assert len(drawn) == len(points) >= 2
    assert [to_rgba(ln.get_markerfacecolor()) != to_rgba("white") for ln in drawn] == [p.significant for p in points]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert plots.FILLED in labels and plots.HOLLOW in labels
    series = 0
    for text, handle in zip(labels, ax.get_legend().legend_handles, strict=True):
        if text in (plots.FILLED, plots.HOLLOW) or not hasattr(handle, "get_markerfacecolor"):
            continue
        series += 1
        assert handle.get_markerfacecolor() == "none", f"'{text}' is drawn filled in the legend"
        assert re.search(r"; trend [+-]\d", text), text
    assert series == len(verdicts)
    assert ax.get_legend().get_title().get_text() == plots.TREND_KEY


def test_the_caption_states_the_confidence_as_the_report_does(figures: dict[str, Any]) -> None:
    for name in ("data_axis.png", "scaling__tpp2.png"):
        fig, _ = figures[name]
        title = fig._suptitle.get_text().replace("\n", " ")
        assert "100.0%" not in title
        assert re.search(r"\(\d+\.\d+ %( to \d+\.\d+ %)? confidence", title), title
