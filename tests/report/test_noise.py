"""Wall-clock figures this machine cannot measure get no verdict word (issue 29: identical reruns flipped Lion's
seconds-to-target verdict)."""

from __future__ import annotations

import json
from pathlib import Path

from hf_optbench.report.analysis import analyse

from fixtures.sweep_fixture import build_fixture_sweep


def test_figures_measured_while_runs_shared_the_machine_are_not_measurable_here(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0, 1, 2))
    alone = analyse(root)
    cell = next(v for v in alone.verdicts if v.metric.key == "seconds_to_target")
    assert cell.verdict != "not measurable here"
    for path in (root / "runs").glob("*/summary.json"):  # as a sweep with launcher.jobs 2 records it
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({**summary, "concurrent_runs": 2}))
    shared = analyse(root)
    cell = next(v for v in shared.verdicts if v.metric.key == "seconds_to_target")
    assert cell.verdict == "not measurable here" and cell.points == []
    assert "measured with 2 runs at once sharing the machine" in cell.evidence and "jobs: 1" in cell.evidence
    others = [v for v in shared.verdicts if v.verdict != "not measurable here"]
    assert {v.family for v in others} == {len(others)}  # the family Holm controls leaves it out
