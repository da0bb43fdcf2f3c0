"""The sensitivity table's bracketing: what the sweep's tuned file records (the tuning rule wrote it) wins over
what the tuning runs alone would say, and the runs answer only for a pair the tuned files do not have."""

from __future__ import annotations

from pathlib import Path

import yaml

from hf_optbench.report.analysis import analyse
from hf_optbench.report.sections.hyperparameters import sensitivity_table
from hf_optbench.report.tuning_curves import bracketed_from_records, tuned_bracketing

from fixtures.sweep_fixture import build_fixture_sweep


def test_the_tuned_file_s_bracketing_wins_over_the_runs(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0,),
                               lr_multipliers=[0.5, 1.0, 2.0], tuning_loss=True)
    an = analyse(root)
    from_runs = bracketed_from_records(an.tuning)
    assert set(from_runs) == {("adamw", "tiny"), ("lion", "tiny")}
    assert tuned_bracketing(root) == {} and sensitivity_table(an.tuning, tuned_bracketing(root)) == \
        sensitivity_table(an.tuning)
    # the file has adamw only, and says the opposite of the runs: the file wins there, the runs answer for lion
    (root / "tuned_hparams.yaml").write_text(yaml.safe_dump(
        {"adamw": {"tiny": {"learning_rate": 1e-3, "multiplier": 1.0, "bracketed": not from_runs[("adamw", "tiny")]}}}))
    tuned = tuned_bracketing(root)
    assert tuned == {("adamw", "tiny"): not from_runs[("adamw", "tiny")]}
    _, rows = sensitivity_table(an.tuning, tuned)
    said = {(r[0], r[1]): r[-1] == "yes" for r in rows}
    assert said == {("adamw", "tiny"): tuned[("adamw", "tiny")], ("lion", "tiny"): from_runs[("lion", "tiny")]}
