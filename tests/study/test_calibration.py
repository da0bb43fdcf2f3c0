"""The sweep-end step-time calibration: each compared optimizer x size measured alone, interleaved over rounds, first
steps dropped, written in the schema the report reads (``step_calibration.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.study import calibration as cal
from hf_optbench.study.sweep_spec import load_sweep

QUICK = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart_cpu.yaml")
SMALL = ("--per_device_train_batch_size", "2", "--block_size", "16", "--data_source", "synthetic",
         "--synthetic_vocab_size", "32", "--pad_vocab_to_multiple_of", "1")
ENTRY_KEYS = {"optimizer", "model_size", "tokens_per_step", "ns_precision", "step_time_median_s",
              "step_time_round_medians_s", "spread"}


def _entry(opt: str, *extra: str) -> cal.Entry:
    return cal.Entry(opt, "tiny", (QUICK, *SMALL, "--optimizer", opt, "--model_size", "tiny", *extra))


@pytest.mark.slow
def test_entries_are_measured_interleaved_and_written_in_the_report_s_schema(monkeypatch) -> None:
    """Round r starts at entry r (A B, B A); every round drops its first steps; Muon's entry says its Newton-Schulz
    precision, the others null; two entries that build alike are measured once."""
    order: list[str] = []
    real = cal.build_case

    def build(entry: cal.Entry, scratch: Path) -> cal.Case:
        order.append(entry.optimizer)
        return real(entry, scratch)

    real_steps = cal.time_steps

    def steps(case: cal.Case, n: int) -> list[float]:  # steady step times: every ratio stable after the first rounds
        real_steps(case, n)
        return [0.015 if case.entry.optimizer == "muon" else 0.01] * n

    monkeypatch.setattr(cal, "build_case", build)
    monkeypatch.setattr(cal, "time_steps", steps)
    entries = [_entry("adamw"), _entry("muon", "--optimizer_kwargs", '{"ns_precision": "fp32"}'), _entry("adamw")]
    doc = cal.calibrate(entries, rounds=2, steps=3, warmup=1)
    assert order == ["adamw", "muon", "adamw", "muon", "adamw", "adamw"]
    assert set(doc) == {"schema", "machine", "measured_at", "rounds", "steps_per_round", "first_rounds", "max_rounds",
                        "tolerance", "entries"}
    assert (doc["schema"], doc["rounds"], doc["steps_per_round"], doc["first_rounds"], doc["max_rounds"]) == \
        (1, 2, 3, 2, 4)
    assert set(doc["machine"]) == {"cpu_model", "cpu_capability", "bf16_native", "torch", "device", "threads", "host",
                                   "slurm_job_id"}
    assert doc["machine"]["device"] == "cpu" and isinstance(doc["machine"]["bf16_native"], bool)
    rows = {r["optimizer"]: r for r in doc["entries"]}
    assert len(doc["entries"]) == 2 and all(set(r) == ENTRY_KEYS for r in doc["entries"])
    assert rows["muon"]["ns_precision"] == "fp32" and rows["adamw"]["ns_precision"] is None
    for row in doc["entries"]:
        assert row["tokens_per_step"] == 2 * 16 and len(row["step_time_round_medians_s"]) == 2
        assert row["spread"] == [min(row["step_time_round_medians_s"]), max(row["step_time_round_medians_s"])]
        assert row["spread"][0] <= row["step_time_median_s"] <= row["spread"][1]
    json.dumps(doc)  # plain JSON


class _Fake:
    """What measure() reads of a built case, without a model."""

    def __init__(self, entry: cal.Entry) -> None:
        self.entry, self.tokens_per_step, self.ns_precision = entry, 256, None


def _noisy(sigma: float, seed: int = 0):  # noqa: ANN202 - a time_steps stand-in
    """Step times whose round median moves by ``sigma`` (log scale) from round to round, Muon's 1.5x AdamW's."""
    import math
    import random

    rng = random.Random(seed)
    return lambda case, n: [(0.015 if case.entry.optimizer == "muon" else 0.01) * math.exp(rng.gauss(0, sigma))] * n


@pytest.mark.parametrize(("sigma", "rounds"), [(0.0, 3), (0.3, 6)])
def test_rounds_go_on_while_a_ratio_is_unstable_up_to_twice_the_first(monkeypatch, sigma: float,
                                                                      rounds: int) -> None:
    """A quiet machine is measured over the first rounds only; a noisy one over twice as many, no more, and the file
    says so (measure.step_ratio.more_rounds)."""
    import gc

    monkeypatch.setattr(cal, "build_case", lambda entry, scratch: _Fake(entry))
    monkeypatch.setattr(cal, "time_steps", _noisy(sigma))
    # measure() collects garbage after each entry of each round (a built model's memory): nothing to free here, and
    # a full collection of a test process holding the suite's objects took ~0.5-1 s each, 10 s for this test
    monkeypatch.setattr(gc, "collect", lambda *_: 0)
    said: list[str] = []
    doc = cal.calibrate([_entry("adamw"), _entry("muon")], rounds=3, steps=4, warmup=1, say=said.append)
    assert doc["rounds"] == rounds and (doc["first_rounds"], doc["max_rounds"]) == (3, 6)
    assert all(len(e["step_time_round_medians_s"]) == rounds for e in doc["entries"])
    assert len(said) == rounds and said[-1] == f"calibration round {rounds} done (3 first, up to 6)"


def test_muon_is_timed_in_the_precision_its_runs_recorded(tmp_path: Path) -> None:
    """A run's summary.json names the Newton-Schulz precision it trained in; the calibration builds Muon in it
    whatever its arguments would resolve (auto is timed per machine and could choose the other)."""
    case = cal.build_case(cal.Entry("muon", "tiny", _entry("muon", "--optimizer_kwargs",
                                                           '{"ns_precision": "fp32"}').args, None, "bf16"),
                          Path("/nonexistent"))
    assert case.ns_precision == "bf16"
    assert {g.get("ns_precision") for g in case.optimizer.param_groups if "ns_precision" in g} == {"bf16"}
    assert cal.recorded_ns_precision({"hyperparameters": {"ns_precision": {"value": "fp32", "source": "auto"}}}) == \
        "fp32"
    assert cal.recorded_ns_precision({"hyperparameters": {}}) is None and cal.recorded_ns_precision({}) is None


def test_a_step_is_the_run_s_step(monkeypatch) -> None:
    """One calibrated step does what one optimizer step of the run does: every micro-batch of the accumulation
    forward and backward, clipping at the run's max_grad_norm, the optimizer's step."""
    import torch

    case = cal.build_case(_entry("adamw", "--gradient_accumulation_steps", "3", "--max_grad_norm", "0.5"),
                          Path("/nonexistent"))
    assert len(case.batches) == 3 and case.max_grad_norm == 0.5 and case.tokens_per_step == 3 * 2 * 16
    calls: list[str] = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: calls.append("clip"))
    step = case.optimizer.step
    monkeypatch.setattr(case.optimizer, "step", lambda *a, **k: (calls.append("step"), step(*a, **k)))
    before = [p.detach().clone() for p in case.model.parameters()]
    assert len(cal.time_steps(case, 2)) == 2
    assert calls == ["clip", "step", "clip", "step"]
    assert any(not torch.equal(a, b) for a, b in zip(before, case.model.parameters(), strict=True))


def _sweep(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": QUICK, "output_dir": str(tmp_path / "sw"),
                                    "overrides": dict(zip([a.lstrip("-") for a in SMALL[::2]], SMALL[1::2], strict=True)),
                                    "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"],
                                               "seed": [1, 2]},
                                    "launcher": {"type": "python", "env": {"OMP_NUM_THREADS": "1"}}, **extra}))
    return path


def test_the_sweep_file_sizes_it_or_turns_it_off(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path))
    assert cal.settings(spec) == {"rounds": cal.ROUNDS, "steps": cal.STEPS_PER_ROUND, "warmup": cal.WARMUP_STEPS}
    assert cal.skip_reason(spec) is None
    assert [(e.optimizer, e.model_size) for e in cal.compared_entries(spec)] == [("adamw", "tiny"), ("muon", "tiny")]
    muon = next(r for r in spec.runs if r.optimizer == "muon" and r.phase == "compare")
    spec.run_dir(muon).mkdir(parents=True)
    (spec.run_dir(muon) / "summary.json").write_text(json.dumps({
        "vocab_size": 32, "hyperparameters": {"ns_precision": {"value": "fp32", "source": "auto: measured"}}}))
    assert [(e.optimizer, e.vocab_size, e.ns_precision) for e in cal.compared_entries(spec)] == \
        [("adamw", None, None), ("muon", 32, "fp32")]
    spec = load_sweep(_sweep(tmp_path, calibration={"rounds": 2, "steps_per_round": 5}))
    assert cal.settings(spec) == {"rounds": 2, "steps": 5, "warmup": cal.WARMUP_STEPS}
    off = load_sweep(_sweep(tmp_path, calibration=False))
    assert cal.settings(off) is None and "calibration: false" in str(cal.skip_reason(off))
    said: list[str] = []
    assert cal.run_sweep_calibration(off, said.append) is None and "skipped" in said[0]
    with pytest.raises(OptBenchError, match="calibration.rounds must be an integer >= 1"):
        load_sweep(_sweep(tmp_path, calibration={"rounds": 0}))
    with pytest.raises(OptBenchError, match="unknown key 'steps' in calibration"):
        load_sweep(_sweep(tmp_path, calibration={"steps": 3}))


def test_a_command_launcher_is_not_measured(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, launcher={"type": "command", "command": ["true"]}))
    assert "command" in str(cal.skip_reason(spec))


@pytest.mark.slow
def test_the_sweep_s_calibration_runs_alone_in_a_child_and_is_kept_until_a_run_ends(tmp_path: Path) -> None:
    """The child process writes the file with the runs' thread count; called again with no run ended since, the
    file is kept; a run that ends later (a newer state file) has it measured again."""
    import os
    import time

    spec = load_sweep(_sweep(tmp_path, calibration={"rounds": 2, "steps_per_round": 2}))
    spec.output_dir.mkdir(parents=True)
    state = spec.output_dir / "sweep_state.jsonl"
    state.write_text("")
    said: list[str] = []
    out = cal.run_sweep_calibration(spec, said.append)
    assert out == spec.output_dir / cal.CALIBRATION_FILE, said
    doc = json.loads(out.read_text())
    assert doc["machine"]["threads"] == 1 and doc["first_rounds"] == 2 and doc["steps_per_round"] == 2
    assert 2 <= doc["rounds"] <= 4  # more while a ratio is unstable: this machine's noise decides
    assert {r["optimizer"] for r in doc["entries"]} == {"adamw", "muon"}
    first = out.stat().st_mtime
    assert cal.run_sweep_calibration(spec, said.append) == out and "kept" in said[-1]
    later = time.time() + 5
    os.utime(state, (later, later))
    cal.run_sweep_calibration(spec, said.append)
    assert out.stat().st_mtime > first
