"""Training time per process segment, with one-time start-up (DeepSpeed's engine and op builds) timed apart."""

from __future__ import annotations

import time
from types import SimpleNamespace

from hf_optbench.run.segments import SegmentRecorder


def _state(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=True)


def test_start_up_before_the_first_step_is_not_training_time(tmp_path) -> None:
    seg = SegmentRecorder(tmp_path)
    seg.start_clock()
    time.sleep(0.3)  # what train() does before on_train_begin: DeepSpeed init, an op build, a checkpoint load
    seg.on_train_begin(None, _state(0), None)
    time.sleep(0.05)
    seg.on_train_end(None, _state(5), None)
    summary = seg.summary()
    assert summary["startup_s"] >= 0.3 and summary["train_runtime_s"] < 0.3
    assert summary["train_segments"][0]["end_step"] == 5


def test_a_resumed_run_sums_both_figures_over_its_segments(tmp_path) -> None:
    first = SegmentRecorder(tmp_path)
    first.start_clock()
    first.on_train_begin(None, _state(0), None)
    first.on_train_end(None, _state(3), None)
    second = SegmentRecorder(tmp_path, resume=True)
    second.start_clock()
    time.sleep(0.1)
    second.on_train_begin(None, _state(3), None)
    second.on_train_end(None, _state(6), None)
    summary = second.summary()
    assert [s["start_step"] for s in summary["train_segments"]] == [0, 3]
    assert summary["startup_s"] >= 0.1
    assert summary["startup_s"] == round(sum(s["startup_s"] for s in summary["train_segments"]), 6)
