"""A run that can no longer write its output_dir mid-run (a full disk, a quota, a file-size limit, a filesystem
turned read-only) stops with exit 2 and one line: what ran out, where, what was being written, the fix, and the
checkpoint the run can resume from.

Why by hand: the writers below the Trainer each report a failed write their own way. Python's own writes raise an
OSError with its errno; safetensors wraps it into a ``SafetensorError`` whose text ends in ``(os error 28)``; and
``torch.save``'s zip writer raises a RuntimeError that keeps no errno at all (``[enforce fail at
inline_container.cc] . unexpected pos 576 vs 534``). A full disk at a checkpoint save therefore ended in a
SafetensorError traceback, rc 1. For torch's case the cause is read off the machine after the failure: the
filesystem it wrote has (next to) no room left, or the process runs under a file-size limit (``ulimit -f``).

Nothing finished is lost: the checkpoint being written is incomplete (transformers writes ``trainer_state.json``
last), so a resume never loads it; it is moved to ``torn_checkpoints/`` at once where the filesystem allows
(:func:`hf_optbench.run.identity.move_torn_checkpoint`), else by the resume. summary.json records the failure
(status ``failed``, this line as its ``error``) when it can still be written; the earlier one stays otherwise.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hf_optbench.errors import OptBenchError

# errno -> what ran out and the fix. EFBIG is the file-size limit's (SIGXFSZ is ignored by Python, so the write
# fails instead of killing the process) or the filesystem's largest file.
WRITE_ERRNOS = {
    errno.ENOSPC: ("no space left on", "free space there"),
    errno.EDQUOT: ("the disk quota is exceeded on", "free space in your quota"),
    errno.EFBIG: ("a file grew past the largest file size of", "use a filesystem that allows larger files"),
    errno.EROFS: ("the filesystem turned read-only:", "remount it writable"),
}
# how Rust's std::io::Error (safetensors) shows the errno, and how Arrow's C++ writer (the data cache) does
_OS_ERROR = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
# torch.save's zip writer (caffe2/serialize/inline_container.cc, PyTorchStreamWriter) fails without an errno, in
# one of these words (its reader's errors, a damaged file at load, say other things)
_TORCH_WRITER = ("unexpected pos ", "file write failed")
# After a failed write filled the disk, what is left is below this (a block or a few): no room.
NEARLY_FULL = 64 * 2**20


def _mount_point(path: Path) -> Path:
    """The mount point holding ``path`` (the "device" a user frees space on)."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def _probe(out: Path) -> int | None:
    """The errno a write under ``out`` most likely met when the writer kept none: ENOSPC when the filesystem has
    (next to) no room left, else EFBIG when a file-size limit is set; None when neither holds."""
    try:
        if shutil.disk_usage(_mount_point(out)).free < NEARLY_FULL:
            return errno.ENOSPC
    except OSError:
        pass
    return errno.EFBIG if _file_size_limit() is not None else None


def _failed_write(exc: BaseException, out: Path) -> tuple[int, str | None] | None:
    """(errno, the file's name where the writer gave one) of a write that failed for want of room or of a writable
    filesystem, found in ``exc`` or its causes; None when ``exc`` is something else."""
    seen: BaseException | None = exc
    filename = None
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, OSError):
            filename = filename or seen.filename
            if seen.errno in WRITE_ERRNOS:
                return seen.errno, filename
        text = str(seen)
        found = _OS_ERROR.search(text)
        if found and int(found.group(1) or found.group(2)) in WRITE_ERRNOS:
            return int(found.group(1) or found.group(2)), filename
        if isinstance(seen, RuntimeError) and "inline_container.cc" in text and any(m in text for m in _TORCH_WRITER):
            code = _probe(out)
            return (code, filename) if code is not None else None
        seen = seen.__cause__ or seen.__context__
    return None


def write_errno(exc: BaseException, out: Path) -> int | None:
    """The errno (one of :data:`WRITE_ERRNOS`) of a write under ``out`` that failed for want of room or of a
    writable filesystem, found in ``exc`` or its causes, or None when ``exc`` is something else."""
    failed = _failed_write(exc, out)
    return failed[0] if failed is not None else None


