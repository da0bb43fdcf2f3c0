"""study.kept_runs: an edited sweep keeps only the finished runs that ran with the settings it now gives (issue 32
item 3). Before: editing ``overrides`` (dropout, warmup_steps) and adding an optimizer kept the old adamw run with
the old values ("1 already finished, 1 to run"), while sweep_manifest.json listed the new ones for it.

The fast tests launch a stand-in for ``hf_optbench.run`` that writes the identity the test computed in-process for
each run (the real parse, no data or model work); the slow one is the issue's scenario through the installed
command, real runs and report included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import read_state
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_spec import load_sweep

from fixtures.installed import hf_optbench_command
from fixtures.warm_run import run_python

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
# Writes what a finished run writes for the sweep (its identity, as computed by the test, and summary.json), and
# counts its launches; no import of hf_optbench, so it starts in milliseconds.
STAND_IN = r'''
import json, os, pathlib, sys
argv = sys.argv[1:]
out = pathlib.Path(argv[argv.index("--output_dir") + 1])
rid = argv[argv.index("--run_name") + 1]
out.mkdir(parents=True, exist_ok=True)
ident = json.loads(pathlib.Path(os.environ["IDENTITIES"]).read_text())[rid]
(out / "run_identity.json").write_text(json.dumps({"schema": 1, "identity": ident}))
(out / "summary.json").write_text(json.dumps({"status": "completed", "run_name": rid}))
with open(out.parent.parent / "launched.txt", "a") as fh:
    fh.write(rid + "\n")
'''


def _sweep(tmp_path: Path, name: str, optimizers: list[str], **overrides) -> Path:
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    spec = {"base": QUICK, "output_dir": str(tmp_path / "out"),
            "overrides": {"max_steps": 4, "data_source": "synthetic", "block_size": 64, **overrides},
            "matrix": {"optimizer": optimizers, "model_size": ["tiny"], "seed": [1]},
            "launcher": {"type": "command", "command": ["{python}", str(stand_in)],
                         "env": {"IDENTITIES": str(tmp_path / "identities.json")}}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def _identities(tmp_path: Path, sweep_file: Path) -> None:
    """Each run's identity as the real run would record it (the stand-in writes it)."""
    from hf_optbench.config.parse import parse_args
    from hf_optbench.run.plan import resolve_plan

    spec = load_sweep(sweep_file)
    out = {}
    for run in spec.runs:
        cfg = parse_args([*run.args, "--output_dir", str(tmp_path / "probe")])
        out[run.run_id] = dict(resolve_plan(cfg).identity)
    (tmp_path / "identities.json").write_text(json.dumps(out))


def _launched(tmp_path: Path) -> list[str]:
    path = tmp_path / "out" / "launched.txt"
    return path.read_text().split() if path.is_file() else []


def _manifest_args(tmp_path: Path) -> dict[str, list[str]]:
    manifest = json.loads((tmp_path / "out" / "sweep_manifest.json").read_text())
    return {r["run_id"]: r["args"] for r in manifest["runs"]}


@pytest.fixture
def first(tmp_path: Path) -> Path:
    """The issue's first sweep, finished: adamw, tiny, seed 1."""
    path = _sweep(tmp_path, "v1.yaml", ["adamw"], warmup_steps=0.1, dropout=0.0)
    _identities(tmp_path, path)
    assert run_sweep(path, stream=open(os.devnull, "w")) == {"completed": 1}
    assert _launched(tmp_path) == ["adamw__tiny__s1"]
    return path


def test_an_edited_sweep_refuses_the_runs_it_would_keep_with_old_settings(tmp_path: Path, first: Path) -> None:
    edited = _sweep(tmp_path, "v2.yaml", ["adamw", "lion"], warmup_steps=2, dropout=0.3)
    _identities(tmp_path, edited)
    manifest, copy = (tmp_path / "out" / "sweep_manifest.json").read_text(), (tmp_path / "out" / "sweep.yaml").read_text()
    with pytest.raises(OptBenchError) as err:
        run_sweep(edited, stream=open(os.devnull, "w"))
    line = str(err.value)
    assert "adamw__tiny__s1 (dropout 0.0 -> 0.3, " in line and "--rerun_changed" in line
    assert "warmup_steps 0.1 -> 2.0" in line and "schedule_resolved.warmup_steps 1 -> 2" in line  # inside a mapping
    assert "\n" not in line and "lion" not in line
    assert _launched(tmp_path) == ["adamw__tiny__s1"]  # nothing launched: lion neither
    assert (tmp_path / "out" / "sweep_manifest.json").read_text() == manifest  # nor anything rewritten
    assert (tmp_path / "out" / "sweep.yaml").read_text() == copy


def test_rerun_changed_moves_the_old_run_aside_and_the_manifest_says_what_ran(tmp_path: Path, first: Path) -> None:
    edited = _sweep(tmp_path, "v2.yaml", ["adamw", "lion"], warmup_steps=2, dropout=0.3)
    _identities(tmp_path, edited)
    assert run_sweep(edited, stream=open(os.devnull, "w"), rerun_changed=True) == {"completed": 2}
    assert _launched(tmp_path) == ["adamw__tiny__s1", "adamw__tiny__s1", "lion__tiny__s1"]
    runs = tmp_path / "out" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["adamw__tiny__s1", "adamw__tiny__s1.changed-1", "lion__tiny__s1"]
    moved = [r for r in read_state(tmp_path / "out" / "sweep_state.jsonl") if r.get("event") == "moved"]
    assert len(moved) == 1 and "dropout" in moved[0]["reason"]
    assert all("--dropout=0.3" in args for args in _manifest_args(tmp_path).values())


