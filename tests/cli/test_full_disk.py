"""A full disk (or quota, or a read-only filesystem) under the output directory or the data cache ends the command
with exit code 2 and one line naming the directory and the fix, not a ~40-line traceback; at a checkpoint save too
(issue 32), where the line also names the checkpoint the run can resume from."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench import cli
from hf_optbench.run import train as run_mod

from fixtures.installed import hf_optbench_command
from fixtures.warm_run import run_python

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



# -- issue 32: the disk fills (or a file-size limit is met) while a checkpoint is saved --------------------------
SAVE_ARGS = ["--save_strategy", "steps", "--save_steps", "2", "--eval_steps", "2", "--write_model_card", "false"]


def _run_limited(out: Path, cache: Path, *extra: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``hf-optbench run`` (the installed command) into ``out``; with ``fsize``, under a file-size limit of that
    many bytes (``ulimit -f``), SIGXFSZ ignored so that a write past it fails with EFBIG instead of killing."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = dict(os.environ, HF_OPTBENCH_CACHE=str(cache), HF_HUB_OFFLINE="1")
    argv = [str(hf_optbench_command()), "run", QUICK, "--output_dir", str(out), *SAVE_ARGS, *extra]
    if fsize is None:  # no limit to set before the start: the installed command's script in a warm fork
        return run_python([sys.executable, *argv], cwd=ROOT, env=env)
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, preexec_fn=limit)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_file_size_limit_at_the_first_checkpoint_is_one_line(tmp_path: Path) -> None:
    """`ulimit -f` between the weights' size (0.9 MB) and the optimizer state's (1.8 MB): torch.save's writer fails
    with no errno ("unexpected pos ..."); was a traceback, rc 1. Now exit 2 naming the limit, the checkpoint and
    the fix; the torn checkpoint is set aside and summary.json says what happened."""
    out = tmp_path / "run"
    proc = _run_limited(out, tmp_path / "cache", "--max_steps", "4", fsize=1_200_000)
    line = _error_line(proc)
    assert "grew past this process's file-size limit (ulimit -f: 1.1 MiB)" in line, line
    assert "while saving checkpoint-2: raise the limit (ulimit -f unlimited)" in line, line
    assert "no checkpoint was completed: start it again with --overwrite_output_dir true" in line, line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == line.removeprefix("error: ")
    assert not list(out.glob("checkpoint-*")), "a torn checkpoint left where a resume or rotation looks"
    assert [p.name.split(".")[0] for p in (out / "torn_checkpoints").iterdir()] == ["checkpoint-2"]


@pytest.mark.slow
def test_a_file_size_limit_while_the_data_cache_is_built_is_one_line(tmp_path: Path) -> None:
    """`ulimit -f` 64 KiB below the synthetic entry's Arrow file (0.8 MB): pyarrow's ``OSError: [Errno 27] File too
    large`` was a traceback. Now exit 2 naming the limit and the cache before any training; no partial entry and no
    run directory are left."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = _run_limited(out, cache, "--data_source", "synthetic", "--synthetic_num_tokens", "100000",
                        fsize=64 * 1024)
    line = _error_line(proc)
    assert "grew past this process's file-size limit (ulimit -f: 0.1 MiB) while building a data cache entry" in line
    assert "nothing was trained" in line and not out.exists(), line
    assert not [p for p in cache.rglob("*") if p.is_file()], "a partial cache entry was left"


def _mount_tmpfs(path: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``path`` (needs root and mount(8)); False where it cannot be made."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0) or shutil.which("mount") is None:
        return False
    path.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_save_keeps_the_run_resumable(tmp_path: Path) -> None:
    """The issue's case: a 3.5 MB disk holds checkpoint-2 (2.9 MB) but not checkpoint-4, whose weights' write fails
    inside safetensors ("... (os error 28)"); was a SafetensorError traceback, rc 1. Now exit 2 naming the disk,
    the checkpoint and the one to resume from; once there is room, the resume finishes the run."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "3500k"):
        pytest.skip("needs root and mount(8) to make a small tmpfs")
    try:
        out = disk / "run"
        proc = _run_limited(out, tmp_path / "cache", "--max_steps", "6")
        line = _error_line(proc)
        assert f"no space left on '{disk}' (holding output_dir '{out}') while saving checkpoint-4" in line, line
        assert "free space there or point --output_dir elsewhere" in line, line
        assert "the run can resume from checkpoint-2 with --resume_from_checkpoint true" in line, line
        assert json.loads((out / "summary.json").read_text())["status"] == "failed"
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
        subprocess.run(["mount", "-o", "remount,size=32m", str(disk)], check=True)  # the user frees space
        resumed = _run_limited(out, tmp_path / "cache", "--max_steps", "6", "--resume_from_checkpoint", "true")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 6 and summary["resumed_from"]["step"] == 2
        assert [p.name.split(".")[0] for p in (out / "torn_checkpoints").iterdir()] == ["checkpoint-4"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
