"""Legends that state the level and margin their numbers use (issue 44): every figure a legend gives is read back
and compared with the one the computation used (each point's own interval level, each metric's margin, Holm's
levels), and "p" is defined in every report that prints one, a single-axis report included."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from hf_optbench.measure.intervals import t_interval
from hf_optbench.measure.verdict import METRICS, confidence_text, grid_families, verdict_table
from hf_optbench.report.analysis import Analysis
from hf_optbench.report.build import Doc
from hf_optbench.report.legends import holm_range
from hf_optbench.report.sections.ratios import ratio_legend
from hf_optbench.report.sections.verdict import data_legend, evidence_legend, verdict_legend, verdict_section
from hf_optbench.study.records import RunRecord, cell_label

PARAMS = {"tiny": 100_096.0, "mini": 793_088.0}
NOISE = (0.0, 0.03, -0.02, 0.01, -0.025)
TRUTH = {"lion": 1.15, "muon": 2.3}  # speedups; the final loss falls with them


def _records(sizes: tuple[str, ...], ratios: tuple[float | None, ...]) -> list[dict]:
    """The main job's shape (adamw, lion, muon, 5 paired seeds), at ``sizes`` x ``ratios`` (None: one ratio)."""
    out = []
    for size in sizes:
        for tpp in ratios:
            for seed, e in enumerate(NOISE):
                base = {"optimizer": "adamw", "model_size": size, "num_params": PARAMS[size], "seed": seed + 1,
                        "budget_tpp": tpp, "status": "completed", "final_eval_loss": 2.05 + e / 3,
                        "tokens_to_target": 5e4 * (1 + e), "optimizer_state_bytes": 8.0 * PARAMS[size],
                        "peak_memory_bytes": 3e7 * (1 + e / 10), "speedup": 1.0}
                out.append(base)
                for opt, s in TRUTH.items():
                    out.append({**base, "optimizer": opt, "speedup": s * (1 + e * (1 + seed % 2)),
                                "final_eval_loss": base["final_eval_loss"] - 0.02 * s - e / 5,
                                "tokens_to_target": base["tokens_to_target"] / s * (1 + e),
                                "optimizer_state_bytes": 4.0 * PARAMS[size]})
    return out


def _analysis(sizes: tuple[str, ...], ratios: tuple[float | None, ...]) -> Analysis:
    records = [RunRecord.from_row(r) for r in _records(sizes, ratios)]
    cells = [cell_label(s, t) for s in sizes for t in ratios]
    an = Analysis(records=records, model_sizes=list(sizes), ratios=[t for t in ratios if t is not None],
                  sizes=cells, optimizers=["adamw", "lion", "muon"], all_records=records)
    an.cell_size = {cell_label(s, t): s for s in sizes for t in ratios}
    an.cell_tpp = {cell_label(s, t): t for s in sizes for t in ratios}
    an.verdicts = verdict_table(grid_families(records))
    return an


MAIN_JOB = ("tiny",), (1.0, 2.0)  # one size, two data ratios: only the data axis has a verdict
SIZE_ONLY = ("tiny", "mini"), (None,)  # one ratio, two sizes: the single-axis report


def _margins(legend: str) -> dict[str, str]:
    """{metric label: margin} as the legend's "Margins: 3 % for speedup (...); 2 % for a, b" states them."""
    text = re.search(r"Margins(?: \([^)]*\))?: (.*?)\. ", legend).group(1)
    out = {}
    for margin, labels in re.findall(r"(\S+(?: %| nats)?) for ([^;]+)", text):
        out.update(dict.fromkeys(labels.split(", "), margin))
    return out


@pytest.mark.parametrize("shape", [MAIN_JOB, SIZE_ONLY])
def test_the_ratio_legend_states_each_column_s_margin_and_the_intervals_confidence(shape) -> None:  # noqa: ANN001
    an = _analysis(*shape)
    legend = ratio_legend(an)
    margins = _margins(legend)
    points = []
    for spec in (s for s in METRICS if s.mode == "ratio"):
        for opt in ("lion", "muon"):
            for cell in an.sizes:
                v, p = an.point(opt, spec.key, cell)
                if p is None:
                    continue
                points.append(p)
                assert margins[spec.label] == f"{100 * math.expm1(p.margin):.3g} %", spec.label  # the margin it used
    assert margins["speedup (AdamW-equivalent data)"] == "3 %" and margins["optimizer state"] == "2 %"
    # the confidence stated is the one each interval was computed at: half the cell's Holm level, not the level
    assert _stated_range(legend) == _range(p.level for p in points)
    assert _stated_range(legend) != _range(2 * p.level for p in points)  # what "at the level Holm gave" would be


