"""Validating a sweep parses each distinct run configuration once: a 10,000-run matrix (a few optimizer x size
points over many seeds) was silent for minutes under ``hf-optbench sweep --dry-run``, one 56 ms parse per run."""

from __future__ import annotations

from pathlib import Path

import yaml

from hf_optbench.config import parse
from hf_optbench.study.sweep_spec import load_sweep, validate_runs

QUICK = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart_cpu.yaml")


def test_runs_differing_only_in_seed_are_parsed_once(tmp_path: Path, monkeypatch) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": QUICK, "output_dir": str(tmp_path / "sw"), "launcher": {"type": "python"},
        "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny"], "seed": list(range(40))}}))
    spec = load_sweep(sweep)
    calls: list[list[str]] = []
    real = parse.parse_args

    def counting(argv: list[str]):
        calls.append(argv)
        return real(argv)

    monkeypatch.setattr(parse, "parse_args", counting)
    validate_runs(spec)
    assert len(spec.runs) == 80
    assert len(calls) == 2, f"{len(calls)} parses for 2 distinct configurations"
    assert all(run.max_steps for run in spec.runs)  # every run still got what validation sets
