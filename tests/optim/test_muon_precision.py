"""ns_precision auto by measurement: the choice from injected timings, the cache's keys, and one real measurement's
shape (not its speed: no timing is asserted)."""

from __future__ import annotations

import json
import threading
import time

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
    (1.9, 2.0, 0.01, "fp32", "faster by less than 10%"),  # a near race too (MARGIN)
    (1.7, 2.0, 0.01, "bf16", "bf16 is faster"),
    (1.0, 2.0, 0.2, "fp32", "over the limit"),  # faster but not within the accuracy check
])
def test_the_faster_precision_that_passes_the_accuracy_check_is_chosen(bf16_ms, fp32_ms, error, picked, said):
    precision, why = choose({"bf16_ms": bf16_ms, "fp32_ms": fp32_ms, "bf16_error": error})
    assert precision == picked and said in why
    assert f"bf16 {bf16_ms:.2f} ms, fp32 {fp32_ms:.2f} ms per Newton-Schulz pass" in why


@pytest.mark.parametrize(("native", "said"), [(False, "(bf16 matmuls emulated here)"), (True, "(bf16 matmuls native)")])
def test_bf16_not_timed_past_one_hopeless_pass_is_not_chosen_and_the_reason_says_so(native, said):
    precision, why = choose({"bf16_ms": 30.0, "fp32_ms": 2.0, "bf16_error": 0.01, "bf16_timed": False,
                             "bf16_native": native})
    assert precision == "fp32" and "not timed further" in why and said in why


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
    assert measured_choice(tiny, None, timer=timer)[1].endswith("[kept in this process]")
    muon_precision._MEMO.clear()
    assert measured_choice(tiny, None, timer=timer)[1].endswith("[measured now, kept in this process]")


def _timer(bf16_ms: float, fp32_ms: float, calls: list[str], error: float = 0.01, wait: float = 0.0):
    """An injected timer: records its call and answers the given timings (after ``wait`` seconds)."""
    def timer(shapes):
        calls.append(shapes_key(shapes))
        time.sleep(wait)
        return {"bf16_ms": bf16_ms, "fp32_ms": fp32_ms, "bf16_error": error, "bf16_timed": True}
    return timer


@pytest.mark.parametrize(("bf16_ms", "fp32_ms", "picked"), [(1.0, 2.0, "bf16"), (2.0, 1.0, "fp32")])
def test_either_outcome_is_taken_cached_and_then_read_whatever_a_later_timer_says(tmp_path, monkeypatch, bf16_ms,
                                                                                  fp32_ms, picked):
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    calls: list[str] = []
    tiny = gpt2_matrix_shapes(2, 64)
    precision, why = measured_choice(tiny, tmp_path, timer=_timer(bf16_ms, fp32_ms, calls))
    assert precision == picked and why.startswith("auto: measured Newton-Schulz") and "measured now" in why
    assert f"bf16 {bf16_ms:.2f} ms, fp32 {fp32_ms:.2f} ms" in why
    monkeypatch.setattr(muon_precision, "_MEMO", {})  # another process: the file answers
    again = measured_choice(tiny, tmp_path, timer=_timer(fp32_ms, bf16_ms, calls))  # the opposite timing, unused
    assert again[0] == picked and f"[cached in {tmp_path / 'ns_precision.json'}]" in again[1]
    assert calls == [shapes_key(tiny)]


def test_a_key_mismatch_measures_again(tmp_path, monkeypatch):
    """Another torch version (machine key) or another shape set is not read from the cache."""
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    calls: list[str] = []
    tiny, mini = gpt2_matrix_shapes(2, 64), gpt2_matrix_shapes(4, 128)
    measured_choice(tiny, tmp_path, timer=_timer(1.0, 2.0, calls))
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    assert measured_choice(mini, tmp_path, timer=_timer(2.0, 1.0, calls))[0] == "fp32"
    key = muon_precision.machine_key()
    monkeypatch.setattr(muon_precision, "machine_key", lambda: key.replace("| torch ", "| torch 0.0-other "))
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    assert measured_choice(tiny, tmp_path, timer=_timer(2.0, 1.0, calls))[0] == "fp32"
    assert calls == [shapes_key(tiny), shapes_key(mini), shapes_key(tiny)]
    assert len(json.loads((tmp_path / "ns_precision.json").read_text())) == 2


def test_a_record_stored_by_a_concurrent_writer_wins_over_this_measurement(tmp_path, monkeypatch):
    """A process that did not see a record before it measured, and finds one at the write (stored meanwhile by a
    concurrent process), keeps the stored one: its own timing is dropped, so both processes choose alike."""
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    tiny = gpt2_matrix_shapes(2, 64)
    machine, path = muon_precision.machine_key(), tmp_path / "ns_precision.json"
    theirs = {"bf16_ms": 1.0, "fp32_ms": 2.0, "bf16_error": 0.01, "bf16_timed": True, "measured_at": "theirs"}

    def timer(shapes):  # the other process writes while this one times
        path.write_text(json.dumps({machine: {shapes_key(shapes): theirs}}))
        return {"bf16_ms": 2.0, "fp32_ms": 1.0, "bf16_error": 0.01, "bf16_timed": True}

    precision, why = measured_choice(tiny, tmp_path, timer=timer)
    assert precision == "bf16" and "measured by a concurrent process" in why
    assert json.loads(path.read_text())[machine][shapes_key(tiny)]["measured_at"] == "theirs"


def test_concurrent_first_plans_measure_once_and_agree(tmp_path, monkeypatch):
    """Two plans starting together (threads, each with its own lock handle: flock locks per open file): the second
    waits on the lock, then reads the first's record instead of timing."""
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    calls: list[str] = []
    tiny = gpt2_matrix_shapes(2, 64)
    answers = iter([(1.0, 2.0), (2.0, 1.0)])  # the first timer to run says bf16, a second would say fp32
    lock = threading.Lock()

    def timer(shapes):
        with lock:
            bf16_ms, fp32_ms = next(answers)
        return _timer(bf16_ms, fp32_ms, calls, wait=0.3)(shapes)

    start = threading.Barrier(2)
    got: list[tuple[str, str]] = []

    def plan():
        start.wait()
        got.append(measured_choice(tiny, tmp_path, timer=timer))

    threads = [threading.Thread(target=plan) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [shapes_key(tiny)] and [g[0] for g in got] == ["bf16", "bf16"]
    assert sorted("measured now" in why for _, why in got) == [False, True]


def test_a_real_measurement_has_both_timings_and_bf16_s_distance():
    record = muon_precision.measure(gpt2_matrix_shapes(1, 16))
    assert record["bf16_ms"] > 0 and record["fp32_ms"] > 0 and 0 < record["bf16_error"] < ACCURACY_LIMIT
