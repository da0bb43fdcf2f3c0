"""A full disk (or quota, or a read-only filesystem) under the output directory or the data cache ends the command
with exit code 2 and one line naming the directory and the fix, not a ~40-line traceback."""

from __future__ import annotations

import errno
import os
import pathlib
from pathlib import Path

import pytest
import yaml

from hf_optbench import cli
from hf_optbench.run import train as run_mod

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")


def _one_line(rc: int, err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("error: cannot write under"), err
    assert needle in lines[0] and "HF_OPTBENCH_CACHE" in lines[0], lines[0]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_run_with_a_full_data_cache(code: int, tmp_path: Path, monkeypatch, capsys) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("HF_OPTBENCH_CACHE", str(cache))

    def full(*_args, **_kwargs):  # what the data cache's first write raises on a full disk
        raise OSError(code, os.strerror(code), str(cache / ".tmp-abc123"))

    monkeypatch.setattr(run_mod, "prepare", full)
    rc = cli.main(["run", QUICK, "--output_dir", str(tmp_path / "out")])
    _one_line(rc, capsys.readouterr().err, str(cache))


def test_sweep_with_a_full_output_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": QUICK, "output_dir": str(tmp_path / "sw"), "launcher": {"type": "python"},
                                     "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [0]}}))
    real = pathlib.Path.write_text

    def full(self: Path, *args, **kwargs):  # write() on a full disk raises with no file name
        if ".tmp" in self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    rc = cli.main(["sweep", str(sweep)])
    _one_line(rc, capsys.readouterr().err, f"'{tmp_path / 'sw'}'")

