"""rundir: the one write-then-rename helper, the run-id format and the summary reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    atomic_path,
    parse_run_id,
    read_summary,
    run_id_for,
    write_json_atomic,
    write_text_atomic,
)


def test_atomic_path_replaces_on_success_and_keeps_the_old_file_on_error(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path  # a writer that picks the format by name works
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]  # no temporary left behind
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_json_and_text_writers(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "summary.json", {"b": 1, "a": 2})
    assert (tmp_path / "summary.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert write_text_atomic(tmp_path / "x.csv", "a\r\nb") == tmp_path / "x.csv"
    assert (tmp_path / "x.csv").read_bytes() == b"a\r\nb"  # exactly as given


def test_run_ids_round_trip() -> None:
    assert run_id_for("lion", "mini", 1, 0.5) == "lion__mini__s1__lrx0.5"
    assert parse_run_id("lion__mini__s1__lrx0.5") == {"optimizer": "lion", "model_size": "mini", "seed": 1,
                                                     "lr_multiplier": 0.5}
    assert parse_run_id("not-a-sweep-run") == {}
    rid = run_id_for("adamw", "midi", 2, 2.0, wd_multiplier=3.0, budget_multiple=0.5)
    assert rid == "adamw__midi__s2__lrx2__wdx3__dx0.5"
    assert parse_run_id(rid) == {"optimizer": "adamw", "model_size": "midi", "seed": 2, "lr_multiplier": 2.0,
                                 "wd_multiplier": 3.0, "budget_multiple": 0.5}
    assert parse_run_id("adamw__tiny__s1__dx4") == {"optimizer": "adamw", "model_size": "tiny", "seed": 1,
                                                   "budget_multiple": 4.0}


def test_read_summary_optional_or_required(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None
    with pytest.raises(OptBenchError, match="no summary.json"):
        read_summary(tmp_path, required=True)
    (tmp_path / "summary.json").write_text("{torn")
    assert read_summary(tmp_path) is None
    with pytest.raises(OptBenchError, match="not valid JSON"):
        read_summary(tmp_path, required=True)
