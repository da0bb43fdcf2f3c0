"""One owner per run directory: an advisory lock on ``output_dir/run.lock`` for the whole life of a run.

Two runs writing into one output_dir would interleave their metrics.jsonl rows and leave a summary.json of one
and a config.yaml of the other. ``fcntl.flock`` (as the sweep locks its own directory) is released by the kernel
when the holder dies, even on SIGKILL, so the directory of a killed run can be resumed at once; the file itself
names its holder (pid, host, start time) while it is held, which is what a refused second run prints. It is
removed when the run ends; a killed holder's file stays (naming the dead pid) until the next owner takes it.

Only the launch's main process takes it: ``accelerate launch`` / ``torchrun`` start one process per device,
all with the same output_dir and ``RANK`` set (0 for the main one), and only that one writes the run directory.
The others must not try, or they would be refused by their own main process.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import RUN_LOCK_FILE


def is_launch_main_process() -> bool:
    """Whether this is the process that writes the run directory, known before any distributed set-up: torchrun,
    ``accelerate launch`` and the deepspeed launcher set ``RANK``; a plain ``python`` run has none and is main."""
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        return True


class RunLock:
    """A held run-directory lock; :meth:`release` (or the process's end) lets another run in."""

    def __init__(self, output_dir: Path, handle: IO[str], created: bool) -> None:
        self.output_dir = output_dir
        self._handle: IO[str] | None = handle
        self._created = created  # the directory did not exist before this lock

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Remove the lock file, then unlock: the file exists only while a run holds the directory (or after a
        kill), so a run refused by a finished run's directory leaves it exactly as it found it. A directory this
        lock created and nothing else wrote into (the run stopped before its first output) is removed too.
        Removing a lock file is safe because :func:`acquire_run_lock` checks, once locked, that the file it locked
        is still the one at the path."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            (self.output_dir / RUN_LOCK_FILE).unlink(missing_ok=True)
            if self._created and not any(self.output_dir.iterdir()):
                self.output_dir.rmdir()
        except OSError:
            pass  # left as it is: another process may have started writing here
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _open_lock_file(out: Path) -> tuple[IO[str], bool]:
    """(the lock file opened for appending, whether the directory was created). Unwritable places become an
    OptBenchError that names the fix."""
    created = False
    try:
        if not out.is_dir():
            try:
                out.mkdir(parents=True)
                created = True
            except FileExistsError:  # a file, or a directory another run created a moment ago
                if not out.is_dir():
                    raise OptBenchError(f"output_dir '{out}' exists and is not a directory: choose another "
                                        "--output_dir.") from None
        return open(out / RUN_LOCK_FILE, "a+", encoding="utf-8"), created
    except OSError as exc:
        raise OptBenchError(f"output_dir '{out}' cannot be written ({exc.strerror or exc}): choose a writable "
                            "--output_dir.") from None


def _busy(out: Path, handle: IO[str]) -> OptBenchError:
    handle.seek(0)
    holder = handle.read().strip() or "a process that has not written its pid yet"
    return OptBenchError(
        f"output_dir '{out}' is in use by another run ({holder}): two runs in one directory would mix their "
        "results. Wait for that run to end (or stop it), or choose another --output_dir."
    )


def _is_current(handle: IO[str], path: Path) -> bool:
    """Whether the open ``handle`` is the file now at ``path`` (not one unlinked since it was opened)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def check_not_busy(output_dir: str | os.PathLike[str]) -> None:
    """Raise an OptBenchError naming the holder when a live run holds ``output_dir``; otherwise do nothing at all
    (no directory or file is created, a free lock is not kept): the cheap check a run makes before parsing its
    arguments. The lock itself is taken later, by :func:`acquire_run_lock`."""
    out = Path(output_dir)
    try:
        handle = open(out / RUN_LOCK_FILE, encoding="utf-8")  # flock needs no write access
    except OSError:
        return  # no lock file: no run holds the directory (or it is no directory: parse_args says so)
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(out, handle) from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def acquire_run_lock(output_dir: str | os.PathLike[str]) -> RunLock:
    """Become the one process writing ``output_dir`` (created if needed), or raise an OptBenchError naming the
    process that is. Non-blocking: a second run is refused at once rather than queued behind the first."""
    out = Path(output_dir)
    created = False
    for _ in range(100):
        handle, created_now = _open_lock_file(out)
        created = created or created_now
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _busy(out, handle)
            handle.close()
            raise error from None
        if _is_current(handle, out / RUN_LOCK_FILE):
            break
        handle.close()  # we locked a file its releasing owner had just removed: lock the one at the path now
    else:
        raise OptBenchError(f"could not lock output_dir '{out}' (its lock file kept changing): try again.")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return RunLock(out, handle, created)
