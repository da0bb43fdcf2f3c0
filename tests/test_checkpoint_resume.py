"""No run's work is lost: a run killed with SIGKILL after its first checkpoint, resumed with
`--resume_from_checkpoint true` in the same output_dir, ends with the same loss curve and weights as an
uninterrupted run, and metrics.jsonl holds every step exactly once.

Tolerance: on CPU with one thread the resumed run replays the same float32 operations in the same order (data
order, RNG state, optimizer and scheduler state all restored from the checkpoint), so the comparison is exact
(RESUME_ATOL = 0, measured 0.0 for the loss at every step and for every weight).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.config.parse import ResumeRequest

from fixtures.installed import hf_optbench_command
from fixtures.warm_run import run_python

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/quickstart_cpu.yaml"
STEPS, SAVE_EVERY = 12, 4
RESUME_ATOL = 0.0
ARGS = ["--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps", str(SAVE_EVERY),
        "--eval_steps", str(STEPS), "--block_size", "64", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2", "--seed", "0",
        "--use_cpu", "true", "--write_model_card", "false", "--metrics_flush_every", "1",
        # a row every step: the kill must find rows past a checkpoint before the next save starts (with a log
        # every 10 steps the rows of steps 5-8 come at the save of checkpoint-8, which the recorder logs before)
        "--logging_steps", "1"]

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hf_optbench.run", RECIPE, "--output_dir", str(out), *ARGS, *extra]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = run_python(_cmd(out, *extra), cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _checkpoint_done(out: Path, step: int) -> bool:
    """trainer_state.json is written after the weights, optimizer, scheduler and RNG state."""
    state = out / f"checkpoint-{step}" / "trainer_state.json"
    try:
        return json.loads(state.read_text())["global_step"] == step
    except (OSError, ValueError, KeyError):
        return False


def _last_complete_checkpoint(out: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")]
    return max((s for s in steps if _checkpoint_done(out, s)), default=0)


def _last_row_step(out: Path) -> int:
    try:
        return max((r["step"] for r in _rows(out) if r["kind"] == "train"), default=0)
    except (OSError, ValueError):  # file absent, or a line half-written at this instant
        return 0


def _kill_between_checkpoints(out: Path) -> tuple[int, int, int]:
    """Start a run and SIGKILL it once a checkpoint is complete AND metrics.jsonl already holds steps after it
    (rows the resumed run must replace, not repeat). The process is frozen (SIGSTOP) while the condition is
    checked, so the state inspected is the state killed. Returns (last complete checkpoint, last row step, pid)."""
    seen: dict[str, int] = {}

    def look() -> None:
        if "row" in seen or not (_last_complete_checkpoint(out) >= SAVE_EVERY
                                 and _last_row_step(out) > _last_complete_checkpoint(out)):
            return
        os.kill(seen["pid"], signal.SIGSTOP)
        checkpoint, row = _last_complete_checkpoint(out), _last_row_step(out)
        if row > checkpoint:
            seen.update(checkpoint=checkpoint, row=row)
            os.kill(seen["pid"], signal.SIGKILL)
        else:
            os.kill(seen["pid"], signal.SIGCONT)  # a checkpoint completed in between: wait for the next rows

    proc = run_python(_cmd(out), cwd=ROOT, env=_env(), on_start=lambda pid: seen.update(pid=pid), on_poll=look,
                      poll_s=0.01)
    assert "row" in seen, "the run ended before it was killed: " + proc.stderr[-3000:]
    assert proc.returncode == -signal.SIGKILL
    return seen["checkpoint"], seen["row"], seen["pid"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("resume")
    timings = {}
    t0 = time.perf_counter()
    _run(base / "full")
    timings["uninterrupted"] = time.perf_counter() - t0

    killed = base / "killed"
    t0 = time.perf_counter()
    checkpoint, last_row, killed_pid = _kill_between_checkpoints(killed)
    killed_rows = _rows(killed)
    lock_left = (killed / "run.lock").read_text()
    killed_summary = killed / "summary.json"
    status = json.loads(killed_summary.read_text()).get("status") if killed_summary.is_file() else None
    # a second copy, as if the kill had also hit the save of the next checkpoint: a checkpoint folder with a
    # truncated weights file and no trainer_state.json. Resuming must skip it, not crash on it.
    partial = base / "killed_mid_save"
    shutil.copytree(killed, partial)
    torn = partial / f"checkpoint-{checkpoint + SAVE_EVERY}"
    torn.mkdir()
    shutil.copy(partial / f"checkpoint-{checkpoint}" / "config.json", torn / "config.json")
    (torn / "model.safetensors").write_bytes((partial / f"checkpoint-{checkpoint}" / "model.safetensors").read_bytes()[:100])
    t_kill = time.perf_counter() - t0

    t0 = time.perf_counter()
    _run(killed, "--resume_from_checkpoint", "true")
    timings["killed_then_resumed"] = t_kill + time.perf_counter() - t0
    print(f"\nkilled at step {last_row}, last complete checkpoint {checkpoint}; timings (s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    return {"full": base / "full", "resumed": killed, "killed_rows": killed_rows, "killed_status": status,
            "checkpoint": checkpoint, "partial": partial, "timings": timings, "killed_pid": killed_pid,
            "lock_left": lock_left}


def _train_rows(out: Path) -> list[dict]:
    return [r for r in _rows(out) if r["kind"] == "train"]


def test_the_kill_left_an_unfinished_run_with_rows_past_its_checkpoint(runs: dict) -> None:
    assert runs["killed_status"] != "completed"
    steps = [r["step"] for r in runs["killed_rows"] if r["kind"] == "train"]
    assert steps and runs["checkpoint"] < steps[-1] < STEPS


def test_metrics_jsonl_has_every_step_exactly_once(runs: dict) -> None:
    steps = [r["step"] for r in _train_rows(runs["resumed"])]
    assert steps == list(range(1, STEPS + 1)), steps
    evals = [r["step"] for r in _rows(runs["resumed"]) if r["kind"] == "eval"]
    assert len(evals) == len(set(evals)), f"duplicate eval rows {evals}"


def test_resumed_loss_curve_equals_uninterrupted(runs: dict) -> None:
    full = {r["step"]: r for r in _train_rows(runs["full"])}
    resumed = {r["step"]: r for r in _train_rows(runs["resumed"])}
    assert set(full) == set(resumed)
    delta = max(abs(full[s]["loss"] - resumed[s]["loss"]) for s in full)
    print(f"\nmax |loss(resumed) - loss(uninterrupted)| over {STEPS} steps: {delta:.3g}")
    assert delta <= RESUME_ATOL
    for s in full:
        assert resumed[s]["lr"] == pytest.approx(full[s]["lr"], rel=1e-12)
        assert resumed[s]["tokens"] == full[s]["tokens"]
    s_full = json.loads((runs["full"] / "summary.json").read_text())
    s_res = json.loads((runs["resumed"] / "summary.json").read_text())
    assert s_res["status"] == "completed" and s_res["steps"] == STEPS
    assert s_res["final_train_loss"] == s_full["final_train_loss"]
    assert s_res["final_eval_loss"] == pytest.approx(s_full["final_eval_loss"], abs=RESUME_ATOL)


def test_resume_skips_a_checkpoint_torn_by_the_kill(runs: dict) -> None:
    """`--resume_from_checkpoint true` must pick the last COMPLETE checkpoint (Trainer's get_last_checkpoint
    takes the highest-numbered folder, finished or not)."""
    partial = runs["partial"]
    proc = run_python(_cmd(partial, "--resume_from_checkpoint", "true"), cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    full = {r["step"]: r["loss"] for r in _train_rows(runs["full"])}
    resumed = {r["step"]: r["loss"] for r in _train_rows(partial)}
    assert [r["step"] for r in _train_rows(partial)] == list(range(1, STEPS + 1))
    assert max(abs(full[s] - resumed[s]) for s in full) <= RESUME_ATOL
    torn, chosen = f"checkpoint-{runs['checkpoint'] + SAVE_EVERY}", f"checkpoint-{runs['checkpoint']}"
    said = [line for line in proc.stderr.splitlines() if line.startswith(f"[hf_optbench] {torn} is incomplete")]
    assert len(said) == 1 and f"resuming from {chosen}" in said[0], proc.stderr[-3000:]  # issue 41: said, both named


def test_final_weights_equal_uninterrupted(runs: dict) -> None:
    from safetensors.torch import load_file

    a = load_file(str(runs["full"] / f"checkpoint-{STEPS}" / "model.safetensors"))
    b = load_file(str(runs["resumed"] / f"checkpoint-{STEPS}" / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= RESUME_ATOL, f"max weight difference {worst}"


def test_checkpoints_are_safetensors_and_load_without_unpickling_code(runs: dict) -> None:
    import torch
    from transformers.trainer_pt_utils import safe_globals

    checkpoints = sorted(runs["resumed"].glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [int(p.name.split("-")[1]) for p in checkpoints][-1] == STEPS  # one at the end
    for ck in checkpoints:
        assert (ck / "model.safetensors").is_file(), ck
        assert not (ck / "pytorch_model.bin").exists(), ck
        # what Trainer loads on resume must load with weights_only=True (no arbitrary objects pickled); the
        # allowlist is the one Trainer itself uses for rng_state.pth: numpy arrays and dtypes, data only
        with safe_globals():
            for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
                torch.load(ck / name, map_location="cpu", weights_only=True)


def test_resume_true_without_checkpoint_is_a_clear_error(tmp_path: Path, capsys, monkeypatch) -> None:
    from hf_optbench.run import train as run

    monkeypatch.chdir(ROOT)
    rc = run.main([RECIPE, "--output_dir", str(tmp_path / "empty"), *ARGS, "--resume_from_checkpoint", "true"])
    assert rc == 2 and "checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "metrics.jsonl").exists()


def test_a_lock_left_by_the_killed_run_does_not_block_its_resume(runs: dict) -> None:
    assert runs["lock_left"].startswith(f"pid {runs['killed_pid']} ")  # the dead owner was still named
    assert json.loads((runs["resumed"] / "summary.json").read_text())["status"] == "completed"
    assert not (runs["resumed"] / "run.lock").exists()  # released (and removed) by the resumed run at its end


def test_summary_covers_every_segment_of_a_resumed_run(runs: dict) -> None:
    """train_runtime_s of a resumed run is the whole run's (the sum of its segments), not the last segment's."""
    full = json.loads((runs["full"] / "summary.json").read_text())
    assert [(s["start_step"], s["end_step"]) for s in full["train_segments"]] == [(0, STEPS)]
    resumed = json.loads((runs["resumed"] / "summary.json").read_text())
    segments = resumed["train_segments"]
    assert [(s["start_step"], s["end_step"]) for s in segments] == [(0, runs["checkpoint"]),
                                                                     (runs["checkpoint"], STEPS)]
    assert all(s["runtime_s"] > 0 for s in segments)
    assert resumed["train_runtime_s"] == pytest.approx(sum(s["runtime_s"] for s in segments), rel=1e-9)
    print(f"\ntrain_runtime_s: uninterrupted {full['train_runtime_s']:.2f}, killed + resumed "
          f"{resumed['train_runtime_s']:.2f} (segments " + ", ".join(f"{s['runtime_s']:.2f}" for s in segments) + ")")


def test_torn_checkpoint_is_moved_out_of_the_checkpoint_namespace(runs: dict) -> None:
    partial = runs["partial"]
    torn = list((partial / "torn_checkpoints").glob(f"checkpoint-{runs['checkpoint'] + SAVE_EVERY}.*"))
    assert len(torn) == 1 and (torn[0] / "model.safetensors").is_file()
    assert not list(partial.glob("checkpoint-*.*"))


STUB_PLAN = SimpleNamespace(resume=ResumeRequest("latest"), plan_hash="h", identity={"learning_rate": 1e-3},
                            args=SimpleNamespace(training=SimpleNamespace(fp16=False)))


def _fake_checkpoint(out: Path, step: int, complete: bool) -> Path:
    """A checkpoint-N folder with readable weights (a tensor holding N) and, when complete, a trainer_state.json
    stamped with :data:`STUB_PLAN` (transformers writes it last)."""
    import torch
    from safetensors.torch import save_file

    ck = out / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    save_file({"w": torch.full((2,), float(step))}, str(ck / "model.safetensors"))
    if complete:
        stamp = {"plan_hash": STUB_PLAN.plan_hash, "identity": STUB_PLAN.identity}
        (ck / "trainer_state.json").write_text(json.dumps(
            {"global_step": step, "stateful_callbacks": {"PlanStamp": {"args": {"stamp": stamp}, "attributes": {}}}}))
    return ck


def _weights_step(ck: Path) -> float:
    from safetensors.torch import load_file

    return float(load_file(str(ck / "model.safetensors"))["w"][0])


def test_every_path_a_run_creates_fits_within_the_longest_the_output_dir_check_allows(runs: dict,
                                                                                      tmp_path: Path) -> None:
    """config.checks.RUN_DIR_LONGEST_INSIDE is what check_path_fits adds to an output_dir before PATH_MAX: every path
    a real run (checkpoints, a kill, a resume) created inside its directory, and a checkpoint of it set aside as
    torn, is no longer, so a directory that passes the check leaves room for all of them."""
    from hf_optbench.config.checks import RUN_DIR_LONGEST_INSIDE
    from hf_optbench.run.identity import move_torn_checkpoint

    torn = tmp_path / "run"
    shutil.copytree(runs["full"] / f"checkpoint-{STEPS}", torn / f"checkpoint-{STEPS}")
    move_torn_checkpoint(torn / f"checkpoint-{STEPS}")
    for run in (runs["full"], runs["resumed"], torn):
        longest = max((str(p.relative_to(run)) for p in run.rglob("*")), key=lambda rel: len(os.fsencode(rel)))
        assert len(os.fsencode(longest)) <= len(os.fsencode(RUN_DIR_LONGEST_INSIDE)), longest


def test_a_torn_checkpoint_survives_save_total_limit_rotation(tmp_path: Path) -> None:
    """Trainer's rotation (save_total_limit) globs checkpoint-* and reads the number in any such name: a torn copy
    left there as checkpoint-12.incomplete was counted and deleted by the resumed run's next save."""
    from transformers.trainer_utils import rotate_checkpoints

    from hf_optbench.run.identity import choose_checkpoint

    out = tmp_path / "run"
    _fake_checkpoint(out, 4, complete=True)
    _fake_checkpoint(out, 8, complete=True)
    _fake_checkpoint(out, 12, complete=False)
    assert choose_checkpoint(STUB_PLAN, out).checkpoint == out / "checkpoint-8"
    _fake_checkpoint(out, 12, complete=True)  # the resumed run saves again
    _fake_checkpoint(out, 16, complete=True)
    rotate_checkpoints(str(out), save_total_limit=1)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-16"]
    kept = list((out / "torn_checkpoints").glob("checkpoint-12.*"))
    assert len(kept) == 1 and _weights_step(kept[0]) == 12


