"""study.records: a run directory's record. A summary.json that is there but unreadable (cut short by a full disk
or a kill of a copy) is never counted as a finished run, even when the state file recorded the run's end as
completed (issue 32: the tuner then blamed a missing tuning_blocks); a run directory moved aside is not a run."""

from __future__ import annotations

import json
from pathlib import Path

from hf_optbench.study.records import is_run_dir_name, load_runs


def test_a_truncated_summary_is_no_finished_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "adamw__tiny__s0__lrx1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"status": "completed", "final_tuning_lo')
    (tmp_path / "sweep_state.jsonl").write_text(json.dumps(
        {"event": "end", "run_id": run.name, "attempt": 1, "status": "completed", "time": 1.0}) + "\n")
    (record,) = load_runs(tmp_path)
    assert record["status"] == "failed" and f"{run / 'summary.json'} is unreadable" in record["error"]


def test_directories_moved_aside_or_hidden_are_no_runs() -> None:
    assert is_run_dir_name("adamw__tiny__s0__lrx0.5")
    for name in ("adamw__tiny__s0.incomplete-1", "adamw__tiny__s0__lrx0.5.changed-2", ".hf_optbench_stage-abc"):
        assert not is_run_dir_name(name), name


def test_a_runs_data_ratio_is_read_from_its_id_and_names_its_cell(tmp_path: Path) -> None:
    """In a sweep with several data ratios the record carries its ratio (``budget_tpp``, from the id's ``__tpp``
    part) and the report's cell; a single-ratio run's cell is its size."""
    from hf_optbench.study.records import Cell

    for rid in ("adamw__tiny__s1__tpp0.5__dx2", "adamw__tiny__s1"):
        run = tmp_path / "runs" / rid
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "model_size": "tiny", "max_steps": 8}))
    single, ladder = load_runs(tmp_path)  # sorted by id
    assert (ladder["budget_tpp"], ladder["budget_multiple"], ladder["cell"]) == (0.5, 2.0, "tiny @ 0.5 tok/param")
    assert (single["budget_tpp"], single["cell"]) == (None, "tiny")
    assert Cell("mini", 2.0).label == "mini @ 2 tok/param" and Cell("mini").label == "mini"


def test_the_tuned_files_of_a_sweep_are_found_per_ratio(tmp_path: Path) -> None:
    from hf_optbench.study.tuning_phase import tuned_files

    assert tuned_files(tmp_path) == {}
    for name in ("tuned_hparams__tpp2.yaml", "tuned_hparams__tpp0.15.yaml", "tuned_hparams__tppx.yaml"):
        (tmp_path / name).write_text("{}\n")
    assert tuned_files(tmp_path) == {0.15: tmp_path / "tuned_hparams__tpp0.15.yaml",
                                     2.0: tmp_path / "tuned_hparams__tpp2.yaml"}
    (tmp_path / "tuned_hparams.yaml").write_text("{}\n")
    assert list(tuned_files(tmp_path))[0] is None


def test_a_record_reads_as_its_flat_row_and_derived_columns_make_a_new_record(tmp_path: Path) -> None:
    """The record's dict form is the row summary.csv and the dict readers see (every column, the cell's label,
    summary.json whole), and from_row reads it back; with_columns leaves the record it came from as it was."""
    import dataclasses

    import pytest

    from hf_optbench.study.records import SUMMARY_COLUMNS, Cell, RunRecord, load_records

    run = tmp_path / "runs" / "adamw__tiny__s1__tpp0.5"
    run.mkdir(parents=True)
    summary = {"status": "completed", "model_size": "tiny", "max_steps": 8, "final_eval_loss": 4.2, "env": {}}
    (run / "summary.json").write_text(json.dumps(summary))
    (record,) = load_records(tmp_path)
    row = dict(record)
    assert list(row) == [*SUMMARY_COLUMNS, "wd_multiplier", "cell", "_summary"]
    assert row["cell"] == "tiny @ 0.5 tok/param" and row["_summary"] == summary and row["final_eval_loss"] == 4.2
    assert record.cell == Cell("tiny", 0.5) and record.summary == summary and record.figure("env") == {}
    assert RunRecord.from_row(row) == record and dict(RunRecord.from_row(row)) == row
    derived = record.with_columns({"speedup": 1.5, "final_eval_loss": None, "status": "diverged"})
    assert (derived["speedup"], derived["final_eval_loss"], derived.status) == (1.5, None, "diverged")
    assert "speedup" not in record and record["final_eval_loss"] == 4.2 and record.status == "completed"
    assert list(derived)[-1] == "speedup"
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = "failed"  # type: ignore[misc]
