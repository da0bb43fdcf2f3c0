"""benchmarks/bench_real_memory.py end to end on the `tiny` size for two optimizers: one child process per row,
the measured optimizer-state bytes equal the planner's, the peak RSS and the RSS after build are recorded, and a
CUDA-only optimizer is listed as skipped with its reason rather than dropped."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_real_memory.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_real_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_two_optimizers_measured_equals_planned(tmp_path: Path, capsys) -> None:
    bench = _load()
    out = tmp_path / "rows.json"
    assert bench.main(["--sizes", "tiny", "--only", "adamw", "lion", "paged_adamw_8bit", "--steps", "2",
                       "--vocab-size", "512", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = {r["optimizer"]: r for r in data["rows"]}
    assert set(rows) == {"adamw", "lion", "paged_adamw_8bit"}
    for name in ("adamw", "lion"):
        r = rows[name]
        assert r["status"] == "ok", r["reason"]
        assert r["steps_done"] == 2
        assert r["measured_state_bytes"] == r["planned_state_bytes"] > 0
        assert r["measured_num_params"] == r["num_params"]
        assert r["peak_rss_bytes"] >= r["rss_after_build_bytes"] > 0
        assert r["s_per_step"] > 0
    # AdamW keeps two fp32 moments (+ a 0-d step per tensor), Lion one
    assert 8.0 <= rows["adamw"]["state_bytes_per_param"] < 8.1
    assert rows["lion"]["state_bytes_per_param"] == 4.0
    assert rows["paged_adamw_8bit"]["status"] == "skipped"
    assert "CUDA" in rows["paged_adamw_8bit"]["reason"]
    assert data["mismatches"] == []
    assert "| tiny |" in printed and "equal the planner's in all 2 measured rows" in printed