def test_the_same_step_torn_twice_keeps_both_copies(tmp_path: Path) -> None:
    """A second torn copy of the same step crashed the resume with `OSError: Directory not empty`."""
    from hf_optbench.run.identity import choose_checkpoint

    out = tmp_path / "run"
    _fake_checkpoint(out, 4, complete=True)
    for _ in range(2):
        _fake_checkpoint(out, 8, complete=False)
        assert choose_checkpoint(STUB_PLAN, out).checkpoint == out / "checkpoint-4"
    kept = sorted((out / "torn_checkpoints").iterdir())
    assert len(kept) == 2 and all((k / "model.safetensors").is_file() for k in kept)
    assert not (out / "checkpoint-8").exists()


def test_resuming_a_finished_run_is_a_no_op_that_says_so(runs: dict, tmp_path: Path) -> None:
    """Not more steps past max_steps that rewrite the results, and no relabelling by the resume's arguments. Through
    the installed command, whose answer is one line saying what happened (issue 33: it also printed the result
    block, "wrote RUN (...)", as if the run had just been written)."""
    exe = hf_optbench_command()
    done = tmp_path / "done"
    shutil.copytree(runs["full"], done)
    before = {p.name: p.read_bytes() for p in done.iterdir() if p.is_file()}
    proc = run_python([sys.executable, str(exe), "run", RECIPE, "--output_dir", str(done), *ARGS,
                       "--resume_from_checkpoint", "true", "--optimizer", "lion", "--seed", "9"], cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if str(done) in line]  # ([INFO] lines: WANDB_MODE's notice)
    assert said == [
        f"{done} already finished at step {STEPS}: nothing to do (summary.json unchanged). To train it again, use a "
        "new --output_dir, or --overwrite_output_dir true without --resume_from_checkpoint."], proc.stdout
    assert "wrote" not in proc.stdout + proc.stderr
    assert {p.name: p.read_bytes() for p in done.iterdir() if p.is_file()} == before
    assert not (done / f"checkpoint-{STEPS + SAVE_EVERY}").exists()