def test_the_manifest_lists_what_each_kept_run_ran_with(tmp_path: Path, first: Path) -> None:
    """An edit outside what decides the result (the eval cadence) keeps the run, and its manifest entry keeps the
    arguments it ran with; the new run gets the new ones."""
    cadence = _sweep(tmp_path, "v1c.yaml", ["adamw", "lion"], warmup_steps=0.1, dropout=0.0, eval_steps=7)
    _identities(tmp_path, cadence)
    assert run_sweep(cadence, stream=open(os.devnull, "w")) == {"completed": 2}
    assert _launched(tmp_path) == ["adamw__tiny__s1", "lion__tiny__s1"]
    args = _manifest_args(tmp_path)
    assert "--eval_steps=7" not in args["adamw__tiny__s1"] and "--eval_steps=7" in args["lion__tiny__s1"]


def test_a_truncated_summary_is_refused_by_name_not_counted_finished(tmp_path: Path, first: Path) -> None:
    """Issue 32 "Unclear": a tuning run's summary.json cut short counted as completed and the tuner blamed a missing
    tuning_blocks. The sweep names the file before launching anything."""
    summary = tmp_path / "out" / "runs" / "adamw__tiny__s1" / "summary.json"
    summary.write_text('{"status": "compl')
    more = _sweep(tmp_path, "v1b.yaml", ["adamw", "lion"], warmup_steps=0.1, dropout=0.0)
    with pytest.raises(OptBenchError, match=rf"{summary} is not valid JSON.*Nothing was launched"):
        run_sweep(more, stream=open(os.devnull, "w"))
    assert _launched(tmp_path) == ["adamw__tiny__s1"]


@pytest.mark.slow
def test_the_issue_scenario_through_the_installed_command(tmp_path: Path) -> None:
    """Real runs: a finished sweep, edited (lion added; warmup_steps and dropout changed), is refused with exit 2 and
    one line; with --rerun-changed it reruns adamw, and the report of the result reports."""
    exe = hf_optbench_command()
    env = {**os.environ, "HF_OPTBENCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}

    def sweep_file(name: str, optimizers: list[str], **overrides) -> Path:
        spec = {"base": QUICK, "output_dir": str(tmp_path / "out"),
                "overrides": {"max_steps": 4, "eval_steps": 4, "save_strategy": "no", "data_source": "synthetic",
                              "block_size": 64, "validation_blocks": 8, **overrides},
                "matrix": {"optimizer": optimizers, "model_size": ["tiny"], "seed": [1]},
                "launcher": {"type": "python", "jobs": 1}, "calibration": False}
        (tmp_path / name).write_text(yaml.safe_dump(spec))
        return tmp_path / name

    def hf(*argv: object) -> subprocess.CompletedProcess:  # the installed command's script, in a warm fork
        return run_python([sys.executable, str(exe), *map(str, argv)], cwd=os.getcwd(), env=env, timeout=600)

    assert hf("sweep", sweep_file("v1.yaml", ["adamw"])).returncode == 0
    edited = sweep_file("v2.yaml", ["adamw", "lion"], warmup_steps=2, dropout=0.3)
    refused = hf("sweep", edited)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "adamw__tiny__s1 (dropout 0.0 -> 0.3, " in refused.stderr and "warmup_steps 0.1 -> 2.0" in refused.stderr
    assert not (tmp_path / "out" / "runs" / "lion__tiny__s1").exists()
    rerun = hf("sweep", edited, "--rerun-changed")
    assert rerun.returncode == 0 and "moved aside to adamw__tiny__s1.changed-1" in rerun.stdout, rerun.stdout
    report = hf("report", tmp_path / "out")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr


def test_an_interrupted_run_under_an_edited_sweep_is_refused_naming_rerun_changed(tmp_path: Path, first: Path) -> None:
    """A run that started and stopped before its end (its identity recorded, no end row): its own resume would
    refuse the new settings; the sweep says so before launching anything, naming --rerun_changed, which moves it
    aside and starts it again."""
    state = tmp_path / "out" / "sweep_state.jsonl"
    rows = [r for r in read_state(state) if r.get("event") != "end"]  # the run stopped before its end
    state.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "out" / "runs" / "adamw__tiny__s1" / "summary.json").unlink()
    edited = _sweep(tmp_path, "v2.yaml", ["adamw"], warmup_steps=2, dropout=0.3)
    _identities(tmp_path, edited)
    with pytest.raises(OptBenchError) as err:
        run_sweep(edited, stream=open(os.devnull, "w"))
    line = str(err.value)
    assert "1 interrupted run(s) it would resume: adamw__tiny__s1 (dropout 0.0 -> 0.3" in line
    assert "--rerun_changed" in line and "\n" not in line
    assert _launched(tmp_path) == ["adamw__tiny__s1"]  # nothing launched
    assert run_sweep(edited, stream=open(os.devnull, "w"), rerun_changed=True) == {"completed": 1}
    runs = tmp_path / "out" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["adamw__tiny__s1", "adamw__tiny__s1.changed-1"]
