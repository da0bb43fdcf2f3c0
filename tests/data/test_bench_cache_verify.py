"""The cache-checksum benchmark runs end to end on a small entry and reports every figure it promises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cache_verify.py"


def test_bench_cache_verify_runs(capsys):
    spec = importlib.util.spec_from_file_location("bench_cache_verify", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (row,) = mod.main(["--mb", "1", "--sources", "synthetic", "--repeats", "1"])
    assert 0.5 < row["entry_mb"] < 1.5
    assert all(row[k] > 0 for k in ("build_s", "write_s", "verify_s", "hit_verified_s", "sha256_gb_s", "blake2b_gb_s"))
    out = capsys.readouterr().out
    assert "| synthetic |" in out and "sha256 GB/s" in out
