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
