"""A failed write mid-run is recognised however its writer reports it, and becomes one line that names the place,
the checkpoint being saved, the fix and the checkpoint to resume from (issue 32). The runs themselves, under a
file-size limit and on a full tmpfs, are in tests/cli/test_full_disk.py."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from hf_optbench.run import write_failure as wf


def _checkpoint(out: Path, step: int, *, complete: bool) -> Path:
    """A checkpoint folder whose files parse (weights, trainer_state.json written last when ``complete``)."""
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    if complete:
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ckpt


class _Usage:
    """What shutil.disk_usage answers, as far as the probe reads it."""

    def __init__(self, free: int) -> None:
        self.free = free


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/metrics.jsonl"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
])
def test_each_writers_report_of_a_full_disk_is_recognised(exc: BaseException, tmp_path: Path) -> None:
    assert wf.write_errno(exc, tmp_path) == errno.ENOSPC
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = exc
    assert wf.write_errno(wrapped, tmp_path) == errno.ENOSPC


def test_torch_saves_errno_less_failure_is_read_off_the_machine(tmp_path: Path, monkeypatch) -> None:
    """torch.save's zip writer keeps no errno: a full filesystem, else a file-size limit, says which it was."""
    torn = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.setattr(wf, "_file_size_limit", lambda: None)
    monkeypatch.setattr(wf.shutil, "disk_usage", lambda _p: _Usage(4096))
    assert wf.write_errno(torn, tmp_path) == errno.ENOSPC
    monkeypatch.setattr(wf.shutil, "disk_usage", lambda _p: _Usage(50 * 2**30))
    assert wf.write_errno(torn, tmp_path) is None  # room left and no limit: not a write failure we can name
    monkeypatch.setattr(wf, "_file_size_limit", lambda: 2**20)
    assert wf.write_errno(torn, tmp_path) == errno.EFBIG


@pytest.mark.parametrize("exc", [
    RuntimeError("[enforce fail at inline_container.cc:325] . PytorchStreamReader failed reading zip archive: "
                 "failed finding central directory"),  # a damaged file at load, not a write
    OSError(errno.ENOENT, "No such file or directory", "/x/y"),
    ValueError("loss is nan"),
])
def test_other_failures_are_left_alone(exc: BaseException, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(wf, "_file_size_limit", lambda: 2**20)  # even under a limit
    assert wf.write_errno(exc, tmp_path) is None
    assert wf.write_failure(exc, tmp_path, step=4) is None


def test_the_line_names_the_disk_the_checkpoint_and_the_one_to_resume_from(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _checkpoint(out, 2, complete=True)
    _checkpoint(out, 4, complete=False)  # the save that failed
    exc = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    line = str(wf.write_failure(exc, out, step=4))
    mount = wf._mount_point(out)
    assert line == (f"no space left on '{mount}' (holding output_dir '{out}') while saving checkpoint-4: free space "
                    "there or point --output_dir elsewhere; the run can resume from checkpoint-2 with "
                    "--resume_from_checkpoint true.")
    assert not (out / "checkpoint-4").exists()  # set aside, never deleted
    assert [p.name.split(".")[0] for p in (out / "torn_checkpoints").iterdir()] == ["checkpoint-4"]


def test_without_a_complete_checkpoint_the_fix_is_to_start_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _checkpoint(out, 2, complete=False)
    line = str(wf.write_failure(OSError(errno.EDQUOT, "Disk quota exceeded"), out, step=2))
    assert "the disk quota is exceeded on" in line and "while saving checkpoint-2" in line
    assert line.endswith("no checkpoint was completed: start it again with --overwrite_output_dir true.")


def test_after_training_the_line_says_what_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _checkpoint(out, 6, complete=True)
    full = OSError(errno.ENOSPC, "No space left on device", str(out / "summary.json.tmp-1-abc.json"))
    records = str(wf.write_failure(full, out, step=6, trained=True))
    assert "while writing summary.json:" in records and "its records are incomplete" in records
    final = str(wf.write_failure(full, out, step=6, trained=True, final_model=True))
    assert "while saving the final model" in final and "checkpoint-6 holds its last saved weights" in final
    assert (out / "checkpoint-6").is_dir()  # a complete checkpoint is never moved


def test_a_full_disk_elsewhere_is_named_as_such(tmp_path: Path) -> None:
    """A write outside output_dir (a full /dev/shm, say) names that file's filesystem, not the output_dir's."""
    out = tmp_path / "run"
    out.mkdir()
    line = str(wf.write_failure(OSError(errno.ENOSPC, "No space left on device", "/dev/shm/torch_1"), out, step=3))
    assert "(writing '/dev/shm/torch_1') while writing torch_1: free space there; " in line
    assert "output_dir" not in line.split(";")[0]