def _file_size_limit() -> int | None:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def _what_and_fix(code: int, out: Path, path: Path, holding: str = "output_dir",
                  elsewhere: str = "point --output_dir elsewhere") -> tuple[str, str]:
    """(what ran out, where; the fix) for the error line; ``path``: the file that could not be written, or ``out``
    (the folder named ``holding`` that can be moved ``elsewhere``)."""
    limit = _file_size_limit()
    if code == errno.EFBIG and limit is not None:
        return (f"a file in '{path.parent if path != out else out}' grew past this process's file-size limit "
                f"(ulimit -f: {limit / 2**20:,.1f} MiB)", "raise the limit (ulimit -f unlimited)")
    what, fix = WRITE_ERRNOS[code]
    inside = os.path.abspath(path).startswith(os.path.join(os.path.abspath(out), "")) or path == out
    if not inside:  # e.g. a full /dev/shm: not the output_dir's disk
        return f"{what} '{_mount_point(path)}' (writing '{path}')", fix
    return f"{what} '{_mount_point(path)}' (holding {holding} '{out}')", f"{fix} or {elsewhere}"


@contextmanager
def cache_write_failures(cache_dir: str | os.PathLike[str]) -> Iterator[None]:
    """A failed write while the data cache entry is built (a full disk, a quota, a file-size limit: pyarrow's
    ``OSError: [Errno 27] File too large``) as one exit-2 line naming the cache directory and the fix. Nothing is
    lost: the entry is built in a temporary folder, removed on the way out (``data.cache.store``), and no training
    has started."""
    try:
        yield
    except OptBenchError:
        raise
    except Exception as exc:
        failed = _failed_write(exc, Path(cache_dir))
        if failed is None:
            raise
        what, fix = _what_and_fix(failed[0], Path(cache_dir), Path(cache_dir), "the data cache", "point the data cache elsewhere (--data_cache_dir or "
                                  "HF_OPTBENCH_CACHE)")
        raise OptBenchError(f"{what} while building a data cache entry: {fix}; nothing was trained, and the cache "
                            "holds no part of the entry.") from None


def _resume_hint(out: Path, trained: bool, final_model: bool) -> str:
    """What the run directory holds now and how to go on from it."""
    from hf_optbench.run.identity import newest_loadable_checkpoint

    ckpt = newest_loadable_checkpoint(out)
    if final_model:
        return ("the run itself finished (summary.json), only its final model is incomplete" +
                (f"; {ckpt.name} holds its last saved weights" if ckpt is not None else ""))
    if trained:
        return "training reached its end but its records are incomplete: start it again with --overwrite_output_dir true"
    if ckpt is None:
        return "no checkpoint was completed: start it again with --overwrite_output_dir true"
    return f"the run can resume from {ckpt.name} with --resume_from_checkpoint true"


def torn_checkpoint(out: Path, step: int) -> Path | None:
    """``checkpoint-<step>`` of ``out`` when it exists without a readable trainer_state.json (the save that
    failed), else None."""
    from hf_optbench.run.identity import read_trainer_state

    ckpt = out / f"checkpoint-{step}"
    return ckpt if ckpt.is_dir() and read_trainer_state(ckpt) is None else None


def write_failure(exc: BaseException, out: Path, *, step: int, trained: bool = False,
                  final_model: bool = False) -> OptBenchError | None:
    """The one-line exit-2 error for ``exc`` when it is a failed write (:func:`write_errno`), else None. ``step``:
    the Trainer's step when it happened (a checkpoint-<step> left incomplete is the save that failed, and is moved
    aside where the filesystem allows); ``trained``: training had reached its end (the records failed);
    ``final_model``: it happened saving the final model, after the records were written."""
    from hf_optbench.run.identity import move_torn_checkpoint

    failed = _failed_write(exc, out)
    if failed is None:
        return None
    code, filename = failed
    torn = None if final_model else torn_checkpoint(out, step)
    if torn is not None:
        try:
            move_torn_checkpoint(torn)  # a rename: no room needed, unless torn_checkpoints/ must be made
        except OSError:
            pass  # the resume sets it aside (run.identity.choose_checkpoint)
    # a temporary name of rundir.atomic_path ("summary.json.tmp-<pid>-<hex>.json") is shown as the file it replaces
    during = ("saving the final model" if final_model else f"saving {torn.name}" if torn is not None
              else f"writing {Path(filename).name.split('.tmp-')[0]}" if filename else f"training (step {step})")
    what, fix = _what_and_fix(code, out, Path(filename) if filename else out)
    return OptBenchError(f"{what} while {during}: {fix}; {_resume_hint(out, trained, final_model)}.")
