"""ns_precision auto by measurement: the choice from injected timings, the cache's keys, and one real measurement's
shape (not its speed: no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from hf_optbench.optim import muon_precision
from hf_optbench.optim.muon_precision import (
    ACCURACY_LIMIT,
    choose,
    gpt2_matrix_shapes,
    measured_choice,
    shapes_key,
)


@pytest.mark.parametrize(("bf16_ms", "fp32_ms", "error", "picked", "said"), [
    (1.0, 2.0, 0.01, "bf16", "bf16 is faster"),
    (3.0, 2.0, 0.01, "fp32", "fp32 is faster"),
    (2.0, 2.0, 0.01, "fp32", "fp32 is faster"),  # a tie keeps the reference precision
    (1.0, 2.0, 0.2, "fp32", "over the limit"),  # faster but not within the accuracy check
])
def test_the_faster_precision_that_passes_the_accuracy_check_is_chosen(bf16_ms, fp32_ms, error, picked, said):
    precision, why = choose({"bf16_ms": bf16_ms, "fp32_ms": fp32_ms, "bf16_error": error})
    assert precision == picked and said in why
    assert f"bf16 {bf16_ms:.2f} ms, fp32 {fp32_ms:.2f} ms" in why


def test_the_accuracy_limit_is_above_bf16_s_rounding_and_below_a_different_result():
    assert choose({"bf16_ms": 1, "fp32_ms": 2, "bf16_error": 0.018})[0] == "bf16"  # the largest measured rounding
    assert choose({"bf16_ms": 1, "fp32_ms": 2, "bf16_error": ACCURACY_LIMIT * 1.01})[0] == "fp32"


def test_shapes_are_keyed_by_oriented_shape_and_count():
    shapes = gpt2_matrix_shapes(2, 64)
    assert len(shapes) == 8 and (256, 64) in shapes and (64, 256) in shapes
    assert shapes_key(shapes) == "2x64x64,2x64x192,4x64x256"  # c_fc and the tall MLP c_proj share one stack
    assert shapes_key(reversed(shapes)) == shapes_key(shapes)


def test_measured_once_per_machine_and_shapes_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    calls = []

    def timer(shapes):
        calls.append(shapes_key(shapes))
        return {"bf16_ms": 1.0, "fp32_ms": 2.0, "bf16_error": 0.01, "bf16_timed": True}

    tiny, mini = gpt2_matrix_shapes(2, 64), gpt2_matrix_shapes(4, 128)
    first = measured_choice(tiny, tmp_path, timer=timer)
    assert first[0] == "bf16" and "measured now" in first[1]
    monkeypatch.setattr(muon_precision, "_MEMO", {})  # a new process
    assert measured_choice(tiny, tmp_path, timer=timer)[0] == "bf16"
    measured_choice(mini, tmp_path, timer=timer)
    assert calls == [shapes_key(tiny), shapes_key(mini)]
    data = json.loads((tmp_path / "ns_precision.json").read_text())
    ((machine, entries),) = data.items()
    assert "torch" in machine and "bf16 native" in machine and set(entries) == {shapes_key(tiny), shapes_key(mini)}
    monkeypatch.setattr(muon_precision, "machine_key", lambda: "another CPU | torch 9 | AVX2 | bf16 native False")
    measured_choice(tiny, tmp_path, timer=lambda s: {"bf16_ms": 30.0, "fp32_ms": 2.0, "bf16_error": 0.01})
    data = json.loads((tmp_path / "ns_precision.json").read_text())
    assert len(data) == 2 and machine in data  # the other machine's entries are kept
    assert measured_choice(tiny, None, timer=timer)[1].endswith("[measured in this process]")


def test_a_real_measurement_has_both_timings_and_bf16_s_distance():
    record = muon_precision.measure(gpt2_matrix_shapes(1, 16))
    assert record["bf16_ms"] > 0 and record["fp32_ms"] > 0 and 0 < record["bf16_error"] < ACCURACY_LIMIT