def test_a_finished_run_resumed_with_overwrite_does_not_train_past_its_end(runs: dict, tmp_path: Path) -> None:
    """Issue 32 item 1: `--resume_from_checkpoint true --overwrite_output_dir true` on a finished run trained step
    max_steps + 1, wrote its checkpoint and relabelled summary.json; it is a no-op that says so."""
    done = tmp_path / "done"
    shutil.copytree(runs["full"], done)
    before = {name: (done / name).read_bytes() for name in ("summary.json", "metrics.jsonl", "config.yaml")}
    proc = _run(done, "--resume_from_checkpoint", "true", "--overwrite_output_dir", "true")
    assert f"already finished at step {STEPS}: nothing to do" in proc.stdout
    assert {name: (done / name).read_bytes() for name in before} == before
    assert not (done / f"checkpoint-{STEPS + 1}").exists()


def test_a_run_stopped_after_its_last_checkpoint_is_not_trained_past_its_end(runs: dict, tmp_path: Path) -> None:
    """Issue 32 item 1, second variant: summary.json missing (a kill between the last checkpoint and the summary
    write) and the newest checkpoint at max_steps: exit 2 in one line naming the checkpoint, nothing trained."""
    done = tmp_path / "done"
    shutil.copytree(runs["full"], done)
    _stop_before_summary(done)
    rows = (done / "metrics.jsonl").read_bytes()
    proc = run_python(_cmd(done, "--resume_from_checkpoint", "true"), cwd=ROOT, env=_env())
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    print(f"rc {proc.returncode}: {' | '.join(lines)}")  # what the user saw (pytest -s)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"checkpoint-{STEPS}" in lines[0] and "nothing is left to train" in lines[0]
    assert not (done / f"checkpoint-{STEPS + 1}").exists() and not (done / "summary.json").exists()
    assert (done / "metrics.jsonl").read_bytes() == rows


