"""One owner per run directory: a second run into a busy output_dir stops at once with exit 2 naming the holder,
touching nothing; a killed holder's lock does not block a resume; only a launch's main process takes the lock."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.run import preflight
from hf_optbench.run import train as run_mod
from hf_optbench.run.lock import acquire_run_lock
from hf_optbench.rundir import RUN_LOCK_FILE

ROOT = Path(__file__).resolve().parents[1]
QUICK = "recipes/quickstart_cpu.yaml"


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("RANK", None)
    return env


def _snapshot(out: Path) -> dict[str, str]:
    """Every file under ``out`` (relative path -> sha256)."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def _no_parse(*args, **kwargs):
    raise AssertionError("parse_args (and with it transformers) must not run when output_dir is busy")


def test_second_process_is_refused_in_under_2_s_naming_the_holder_and_changing_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "hf_optbench.run", QUICK, "--output_dir", str(out), "--max_steps", "100000",
         "--block_size", "32", "--per_device_train_batch_size", "2", "--eval_strategy", "no", "--save_strategy",
         "no", "--write_model_card", "false", "--metrics_flush_every", "1"],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        # the first run holds the lock and has written results (config.yaml, metrics rows) that must survive
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size > 0):
            assert first.poll() is None, "first run ended: " + first.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the first run wrote no metrics within 300 s"
            time.sleep(0.05)
        assert f"pid {first.pid} " in (out / RUN_LOCK_FILE).read_text()
        first.send_signal(signal.SIGSTOP)  # frozen, still holding the lock: its files cannot change under us
        before = _snapshot(out)
        t0 = time.perf_counter()
        second = subprocess.run([sys.executable, "-m", "hf_optbench.run", QUICK, "--output_dir", str(out),
                                 "--optimizer", "lion", "--max_steps", "5"],
                                cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        elapsed = time.perf_counter() - t0
        after = _snapshot(out)
    finally:
        first.send_signal(signal.SIGKILL)
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=60)
        first.stderr.close()
    print(f"\nsecond run refused in {elapsed:.2f} s: {second.stderr.strip()}")
    assert second.returncode == 2
    assert second.stderr.startswith("error: ") and len(second.stderr.strip().splitlines()) == 1
    assert f"pid {first.pid}" in second.stderr and "output_dir" in second.stderr
    assert "Traceback" not in second.stderr and second.stdout == ""
    assert after == before, "the refused run changed files of the running one"
    assert elapsed < 2.0, f"refused after {elapsed:.2f} s"


def test_busy_directory_is_refused_before_parsing(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "run"
    holder = acquire_run_lock(out)  # a separate open file: flock refuses it even within one process
    try:
        monkeypatch.setattr(run_mod, "parse_args", _no_parse)
        rc = run_mod.main([QUICK, "--output_dir", str(out), "--optimizer", "lion"])
    finally:
        holder.release()
    err = capsys.readouterr().err
    assert rc == 2 and f"pid {os.getpid()} " in err and len(err.strip().splitlines()) == 1


def test_output_dir_from_the_recipe_is_locked_too(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "run"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"optimizer: lion\noutput_dir: {out}\n")
    holder = acquire_run_lock(out)
    try:
        monkeypatch.setattr(run_mod, "parse_args", _no_parse)
        assert run_mod.main([str(recipe)]) == 2
    finally:
        holder.release()
    assert f"pid {os.getpid()} " in capsys.readouterr().err


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = ("import os, signal, sys; from hf_optbench.run.lock import acquire_run_lock; "
            "acquire_run_lock(sys.argv[1]); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=_env())
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert (out / RUN_LOCK_FILE).read_text().startswith(f"pid {proc.pid} ")  # the dead holder's line stays
    lock = acquire_run_lock(out)  # the kernel released the dead process's flock
    try:
        assert (out / RUN_LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")
    finally:
        lock.release()
    assert not (out / RUN_LOCK_FILE).exists()  # free again: the file exists only while a run holds it


def test_only_the_launch_main_process_takes_the_lock(tmp_path: Path, monkeypatch) -> None:
    """Under torchrun / accelerate launch every rank gets the same output_dir and RANK; ranks > 0 must neither
    take the lock (their own rank 0 holds it) nor be refused by it."""
    out = tmp_path / "run"
    holder = acquire_run_lock(out)
    try:
        monkeypatch.setenv("RANK", "1")
        assert preflight.preflight([QUICK, "--output_dir", str(out)])["model_size"] == "tiny"  # the recipe, read once
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(OptBenchError, match=f"pid {os.getpid()} "):
            preflight.preflight([QUICK, "--output_dir", str(out)])
    finally:
        holder.release()


def test_a_refused_start_leaves_no_directory_behind(tmp_path: Path, capsys) -> None:
    """A run that stops on bad input found after the lock (an eval batch larger than the validation split) leaves
    no empty output_dir with a lock file in it."""
    out = tmp_path / "new"
    rc = run_mod.main([str(ROOT / QUICK), "--output_dir", str(out), "--max_steps", "2", "--block_size", "32",
                       "--per_device_eval_batch_size", "100000"])
    assert rc == 2 and "per_device_eval_batch_size" in capsys.readouterr().err
    assert not out.exists()


def test_unwritable_output_dir_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("not a directory")
    with pytest.raises(OptBenchError, match="not a directory"):
        acquire_run_lock(target)
    with pytest.raises(OptBenchError, match="cannot be written"):
        acquire_run_lock(target / "below")


def test_a_lock_on_a_file_removed_by_its_releasing_owner_does_not_count(tmp_path: Path) -> None:
    """Release removes the lock file; a process that opened it just before must notice that the file it then
    locked is no longer the one at the path (else two runs could each hold "the" lock)."""
    from hf_optbench.run.lock import _is_current

    path = tmp_path / RUN_LOCK_FILE
    path.write_text("")
    with open(path, "a+") as stale:
        assert _is_current(stale, path)
        path.unlink()
        assert not _is_current(stale, path)
        path.write_text("")  # the next owner's file
        assert not _is_current(stale, path)
