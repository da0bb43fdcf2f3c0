"""The report along data per parameter (issue 31): a sweep over several tokens-per-parameter budgets, built with a
known speedup at each ratio (Lion 2.0x at 1x, 1.6x at 2x, 1.3x at 4x the fixture's budget, at both sizes), gets the
data-axis verdict ("shrinks with data"), its table and plot, the size axis read per ratio, and the reference table
per size x ratio; a single-ratio sweep's report keeps its sections, with one line for the data question."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_optbench.report.analysis import analyse  # noqa: E402
from hf_optbench.report.build import build_report  # noqa: E402

from fixtures.study_fixture import SEEDS, SIZES, STEPS, grid_sweep  # noqa: E402
from fixtures.sweep_fixture import build_fixture_sweep  # noqa: E402

SHRINKING = {1.0: 2.0, 2.0: 1.6, 4.0: 1.3}  # Lion's true speedup at each ratio (x the fixture's budget)


@pytest.mark.slow  # a whole report (90 runs, 20 figures): ~6 s
def test_a_speedup_that_falls_with_data_gets_its_verdict_table_and_plot(tmp_path: Path) -> None:
    an = analyse(grid_sweep(tmp_path, SHRINKING))
    assert an.multi and an.ratios == [1.0, 2.0, 4.0] and an.model_sizes == list(SIZES)
    assert an.sizes[:3] == ["tiny @ 1 tok/param", "tiny @ 2 tok/param", "tiny @ 4 tok/param"]
    lion = {(r["model_size"], r["budget_tpp"]): r["speedup"] for r in an.records if r["optimizer"] == "lion"}
    assert lion[("mini", 4.0)] == pytest.approx(1.3, rel=0.02) and lion[("tiny", 1.0)] == pytest.approx(2.0, rel=0.02)
    data = {v.at: v for v in an.verdicts_along("data") if v.metric.key == "speedup"}
    assert {at: v.word for at, v in data.items()} == {"tiny": "shrinks with data", "mini": "shrinks with data"}
    # the size axis at each ratio: no trend with size was built in
    size = [v for v in an.verdicts_along("size") if v.metric.key == "speedup"]
    assert sorted(v.at for v in size) == ["1 tok/param", "2 tok/param", "4 tok/param"]
    assert all(v.verdict in ("holds", "ahead, trend unresolved") for v in size)
    # the primary family (the default: the speedup along data and along size) under its own Holm procedure, the
    # rest under another
    tested = [v for v in an.verdicts if v.p_value is not None]
    primary = [v for v in tested if v.tier == "primary"]
    assert {v.metric.key for v in primary} == {"speedup"} and {v.family for v in primary} == {len(primary)} == {5}
    assert {v.family for v in tested if v.tier == "secondary"} == {len(tested) - 5}
    assert all(v.advantage_trend < 0 for v in data.values())  # a falling speedup reads negative: advantage shrinks

    files = build_report(tmp_path / "sweep")
    short = files["report.md"].read_text()
    opening = short.split("## The answer: speedup over tuned adamw")[1].split("|")[0]
    assert "(+: advantage grows, − shrinks)" in opening and "Holm's procedure over 5 cells" in opening
    assert "tested as the sweep's primary questions (along " in opening
    tiny = data["tiny"]
    assert (f"**lion**: along data {tiny.advantage_trend:+.3f} ln/decade [{tiny.advantage_ci[0]:+.3f}, "
            f"{tiny.advantage_ci[1]:+.3f}] at tiny (shrinks with data, smallest detectable ±") in opening
    text = files["evidence.md"].read_text()
    assert "| primary |" in text and "| secondary |" in text
    assert "## Data per parameter (advantage over adamw as each parameter sees more data)" in text
    assert "### At 1 tok/param" in text and "### At tiny" in text
    assert "| lion | tiny | 1.99 [" in text and "ahead | shrinks with data |" in text  # speedup per ratio, then the word
    assert "shrinks with data (1.99→1.29; ahead at 4 tok/param)" in text  # smallest -> largest ratio
    assert "| optimizer | metric | along | verdict |" in text and "| data, at mini |" in text
    assert "data_axis.png" in files and "scaling__tpp2.png" in files and "loss_tiny__tpp4.png" in files
    assert "the sweep's pre-declared primary questions (speedup along data, speedup along size) form their own " \
        "family" in text
    rungs = text.split("## Speedup over adamw (its budget ladder)")[1]
    assert "| tiny @ 2 tok/param |" in rungs  # the ladder per cell
    import pandas as pd

    assert set(pd.read_parquet(files["runs.parquet"])["budget_tpp"]) == {1.0, 2.0, 4.0}


@pytest.mark.slow  # a whole report: ~3 s
def test_one_size_at_several_ratios_shows_the_data_axis_alone(tmp_path: Path) -> None:
    """The main job's shape: one size, two ratios. The size axis is one line (no empty tables, no one-point plots, no
    size rows in the evidence); the data axis carries the verdict."""
    files = build_report(grid_sweep(tmp_path, {1.0: 2.0, 2.0: 1.6}, sizes=("tiny",)))
    text = files["evidence.md"].read_text()
    scaling = text.split("## Scaling verdict")[1].split("\n## ")[0]
    assert "This sweep ran one size (tiny): the size axis needs two" in scaling and "| optimizer |" not in scaling
    assert not [name for name in files if name.startswith("scaling")] and "data_axis.png" in files
    evidence = text.split("### Evidence")[1].split("\n## ")[0]
    assert "| data, at tiny |" in evidence and "| size, at" not in evidence
    assert "### At tiny" in text and "| lion | tiny | 1.99 [" in text


def test_the_data_axis_plot_reads_as_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_optbench.report import plots
    from hf_optbench.report.sections import verdict

    figures: list = []
    monkeypatch.setattr(verdict, "save", lambda fig, path, rect=None: figures.append(fig) or path)
    an = analyse(grid_sweep(tmp_path, SHRINKING))
    assert verdict.plot_data_axis(an, tmp_path / "data_axis.png") is not None
    (fig,) = figures
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1 tok/param", "2 tok/param", "4 tok/param"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [text.split(";")[0] for text in labels[:2]] == ["tiny: shrinks with data", "mini: shrinks with data"]
    assert labels[2:] == [plots.FILLED, plots.HOLLOW]
    assert "tokens per non-embedding parameter" in ax.get_xlabel()
    plots.plt_().close(fig)


def test_the_regime_table_has_a_row_per_size_and_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_optbench.report.sections import regime as reference

    blocks = np.array([[0, 1, 2, 3, 1, 2, 3, 0]] * 8)
    monkeypatch.setattr(reference, "splits", lambda rec: (blocks, blocks, 4))
    an = analyse(grid_sweep(tmp_path, SHRINKING))
    reg = reference.regime_of(an)
    assert [r[0] for r in reg.rows] == an.sizes and len(reg.rows) == 6 and set(reg.cells) == set(an.sizes)
    assert reg.header[0] == "size" and "tiny @ 4 tok/param" in [r[0] for r in reg.rows]


def test_a_single_ratio_report_keeps_its_sections_and_says_the_data_question_in_one_line(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "one", optimizers=("adamw", "lion"), sizes=SIZES, seeds=SEEDS, steps=STEPS)
    files = build_report(root)
    text = files["evidence.md"].read_text()
    section = text.split("## Data per parameter")[1].split("\n## ")[0].strip().splitlines()
    assert len([line for line in section if line.strip()]) == 2  # the heading's tail and one line
    assert "ran one data budget" in section[-1] and "give budget.tokens_per_param a list" in section[-1]
    assert "### At " not in text and "tok/param" not in text and "| along |" not in text
    assert {"scaling.png", "loss_tiny.png", "loss_mini.png"} <= set(files) and "data_axis.png" not in files
    assert "## Scaling verdict (advantage over adamw as parameters grow)" in text
    import pandas as pd

    assert "budget_tpp" not in pd.read_parquet(files["runs.parquet"]).columns
