"""docs/results/cpu_study_v1/primary_family.md is what docs/notes/primary_from_summary.py computes from the committed
summary.csv: the study's primary family under today's rules, regenerated here and compared byte for byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hf_optbench.measure.primary import ReportSpec
from hf_optbench.measure.verdict import grid_families, verdict_table

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs" / "results" / "cpu_study_v1"
TRANSIENT = ["nano@0.15", "nano@0.5", "tiny@0.15"]  # the committed report's regime line


def _script():
    spec = importlib.util.spec_from_file_location("primary_from_summary", ROOT / "docs" / "notes" /
                                                  "primary_from_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_primary_family_is_what_the_code_computes_from_the_committed_rows() -> None:
    mod = _script()
    assert "transient (at or above it): nano @ 0.15 tok/param, nano @ 0.5 tok/param, tiny @ 0.15 tok/param" in \
        (STUDY / "report.md").read_text(encoding="utf-8")
    rows = mod.compared_rows(STUDY / "summary.csv")
    cells = frozenset((c.split("@")[0], float(c.split("@")[1])) for c in TRANSIENT)
    verdicts = verdict_table(grid_families(rows, metrics=(mod.SPEEDUP,), transient=cells), report=ReportSpec())
    text = mod.render(verdicts, STUDY / "summary.csv", TRANSIENT)
    assert text == (STUDY / "primary_family.md").read_text(encoding="utf-8")
    muon_tiny = next(v for v in verdicts if v.optimizer == "muon" and v.axis == "data" and v.at == "tiny")
    assert [p.transient for p in muon_tiny.points] == [True, False, False]
    assert {v.family for v in verdicts if v.p_value is not None} == {9}
