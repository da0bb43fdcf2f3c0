"""The attribution table's intervals: the fully tuned speedup is the answer table's own, widened where the second
tuning draw widened it, and the attributed speedup is widened by the same shift under the same rule (runs that
repeat the fully tuned ones exactly read exactly alike)."""

from __future__ import annotations

import re
import shutil

import pytest

from hf_optbench.report.analysis import Analysis, analyse
from hf_optbench.report.sections.attribution import attribution_levels, attribution_table
from hf_optbench.report.short_report import headline_tables

from fixtures.study_fixture import add_second_draw, grid_sweep

INTERVAL = re.compile(r"^(≥ |≤ )?[\d.]+ \[[\d.e+-]+, [\d.e+-]+\] \w+")


@pytest.fixture(scope="module")
def widened(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    """Muon 2x faster at tiny over two data ratios; a second draw moved its pick at 1 tok/param (its runs 0.02 nats
    higher: the interval widened there, and borrowed at 2 tok/param); attribution runs that repeat Muon's runs."""
    root = grid_sweep(tmp_path_factory.mktemp("attr"), {1.0: {"muon": 2.0}, 2.0: {"muon": 2.0}}, sizes=("tiny",))
    add_second_draw(root, ("tiny", 1.0), "muon", loss_shift=0.02)
    attribution = root / "attribution" / "runs"
    attribution.mkdir(parents=True)
    for run in (root / "runs").glob("muon__*"):
        shutil.copytree(run, attribution / run.name)
    return analyse(root)


def test_the_fully_tuned_speedup_has_the_answer_table_s_interval_and_the_attributed_one_its_widening(
        widened: Analysis) -> None:
    an = widened
    assert any(a.point.widened and a.optimizer == "muon" and a.key == "speedup" for a in an.tuning_noise.applied)
    (_, header, answer), *_ = headline_tables(an, "speedup")
    muon = next(r for r in answer if r[0] == "muon")
    header_a, rows = attribution_table(an, "adamw")
    full, attributed = header_a.index("speedup, fully tuned"), header_a.index("speedup")
    for row in rows:
        cell = row[1]
        shown = muon[header.index(cell.split(" @ ")[1])]  # "2.1 [1.7, 2.6] ahead; draw x0.9, widened"
        assert INTERVAL.match(row[full]).group(0) == INTERVAL.match(shown).group(0), (row, shown)
        # the attribution runs are Muon's runs again: the same figure, the same widened interval
        assert row[attributed] == row[full]
    assert "widened by the same tuning draw's shift" in attribution_levels(an)
