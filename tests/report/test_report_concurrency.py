"""Several processes writing one file at once (three ``hf-optbench report`` of one sweep directory): each writes
its own temporary file, so none fails with FileNotFoundError on a temporary name another one renamed away."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.rundir import write_json_atomic

from fixtures.sweep_fixture import build_fixture_sweep


def _writer(path: str, n: int) -> None:
    for i in range(n):
        write_json_atomic(Path(path), {"writer": multiprocessing.current_process().name, "i": i})


def test_processes_writing_one_file_at_once_never_collide(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(target), 300), name=f"w{k}") for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]  # a collision is a FileNotFoundError in a writer: exit code 1
    assert json.loads(target.read_text())["i"] == 299
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary file left behind


@pytest.mark.slow
def test_three_reports_of_one_directory_at_once(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "demo", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1))
    exe = [sys.executable, "-c", "import sys; from hf_optbench.cli import main; sys.exit(main(sys.argv[1:]))"]
    procs = [subprocess.Popen([*exe, "report", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    assert all(rc == 0 for rc, _ in results), results
    assert not [p.name for p in (root / "report").iterdir() if ".tmp" in p.name]
