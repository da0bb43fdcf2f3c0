"""A resumed run is the run its label says: the plan's identity is stamped into every checkpoint, and a resume with
settings that change the result (learning rate, optimizer, seed, model size, the data's content) is refused with
exit 2 before any data or model work, naming each changed key, whatever directory the checkpoint is in, and leaves
the run directory as it was; a checkpoint without a verifiable stamp is refused unless forced, and the records
then say forced; the same settings, or a change that does not touch the result (output_dir, logging and saving
cadence), resume as before. The run directory's run_identity.json is a record only: damaged or deleted, it changes
nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.run import train as run_mod
from hf_optbench.run.identity import identity_changes
from hf_optbench.rundir import IDENTITY_FILE, STAMP_KEY

from fixtures.warm_run import run_python

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
ARGS = ["--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", "--eval_steps", "4",
        "--block_size", "64", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2",
        "--seed", "0", "--use_cpu", "true", "--write_model_card", "false"]

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hf_optbench.run", QUICK, "--output_dir", str(out), *ARGS, *extra]
    return run_python(cmd, cwd=ROOT, env=_env())


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run that stopped after checkpoint-2 (a later checkpoint removed, its summary marked failed)."""
    out = tmp_path_factory.mktemp("identity") / "run"
    proc = _run(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for ckpt in out.glob("checkpoint-*"):
        if ckpt.name != "checkpoint-2":
            shutil.rmtree(ckpt)
    summary = json.loads((out / "summary.json").read_text())
    summary["status"] = "failed"
    (out / "summary.json").write_text(json.dumps(summary))
    return out


@pytest.fixture
def run_dir(stopped_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(stopped_run, copy)
    return copy


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _tripwire(*_args, **_kwargs):
    raise AssertionError("data/model work started")


def _resume_argv(out: Path, *extra: str) -> list[str]:
    return [QUICK, "--output_dir", str(out), *ARGS, "--resume_from_checkpoint", "true", *extra]


@pytest.mark.parametrize("change, keys", [
    (("--learning_rate", "1e-2"), ["learning_rate"]),
    (("--optimizer", "lion"), ["optimizer"]),
    (("--seed", "5"), ["seed"]),
    (("--model_size", "mini"), ["model_size"]),
], ids=["learning_rate", "optimizer", "seed", "model_size"])
def test_changed_resume_is_refused_before_any_work(change, keys, run_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    before = _snapshot(run_dir)
    rc = run_mod.main(_resume_argv(run_dir, *change))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: cannot resume"), err
    for key in keys:
        assert f" {key} " in lines[0] and "->" in lines[0], lines[0]
    assert f"-> {change[1]}" in lines[0] or change[0] == "--learning_rate", lines[0]
    assert "--output_dir" in lines[0] and "--overwrite_output_dir" in lines[0], lines[0]
    assert _snapshot(run_dir) == before  # config.yaml, summary.json, checkpoints: nothing moved or rewritten


def test_unaffected_keys_do_not_block(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """Another output_dir (the run moved) and another logging/saving/eval cadence: the resume goes on to the data;
    the same move with another learning rate does not."""
    moved = tmp_path / "moved"
    shutil.move(run_dir, moved)
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    cadence = ("--logging_steps", "2", "--save_steps", "3", "--eval_steps", "2", "--metrics_flush_every", "5")
    assert run_mod.main(_resume_argv(moved, *cadence, "--learning_rate", "1e-2")) == 2
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main(_resume_argv(moved, *cadence))


def test_a_run_resumes_from_its_own_config_yaml(run_dir: Path, monkeypatch, capsys) -> None:
    """config.yaml states the betas that ran (the cited 0.99, not transformers' 0.999) explicitly: the identity
    compares what the optimizer is built with, so the run's own config.yaml resumes it and another beta does not."""
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    own = [str(run_dir / "config.yaml"), "--output_dir", str(run_dir), "--resume_from_checkpoint", "true"]
    assert run_mod.main([*own, "--adam_beta2", "0.95"]) == 2
    assert "optimizer_constructor" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main(own)


def _drop_stamp(ckpt: Path) -> None:
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state["stateful_callbacks"][STAMP_KEY]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_or_deleted_run_identity_file_lets_no_changed_resume_through(damage: str, run_dir: Path,
                                                                                monkeypatch, capsys) -> None:
    """Issue 30 item 2: with run_identity.json truncated or deleted, a resume at --learning_rate 0.01 or as Lion was
    let through (labelled 0.01 / Lion, training the old state): the checkpoint's own stamp refuses both now."""
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    if damage == "truncated":
        (run_dir / IDENTITY_FILE).write_text((run_dir / IDENTITY_FILE).read_text()[:40])
    else:
        (run_dir / IDENTITY_FILE).unlink()
    assert run_mod.main(_resume_argv(run_dir, "--learning_rate", "1e-2")) == 2
    assert "learning_rate 0.001 -> 0.01" in capsys.readouterr().err
    assert run_mod.main(_resume_argv(run_dir, "--optimizer", "lion")) == 2
    assert "optimizer adamw -> lion" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main(_resume_argv(run_dir))  # unchanged: resumes


def test_a_checkpoint_without_a_verifiable_identity_is_refused_unless_forced(run_dir: Path, monkeypatch,
                                                                              capsys) -> None:
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    _drop_stamp(run_dir / "checkpoint-2")
    assert run_mod.main(_resume_argv(run_dir)) == 2
    err = capsys.readouterr().err
    assert "checkpoint-2 carries no verifiable identity" in err and "--resume_from_checkpoint force" in err
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main([QUICK, "--output_dir", str(run_dir), *ARGS, "--resume_from_checkpoint", "force"])


def test_a_forced_resume_finishes_and_its_records_say_forced(run_dir: Path) -> None:
    _drop_stamp(run_dir / "checkpoint-2")
    proc = _run(run_dir, "--resume_from_checkpoint", "force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["resumed_from"]["identity"] == "forced" and summary["resumed_from"]["step"] == 2
    stamp = json.loads((run_dir / "checkpoint-4" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert stamp[STAMP_KEY]["args"]["stamp"]["plan_hash"] == summary["plan_hash"]  # stamped from here on


def test_another_directorys_checkpoint_is_checked_against_its_own_stamp(run_dir: Path, tmp_path: Path,
                                                                        monkeypatch, capsys) -> None:
    """Issue 30 item 3: --resume_from_checkpoint D/u/checkpoint-2 --learning_rate 0.05 into another output_dir
    recorded 0.05 and trained at 0.001; the checkpoint's stamp refuses it wherever it lies."""
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    other = ["--output_dir", str(tmp_path / "v"), "--resume_from_checkpoint", str(run_dir / "checkpoint-2")]
    assert run_mod.main([QUICK, *ARGS, *other, "--learning_rate", "0.05"]) == 2
    assert "learning_rate 0.001 -> 0.05" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main([QUICK, *ARGS, *other])


def test_a_changed_data_file_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 30 item 4: the identity held the data file's path, so a resume after its content changed trained the
    steps after the checkpoint on other text; the plan's fingerprint is of the content."""
    from hf_optbench.data.sources import THAI_SAMPLE_FILE

    data = tmp_path / "data.json"
    shutil.copy(THAI_SAMPLE_FILE, data)
    local = ["--data_source", "local", "--data_files", str(data), "--text_column", "text"]
    out = tmp_path / "run"
    proc = _run(out, *local)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(out / "checkpoint-4")  # stopped after checkpoint-2
    summary = json.loads((out / "summary.json").read_text())
    summary["status"] = "failed"
    (out / "summary.json").write_text(json.dumps(summary))
    text = data.read_text(encoding="utf-8")
    data.write_text(text.replace("ก", "ข", 1), encoding="utf-8")  # one Thai letter: same size, same path
    monkeypatch.setattr(run_mod, "prepare", _tripwire)
    assert run_mod.main([*_resume_argv(out), *local]) == 2
    assert "data_content files:" in capsys.readouterr().err
    data.write_text(text, encoding="utf-8")
    with pytest.raises(AssertionError, match="data/model work started"):
        run_mod.main([*_resume_argv(out), *local])


def test_same_config_resumes_and_finishes(run_dir: Path) -> None:
    proc = _run(run_dir, "--resume_from_checkpoint", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["resumed_from"]["identity"] == "verified"
    stamps = [json.loads((run_dir / f"checkpoint-{n}" / "trainer_state.json").read_text())["stateful_callbacks"]
              [STAMP_KEY]["args"]["stamp"]["plan_hash"] for n in (2, 4)]
    assert stamps == [summary["plan_hash"]] * 2
    assert json.loads((run_dir / IDENTITY_FILE).read_text())["plan_hash"] == summary["plan_hash"]


def test_identity_changes_name_every_key_that_differs() -> None:
    old = {"learning_rate": 1e-3, "seed": 0, "gone": 1}
    new = {"learning_rate": 1e-2, "seed": 0, "added": 2}
    assert identity_changes(old, new) == {"learning_rate": (1e-3, 1e-2), "gone": (1, "(absent)"),
                                          "added": ("(absent)", 2)}


# A stand-in for hf_optbench.run in a sweep: the real argument parsing and resume checks, no data or model work.
CHECKS_ONLY_RUN = '''
import sys
from hf_optbench.run import train
def tripwire(*_a, **_k):
    raise SystemExit("data/model work started")
train.prepare = tripwire
sys.exit(train.main(sys.argv[1:]))
'''


def _sweep_file(tmp_path: Path, learning_rate: float) -> Path:
    import yaml

    stand_in = tmp_path / "checks_only_run.py"
    stand_in.write_text(CHECKS_ONLY_RUN)
    sweep = {"base": QUICK, "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 4, "block_size": 64, "learning_rate": learning_rate},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [0]},
             "launcher": {"type": "command", "command": ["{python}", str(stand_in)], "validate": False}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_a_sweep_restarted_with_a_changed_file_reports_the_refusal(tmp_path: Path) -> None:
    """A killed sweep's run (a checkpoint, its identity recorded) is resumed by the restarted sweep; the sweep file
    now gives another learning rate, so the run refuses, and the sweep says why in its progress line."""
    import io

    from hf_optbench.config.parse import parse_args
    from hf_optbench.run.identity import PlanStamp, plan_stamp
    from hf_optbench.run.plan import resolve_plan
    from hf_optbench.study.sweep import run_sweep
    from hf_optbench.study.sweep_spec import load_sweep

    first = load_sweep(_sweep_file(tmp_path, 1e-3))
    run = first.runs[0]
    run_dir = first.run_dir(run)
    stamp = PlanStamp(plan_stamp(resolve_plan(parse_args([*run.args, "--output_dir", str(run_dir)]))))
    (run_dir / "checkpoint-2").mkdir(parents=True)
    (run_dir / "checkpoint-2" / "trainer_state.json").write_text(
        json.dumps({"global_step": 2, "stateful_callbacks": {STAMP_KEY: stamp.state()}}))

    log = io.StringIO()
    assert run_sweep(_sweep_file(tmp_path, 1e-2), stream=log) == {"failed": 1}
    text = log.getvalue()
    assert "(resuming from its last checkpoint)" in text
    assert "refused by the run (exit code 2): cannot resume" in text and "learning_rate 0.001 -> 0.01" in text, text