def _stop_before_summary(run: Path) -> None:
    """Make a copy of the finished run one that stopped before writing its summary.json: without it, and without
    the final model, which the run saves only after summary.json (a final model beside no summary is a damaged
    finished run, refused: tests/cli/test_hostile_inputs.py)."""
    for name in ("summary.json", "model.safetensors", "config.json", "generation_config.json"):
        (run / name).unlink()


def _zero_header(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.write(b"\0" * 8)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage", ["model.safetensors header zeroed", "optimizer.pt truncated"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(runs: dict, tmp_path: Path, damage: str) -> None:
    """Issue 32 (unclear): the newest checkpoint's weights header zeroed, or its optimizer.pt truncated, was a
    traceback on resume. The run now says so in one line, resumes from the previous complete checkpoint (set the
    damaged one aside, never deleted) and ends with the uninterrupted run's losses."""
    run = tmp_path / "run"
    shutil.copytree(runs["full"], run)
    _stop_before_summary(run)  # stopped before its summary: a resume is due
    newest, previous = run / f"checkpoint-{STEPS}", run / f"checkpoint-{STEPS - SAVE_EVERY}"
    (_zero_header if "header" in damage else _truncate)(newest / damage.split()[0])
    proc = _run(run, "--resume_from_checkpoint", "true")
    said = [line for line in proc.stderr.splitlines() if "is damaged" in line]
    assert len(said) == 1 and damage.split()[0] in said[0] and f"resuming from {previous.name}" in said[0], said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"]["step"] == STEPS - SAVE_EVERY
    assert summary["resumed_from"]["skipped_damaged"][0].startswith(f"checkpoint-{STEPS}:")
    full = {r["step"]: r["loss"] for r in _train_rows(runs["full"])}
    assert {r["step"]: r["loss"] for r in _train_rows(run)} == full
    assert len(list((run / "torn_checkpoints").glob(f"checkpoint-{STEPS}.*"))) == 1


def test_no_readable_checkpoint_is_exit_2_naming_them(runs: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["full"], run)
    _stop_before_summary(run)
    for ckpt in run.glob("checkpoint-*"):
        _zero_header(ckpt / "model.safetensors")
    proc = run_python(_cmd(run, "--resume_from_checkpoint", "true"), cwd=ROOT, env=_env())
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    print(f"rc {proc.returncode}: {' | '.join(lines)}")  # what the user saw (pytest -s)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "no checkpoint is readable" in lines[0] and f"checkpoint-{STEPS} (model.safetensors" in lines[0]
    assert {p.name for p in run.glob("checkpoint-*")} == {f"checkpoint-{STEPS - SAVE_EVERY}",
                                                           f"checkpoint-{STEPS}"}  # nothing moved


# ------------------------------------------------------------------------------- issue 41: nothing lost
def _installed(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``hf-optbench run`` (the installed command's script, run by the warm worker's fork)."""
    return run_python([sys.executable, str(hf_optbench_command()), "run", RECIPE, "--output_dir", str(out), *ARGS,
                       *extra], cwd=ROOT, env=_env())


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    print(f"rc {proc.returncode}: {' | '.join(lines)}")  # what the user saw (pytest -s)
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("damage", ["summary.json cut short", "summary.json deleted"])
def test_a_finished_run_whose_summary_is_damaged_is_never_written_into(runs: dict, tmp_path: Path,
                                                                       damage: str) -> None:
    """Issue 41 item 1: a run finished with no checkpoint kept, its summary.json cut short (a crash while writing
    it, a full disk) or deleted; a seed-3 run into the same output_dir replaced its model and metrics.jsonl, exit
    0. It is refused in one line naming what is damaged and the two ways on, and nothing changes."""
    done = tmp_path / "done"
    shutil.copytree(runs["full"], done, ignore=shutil.ignore_patterns("checkpoint-*"))
    summary = done / "summary.json"
    if damage.endswith("cut short"):
        summary.write_bytes(summary.read_bytes()[:100])
    else:
        summary.unlink()
    before = _files(done)
    line = _error_line(_installed(done, "--seed", "3"))
    what = "summary.json is not readable JSON" if damage.endswith("cut short") else "summary.json is missing"
    assert f"output_dir '{done}' holds a damaged run: {what}" in line and "model.safetensors" in line, line
    assert "Choose a new --output_dir, or pass --overwrite_output_dir true" in line
    assert _files(done) == before
    if damage.endswith("deleted"):  # resumed too: whether it finished cannot be told, so it is refused as well
        _error_line(_installed(done, "--resume_from_checkpoint", "true"))
        assert _files(done) == before


def test_the_plan_stamp_records_the_step_each_checkpoint_was_written_at(runs: dict) -> None:
    from hf_optbench.run.identity import read_stamp, read_trainer_state

    for ckpt in runs["full"].glob("checkpoint-*"):
        state = read_trainer_state(ckpt)
        assert read_stamp(state)["step"] == state["global_step"] == int(ckpt.name.split("-")[1])


def test_a_resume_from_an_edited_global_step_is_refused_naming_the_checkpoints_own_records(runs: dict,
                                                                                          tmp_path: Path) -> None:
    """Issue 41 item 2: the newest checkpoint's global_step set to 1 (its weights are from step 12) resumed
    "identity verified" and trained steps 2-12 again on the step-12 weights. Its folder name, plan stamp,
    scheduler and optimizer all say 12: the resume is refused, naming them, and nothing is moved or written."""
    run = tmp_path / "run"
    shutil.copytree(runs["full"], run)
    _stop_before_summary(run)
    state_file = run / f"checkpoint-{STEPS}" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["global_step"] = 1
    state_file.write_text(json.dumps(state))
    before = _files(run)
    line = _error_line(_installed(run, "--resume_from_checkpoint", "true"))
    assert f"checkpoint-{STEPS}'s records disagree on its step: trainer_state.json says global_step 1 but" in line
    for record in (f"its folder name says step {STEPS}", f"its plan stamp was written at step {STEPS}",
                   f"its scheduler.pt has stepped {STEPS} times", f"its optimizer.pt holds step {STEPS}"):
        assert record in line, line
    assert f"--resume_from_checkpoint {run}/checkpoint-{STEPS - SAVE_EVERY}" in line
    assert _files(run) == before


def test_a_newer_checkpoint_whose_trainer_state_does_not_parse_is_passed_over_saying_so(runs: dict,
                                                                                        tmp_path: Path) -> None:
    """Issue 41 item 2: with the newest checkpoint's trainer_state.json not valid JSON, the run fell back to the
    previous checkpoint and moved the newest aside, saying so only in summary.json. The console now names both."""
    run = tmp_path / "run"
    shutil.copytree(runs["full"], run)
    _stop_before_summary(run)
    (run / f"checkpoint-{STEPS}" / "trainer_state.json").write_text("{not json")
    proc = _installed(run, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith(f"[hf_optbench] checkpoint-{STEPS} is "
                                                                          "damaged (trainer_state.json: ")]
    print(f"rc {proc.returncode}: {' | '.join(said)}")  # what the user saw (pytest -s)
    assert len(said) == 1 and f"resuming from checkpoint-{STEPS - SAVE_EVERY}" in said[0], proc.stderr[-3000:]
    assert "torn_checkpoints/" in said[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"]["step"] == STEPS - SAVE_EVERY
    assert summary["resumed_from"]["skipped_damaged"][0].startswith(f"checkpoint-{STEPS}: trainer_state.json")
    full = {r["step"]: r["loss"] for r in _train_rows(runs["full"])}
    assert {r["step"]: r["loss"] for r in _train_rows(run)} == full