def _stated_range(legend: str) -> tuple[str, str]:
    low, high = re.search(r"(\d+\.\d+ %)(?: to (\d+\.\d+ %))? here", legend).groups()
    return low, high or low


def _range(levels) -> tuple[str, str]:  # noqa: ANN001
    levels = list(levels)
    return confidence_text(max(levels)), confidence_text(min(levels))


def test_the_confidence_stated_is_the_one_the_interval_was_computed_at() -> None:
    """Recomputed from the paired differences: Muon's speedup interval at 2 tok/param is a t interval at half its
    cell's Holm level, and that is the confidence the legends and its Evidence row state."""
    an = _analysis(*MAIN_JOB)
    v, p = an.point("muon", "speedup", "tiny @ 2 tok/param")
    diffs = [-math.log(r["speedup"]) for r in an.records if r["optimizer"] == "muon" and r["budget_tpp"] == 2.0]
    _, _, low, high = t_interval(diffs, v.level / 2)
    assert (p.ci_low, p.ci_high) == pytest.approx((low, high))
    assert f"intervals {confidence_text(v.level / 2)}" in v.evidence
    shown = [q for w in an.verdicts if w.axis == "data" for q in w.points]
    assert p.level == v.level / 2 and p in shown
    assert _stated_range(data_legend(an)) == _range(q.level for q in shown)
    _, _, low_holm, _ = t_interval(diffs, v.level)  # the interval the old legend described: narrower
    assert low_holm > low


@pytest.mark.parametrize("shape", [MAIN_JOB, SIZE_ONLY])
def test_the_verdict_legends_state_the_margins_and_holm_levels_their_cells_used(shape) -> None:  # noqa: ANN001
    an = _analysis(*shape)
    legend = data_legend(an) if an.multi else verdict_legend(an)
    judged = [v for v in an.verdicts if v.axis == ("data" if an.multi else "size") and v.points]
    margins = _margins(legend)
    for v in judged:
        expected = (f"{100 * math.expm1(v.metric.margin):.3g} %" if v.metric.mode == "ratio"
                    else f"{v.metric.margin:g}" + (f" {v.metric.unit}" if v.metric.unit else ""))
        assert margins[v.metric.label] == expected and all(p.margin == v.metric.margin for p in v.points)
    levels = [v.level for v in judged if v.p_value is not None]
    assert holm_range(judged) in legend
    assert f"{min(levels):.2g}" in holm_range(judged) and f"{max(levels):.2g}" in holm_range(judged)


@pytest.mark.parametrize("shape", [MAIN_JOB, SIZE_ONLY])
def test_p_is_defined_in_every_report_that_prints_one(shape, tmp_path: Path) -> None:  # noqa: ANN001
    """The main job's report (one size: no size-axis legend) printed p in every Evidence row and defined it nowhere."""
    an = _analysis(*shape)
    doc = Doc()
    verdict_section(doc, an, {})
    text = doc.markdown(tmp_path)
    evidence = text.split("### Evidence", 1)[1]
    assert "cell p " in evidence
    assert "cell p = 2 × min(p at <largest point>, trend p)" in evidence and "\"tested at\"" in evidence
    for v in an.verdicts:
        if v.points:
            assert f"intervals {confidence_text(v.level / 2)}" in v.evidence
    # the range the legend states is that of the rows the table shows (the main job's: the data axis only)
    rows = [v for v in an.verdicts if not an.multi or v.axis == "data"]
    legend = next(p for p in evidence.split("\n\n") if p.startswith("Evidence: each row"))
    assert _stated_range(legend) == _range(p.level for v in rows for p in v.points)


def test_legend_lines_of_the_main_job_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the legends of a report in the main job's shape (run with -s to read them): the lead pastes the real
    ones after rerunning the demo."""
    an = _analysis(*MAIN_JOB)
    for legend in (data_legend(an), evidence_legend(an.verdicts), ratio_legend(an)):
        print(legend, end="\n\n")
    out = capsys.readouterr().out
    assert "Margins: 3 % for speedup (AdamW-equivalent data); 0.01 nats for final eval loss" in out
