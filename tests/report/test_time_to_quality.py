"""Issue 40's time to quality on constructed calibration files: the speedup in time is the token speedup over the
step-time ratio, its interval the token interval over the ratio's range; a missing, malformed or other-shape
calibration is said, never guessed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.measure.verdict import SizeComparison
from hf_optbench.report.time_to_quality import (
    CALIBRATION_FILE,
    Ratio,
    read_calibration,
    step_ratio,
    time_line,
    time_speedup,
)

from fixtures.study_fixture import add_calibration


def _point(speedup: float, low: float, high: float) -> SizeComparison:
    import math

    return SizeComparison("tiny", 1e5, -math.log(speedup), 0.1, -math.log(high), -math.log(low), "ahead", 5, 0.0,
                          0.0, margin=math.log(1.03), higher_is_better=True)


def test_the_speedup_in_time_divides_by_the_step_ratio_and_its_range() -> None:
    p = _point(2.0, 1.6, 2.5)
    value, low, high, where = time_speedup(p, Ratio(1.6, 1.5, 1.7))
    assert value == pytest.approx(1.25) and low == pytest.approx(1.6 / 1.7) and high == pytest.approx(2.5 / 1.5)
    assert where == "no difference"  # 0.94 to 1.67 straddles 1
    assert time_speedup(_point(2.0, 1.9, 2.1), Ratio(1.2, 1.1, 1.3))[3] == "ahead"
    assert time_speedup(_point(1.1, 1.05, 1.15), Ratio(2.0, 1.9, 2.1))[3] == "behind"


def test_the_ratio_uses_the_slowest_and_fastest_rounds(tmp_path: Path) -> None:
    add_calibration(tmp_path, {("adamw", "tiny"): 10.0, ("muon", "tiny"): 18.0}, spread=0.1)
    cal, why = read_calibration(tmp_path)
    assert why == "" and cal is not None
    r, _ = step_ratio(cal, "muon", "tiny", 256)
    assert r == Ratio(pytest.approx(1.8), pytest.approx(16.2 / 11.0), pytest.approx(19.8 / 9.0))
    assert step_ratio(cal, "lion", "tiny", 256) == (None, "not calibrated (lion at tiny)")
    none, why = step_ratio(cal, "muon", "tiny", 512)
    assert none is None and "calibrated at 256 tokens/step, compared at 512" in why
    assert cal.steps[("muon", "tiny")].ns_precision == "bf16" and cal.steps[("adamw", "tiny")].ns_precision is None
    assert "Fixture CPU 9000 (AVX512, bf16 not native), device cpu, 1 thread(s)" in cal.machine_text()


def test_no_file_says_how_to_get_one_and_a_bad_one_says_why(tmp_path: Path) -> None:
    cal, why = read_calibration(tmp_path)
    assert cal is None and "no step calibration" in why and "`hf-optbench sweep` writes it" in why
    an = SimpleNamespace(sweep_dir=tmp_path, optimizers=["adamw", "muon"], sizes=[])
    assert time_line(an).startswith("Speedup in time: not measured (no step calibration")
    path = add_calibration(tmp_path, {("adamw", "tiny"): 10.0})
    data = json.loads(path.read_text())
    for broken, message in (({**data, "schema": 2}, "schema 2, expected 1"),
                            ({**data, "machine": {"cpu_model": "x"}}, "machine must hold"),
                            ({**data, "entries": [{**data["entries"][0], "spread": [0.02, 0.03]}]},
                             "does not hold the median")):
        (tmp_path / CALIBRATION_FILE).write_text(json.dumps(broken))
        cal, why = read_calibration(tmp_path)
        assert cal is None and message in why and "could not be read" in why
