"""The report's figures (issue 33 item 3), looked at as a reader would: a parameter axis ticked at the sizes run and
labelled as parameter counts, no empty panel in the scaling plot (the questions without a point named in one
line instead), and every target, with one note, when the runs are too short for their smoothing window."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from hf_optbench.report import plots
from hf_optbench.report.analysis import analyse
from hf_optbench.report.sections import convergence, ratios
from hf_optbench.report.targets import merge_size_notes
from hf_optbench.study.records import RunRecord

from fixtures.sweep_fixture import build_fixture_sweep


def test_parameter_counts_read_as_people_write_them() -> None:
    assert [plots.param_label(n) for n in (25_000, 107_904, 809_984, 124_439_808, 1_557_611_200)] == \
        ["25k", "108k", "810k", "124M", "1.56B"]


def test_a_parameter_axis_is_ticked_at_the_sizes_and_never_crowded() -> None:
    plt = plots.plt_()
    fig, ax = plt.subplots(figsize=(5, 4))
    counts = [108e3, 810e3, 124e6, 355e6, 774e6, 1.56e9]
    ax.plot(counts, [1] * len(counts), "o")
    plots.param_axis(ax, counts)
    fig.canvas.draw()
    ticks = list(ax.get_xticks())
    labels = [t.get_text() for t in ax.get_xticklabels()]
    plt.close(fig)
    assert labels == [plots.param_label(t) for t in ticks] and set(ticks) <= set(counts)
    assert ticks[:3] == [108e3, 810e3, 124e6]  # 355M would touch 124M's label: left unlabelled
    gaps = [math.log10(b / a) for a, b in zip(ticks, ticks[1:], strict=False)]
    assert min(gaps) >= 0.12 * math.log10(counts[-1] / counts[0])
    assert not ax.xaxis.get_minor_ticks() or all(not t.label1.get_text() for t in ax.xaxis.get_minor_ticks())


def _short_runs(tmp_path: Path) -> Path:
    """A sweep of 30-step runs with the default 20-step smoothing: no 25 % or 50 % target (the smoke sweep as it
    was)."""
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"),
                               seeds=(0, 1, 2), steps=30)
    for config in root.glob("runs/*/config.yaml"):
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "target_smoothing_steps": 20}))
    return root


def test_too_short_runs_get_every_target_from_a_window_cut_to_fit_and_one_note(tmp_path: Path) -> None:
    """Issue 31: 30-step runs with the default 20-step smoothing had no 25 % or 50 % target (the window was not full
    by step 8 or 15), so time to target went unanswered. The report's window now scales with the run (an eighth of
    its steps at most: 3 here), every target exists, and one note says where the window was cut."""
    an = analyse(_short_runs(tmp_path))
    assert [t.name for t in an.targets["tiny"]] == ["25%", "50%", "75%", "100%"]
    assert "trailing mean of 3 steps" in an.targets["tiny"][0].derivation
    (note,) = [n for n in an.target_notes if "smoothing window" in n]  # one line, not one per run and target
    assert "tiny (3 of 20 steps), mini (3 of 20 steps)" in note and "target_smoothing_steps" in note
    assert all(r["tokens_to_target"] is not None for r in an.ok())


def test_a_window_longer_than_the_run_reaches_is_named_with_the_setting_that_fits() -> None:
    """baseline_targets itself, given a window the run's first targets come before: one note, and the fix."""
    from hf_optbench.report.targets import baseline_targets

    train = [{"step": i, "loss": 5.0 - 0.01 * i} for i in range(1, 31)]
    rec = RunRecord("adamw__tiny__s0", seed=0, summary={"max_steps": 30, "tokens_per_step": 256})
    targets, notes = baseline_targets("tiny", [(rec, train, 20)], "adamw")
    assert [t.name for t in targets] == ["75%", "100%"]
    assert notes == ["tiny: no 25% / 50% target, so time to target is not answered (the verdict uses the 50% one): "
                     "these runs are 30 steps, and at steps 8 / 15 the 20-step smoothing window is not yet full "
                     "(target_smoothing_steps <= 8 would fit)"]


def test_notes_merge_by_size_and_keep_the_rest() -> None:
    assert merge_size_notes(["tiny: x", "mini: x", "tiny: y", "a note without a size"]) == \
        ["tiny, mini: x", "tiny: y", "a note without a size"]


def test_the_scaling_plot_draws_no_empty_panel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures: list[Any] = []
    monkeypatch.setattr(ratios, "save", lambda fig, path, rect=None: figures.append(fig) or path)
    an = analyse(_short_runs(tmp_path), target_loss={"midi": 1.0})  # a target for no size run: no time to target
    assert ratios.plot_scaling(an, tmp_path / "scaling.png") is not None
    (fig,) = figures
    fig.canvas.draw()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in shown]
    assert "optimizer state" in titles and "tokens to target loss" not in titles
    assert "no panel for tokens to target loss, seconds to target loss" in " ".join(fig._suptitle.get_text().split())
    assert all(ax.lines or ax.collections for ax in shown)  # every panel drawn holds something
    for ax in shown:  # before: an empty panel's axis read "900m, 1 ... 10" as parameters
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels and all(label[-1] in "kMB" for label in labels), labels
    plots.plt_().close(fig)


def test_the_scaling_caption_names_the_level_it_draws_and_fits_the_figure(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: the caption said "97.5 % paired t interval" for bars drawn at the level Holm's procedure gave each
    cell, and the one-line title ran past the figure's edges (clipped in scaling__tpp0.15.png)."""
    figures: list[Any] = []
    monkeypatch.setattr(ratios, "save", lambda fig, path, rect=None: figures.append(fig) or path)
    an = analyse(_short_runs(tmp_path))
    ratios.plot_scaling(an, tmp_path / "scaling.png")
    (fig,) = figures
    from hf_optbench.measure.verdict import confidence_text

    drawn = sorted({p.level for v in an.verdicts_along("size", "") for p in v.points})
    text = " ".join(fig._suptitle.get_text().split())
    assert drawn and "Holm" in text, text
    assert confidence_text(drawn[0]) in text and confidence_text(drawn[-1]) in text, text  # as the report words it
    assert "t interval" not in text  # censored-normal intervals are drawn too
    fig.tight_layout()
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    plots.plt_().close(fig)


def test_target_labels_a_few_hundredths_apart_do_not_print_over_each_other() -> None:
    """The main job's 75 % and 100 % targets at 2 tokens/param were 0.03 nats apart on a 0.95-nat axis: both labels
    sat above their lines, one over the other (seen in loss_tiny__tpp2.png). The lower one now goes below its line."""
    from types import SimpleNamespace
    plt = plots.plt_()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.set_ylim(1.85, 2.8)
    targets = [SimpleNamespace(name=n, loss=v) for n, v in (("25%", 2.27), ("50%", 2.13), ("75%", 2.04),
                                                              ("100%", 2.01))]
    convergence._label_targets(ax, targets)
    fig.canvas.draw()
    boxes = {t.get_text(): t.get_window_extent() for t in ax.texts}
    assert not boxes["75%"].overlaps(boxes["100%"]), (boxes["75%"], boxes["100%"])
    assert {t.get_text(): t.get_va() for t in ax.texts} == {"25%": "bottom", "50%": "bottom", "75%": "bottom",
                                                           "100%": "top"}
    plt.close(fig)
