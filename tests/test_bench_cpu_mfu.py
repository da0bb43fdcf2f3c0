"""benchmarks/bench_cpu_mfu.py runs end to end on tiny settings and writes what it prints (the README's rerun
command keeps working). Timings are not asserted (this machine is too noisy); the loss agreement of the two GELUs is
a numerical fact and is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_bench_cpu_mfu_runs_and_writes_its_results(tmp_path, capsys):
    import bench_cpu_mfu

    out = tmp_path / "cpu_mfu.json"
    assert bench_cpu_mfu.main(["--sizes", "tiny", "--rounds", "2", "--steps", "3", "--skip", "1", "--block", "16",
                               "--gemm-sizes", "64", "--gemm-seconds", "0.05", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["threads"] == 1 and res["gemm"]["peak_gflops"] == res["gemm"]["best"]["64"] > 0
    (row,) = res["rows"]
    assert row["size"] == "tiny" and row["steps_per_variant"] == 2 * 3
    for act in ("gelu_new", "gelu_pytorch_tanh"):
        assert row[act]["median_step_ms"] > 0 and row[act]["mfu"] > 0
    assert row["per_round_ratio_range"][0] <= row["per_round_ratio_range"][1]
    assert row["max_abs_loss_diff"] < 1e-4  # the same function: the two runs' losses agree to float rounding
    assert "| tiny | 0.11M |" in capsys.readouterr().out
