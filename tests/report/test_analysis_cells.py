"""Cells as file names, and tuning runs of cells a narrowed sweep no longer has."""

from __future__ import annotations

from hf_optbench.report.analysis import Analysis, _drop_leftover_tuning
from hf_optbench.study.records import RunRecord


def test_a_cell_s_file_key_never_holds_a_slash_or_a_space() -> None:
    an = Analysis(records=[])
    an.cell_size, an.cell_tpp = {"nano @ 2 tok/param": "nano"}, {"nano @ 2 tok/param": 2.0}
    assert an.file_key("nano @ 2 tok/param") == "nano__tpp2"
    assert an.file_key("nano @ 38.4 tok/param") == "nano_38.4_tok_param"  # not a cell of the sweep: still one name


def test_tuning_runs_of_a_removed_ratio_are_named_and_left_out() -> None:
    an = Analysis(records=[])
    an.sizes = ["nano @ 2 tok/param"]
    keep = RunRecord("nano__s0__tpp2", model_size="nano", budget_tpp=2.0, lr_multiplier=1.0)
    gone = [RunRecord(f"nano__s{seed}__tpp38.4__lrx2", model_size="nano", budget_tpp=38.4, lr_multiplier=2.0)
            for seed in (0, 1)]
    an.tuning = [keep, *gone]
    _drop_leftover_tuning(an)
    assert an.tuning == [keep]
    assert an.notes == ["2 tuning run(s) of cell(s) this sweep no longer has (nano @ 38.4 tok/param): listed under "
                        "Runs, left out of the tuning curves"]


def test_a_report_during_a_sweep_s_tuning_says_the_sweep_has_no_compared_run_yet(tmp_path) -> None:
    """A sweep that has written its manifest and is tuning: not "run hf-optbench sweep first" (it is running)."""
    import json

    import pytest

    from hf_optbench.errors import OptBenchError
    from hf_optbench.report.analysis import analyse

    sweep = tmp_path / "sweep"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "sweep_manifest.json").write_text(json.dumps({"name": "s", "runs": []}))
    tuning_run = sweep / "tuning" / "runs" / "adamw__tiny__s0__lrx1"
    tuning_run.mkdir(parents=True)
    (tuning_run / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(OptBenchError) as err:
        analyse(sweep)
    text = str(err.value)
    assert "has no compared run yet (its tuning phase has runs" in text and "report` again once" in text
    assert "Run `hf-optbench sweep` first" not in text
    with pytest.raises(OptBenchError, match="Run `hf-optbench sweep` first"):
        analyse(tmp_path)  # a folder no sweep wrote
