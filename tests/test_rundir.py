"""rundir: the one write-then-rename helper, the run-id format, the summary reader and what an output_dir holds of an
earlier run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    METRICS_TAIL_BYTES,
    STAMP_KEY,
    atomic_path,
    check_no_foreign_files,
    foreign_files,
    last_train_step,
    parse_run_id,
    previous_run,
    read_summary,
    run_id_for,
    write_json_atomic,
    write_text_atomic,
)


def test_atomic_path_replaces_on_success_and_keeps_the_old_file_on_error(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path  # a writer that picks the format by name works
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]  # no temporary left behind
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_json_and_text_writers(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "summary.json", {"b": 1, "a": 2})
    assert (tmp_path / "summary.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert write_text_atomic(tmp_path / "x.csv", "a\r\nb") == tmp_path / "x.csv"
    assert (tmp_path / "x.csv").read_bytes() == b"a\r\nb"  # exactly as given


def test_run_ids_round_trip() -> None:
    assert run_id_for("lion", "mini", 1, 0.5) == "lion__mini__s1__lrx0.5"
    assert parse_run_id("lion__mini__s1__lrx0.5") == {"optimizer": "lion", "model_size": "mini", "seed": 1,
                                                     "lr_multiplier": 0.5}
    assert parse_run_id("not-a-sweep-run") == {}
    rid = run_id_for("adamw", "midi", 2, 2.0, wd_multiplier=3.0, budget_multiple=0.5)
    assert rid == "adamw__midi__s2__lrx2__wdx3__dx0.5"
    assert parse_run_id(rid) == {"optimizer": "adamw", "model_size": "midi", "seed": 2, "lr_multiplier": 2.0,
                                 "wd_multiplier": 3.0, "budget_multiple": 0.5}
    assert parse_run_id("adamw__tiny__s1__dx4") == {"optimizer": "adamw", "model_size": "tiny", "seed": 1,
                                                   "budget_multiple": 4.0}


def test_read_summary_optional_or_required(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None
    with pytest.raises(OptBenchError, match="no summary.json"):
        read_summary(tmp_path, required=True)
    (tmp_path / "summary.json").write_text("{torn")
    assert read_summary(tmp_path) is None
    with pytest.raises(OptBenchError, match="not valid JSON"):
        read_summary(tmp_path, required=True)


def test_readers_skip_bad_records_by_name(tmp_path: Path) -> None:
    """A line that is no JSON object (``[]``, binary bytes) or a metrics row whose step is not a number is skipped
    with one warning naming the file; a torn last line (a killed writer) silently, as before."""
    import warnings

    from hf_optbench.rundir import read_metrics, read_state

    good = '{"kind": "train", "step": 1, "loss": 2.0}\n'
    (tmp_path / "metrics.jsonl").write_bytes((good + "[]\n" + '{"kind": "train", "step": "abc"}\n').encode()
                                             + b"\xff\xfe\x80 binary\n" + b'{"kind": "train", "st')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_metrics(tmp_path) == {"train": [{"kind": "train", "step": 1, "loss": 2.0}]}
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and "skipped 2 unreadable metrics line(s) (line 2, 4" in said[0], said
    assert "step is not a number" in said[1] and all(str(tmp_path / "metrics.jsonl") in m for m in said)
    (tmp_path / "state.jsonl").write_bytes(b'{"event": "end"}\n\xff\xfe garbage\n{"event": "start"}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_state(tmp_path / "state.jsonl") == [{"event": "end"}, {"event": "start"}]
    assert len(caught) == 1 and "line 2" in str(caught[0].message)


def test_read_summary_refuses_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_bytes(b"\xff\xfe{}")
    assert read_summary(tmp_path) is None
    with pytest.raises(OptBenchError, match="summary.json is not valid JSON"):
        read_summary(tmp_path, required=True)


def _run_dir(tmp_path: Path, *, summary: str | None = None, model: bool = False, steps: int = 0,
             max_steps: int = 4, checkpoint: bool = False) -> Path:
    """A run directory as a run leaves it: run_identity.json (its max_steps), ``steps`` train rows (an eval row
    last), summary.json's text, the final model, a checkpoint."""
    import json

    out = tmp_path / "run"
    out.mkdir()
    (out / "run_identity.json").write_text(json.dumps({"schema": 2, "plan_hash": "h",
                                                       "identity": {"max_steps": max_steps}}))
    rows = [{"kind": "train", "step": s, "loss": 1.0} for s in range(1, steps + 1)]
    rows += [{"kind": "eval", "step": steps, "eval_loss": 1.0}] if steps else []
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (out / "summary.json").write_text(summary)
    if model:
        (out / "model.safetensors").write_bytes(b"weights")
    if checkpoint:
        (out / "checkpoint-2").mkdir()
    return out


@pytest.mark.parametrize("kind, setup, why", [
    ("finished", {"summary": '{"status": "completed"}', "model": True, "steps": 4}, "status 'completed'"),
    ("finished", {"summary": '{"status": "diverged"}', "steps": 3}, "status 'diverged'"),
    # issue 41 item 1: the finished run whose summary.json was cut short, or deleted, was overwritten
    ("damaged", {"summary": '{"status": "compl', "model": True, "steps": 4}, "summary.json is not readable JSON"),
    ("damaged", {"model": True, "steps": 4}, "summary.json is missing, though the run saved its final model"),
    ("damaged", {"steps": 4}, "metrics.jsonl reaches step 4, the run's max_steps"),
    ("damaged", {"summary": '{"steps": 4}', "steps": 4}, "holds no run status"),
    ("damaged", {"summary": "[]"}, "does not hold a JSON object"),
    # stopped before its end (or before a checkpoint at max_steps was complete: a resume finishes it)
    ("unfinished", {"steps": 3}, "metrics.jsonl up to step 3, no summary.json"),
    ("unfinished", {"steps": 4, "checkpoint": True}, "metrics.jsonl up to step 4"),
    ("unfinished", {"summary": '{"status": "failed"}', "steps": 2}, "status 'failed'"),
    ("unfinished", {}, "run_identity.json, metrics.jsonl, no step recorded"),
])
def test_previous_run_is_decided_from_every_record(tmp_path: Path, kind: str, setup: dict, why: str) -> None:
    found = previous_run(_run_dir(tmp_path, **setup))
    assert found.state == kind and why in found.why, found


def test_a_directory_without_a_runs_records_holds_no_previous_run(tmp_path: Path) -> None:
    assert previous_run(tmp_path / "missing").state == "none"
    (tmp_path / "README.md").write_text("# mine\n")
    assert previous_run(tmp_path).state == "none"  # a user's folder: foreign_files answers for it


def test_the_last_train_step_is_read_from_the_end_of_metrics_only(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    head = b"x" * (2 * METRICS_TAIL_BYTES) + b"\n"  # never parsed: only the tail is read
    (out / "metrics.jsonl").write_bytes(head + b'{"kind": "train", "step": 7}\n{"kind": "eval", "step": 7}\n'
                                        b'{"kind": "train", "ste')  # a torn last line
    assert last_train_step(out) == 7
    assert last_train_step(tmp_path) is None


def test_portable_path_never_keeps_this_machines_absolute_path(tmp_path) -> None:
    """Issue 39: tuned files, summary.csv and the staged summary.json kept /tmp/... and /root/... paths."""
    from hf_optbench.rundir import portable_path

    assert portable_path(tmp_path / "sweep" / "tuning", tmp_path / "sweep") == "tuning"
    assert portable_path(tmp_path / "sweep" / "tuned.yaml", tmp_path / "sweep" / "runs" / "r1") == "tuned.yaml"
    assert portable_path("/elsewhere/x.yaml", tmp_path) == "x.yaml"


# ------------------------------------------------------------------------ files no run wrote (foreign_files)
def _folder(tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    for name in names:
        (out / name).write_text("mine\n")
    return out


def _checkpoint(out: Path, name: str, state: str | None) -> None:
    """``out/name`` with a trainer_state.json holding ``state`` (None: none, as a checkpoint torn mid-save)."""
    (out / name).mkdir()
    (out / name / "model.safetensors").write_text("weights")
    if state is not None:
        (out / name / "trainer_state.json").write_text(state)


@pytest.mark.parametrize("names", [("README.md",), ("config.json",), ("config.yaml",), ("tokenizer.json",),
                                   ("README.md", "config.json", "config.yaml", "notes.txt")])
def test_a_users_files_are_refused_by_name_overwrite_or_not(tmp_path: Path, names: tuple[str, ...]) -> None:
    out = _folder(tmp_path, *names)
    with pytest.raises(OptBenchError, match="no hf_optbench run wrote") as err:
        check_no_foreign_files(out)
    assert all(name in str(err.value) for name in names if name != "notes.txt")
    assert "notes.txt" not in str(err.value)  # a file the run never writes is no reason to refuse
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # nothing touched


def test_another_tools_trainer_checkpoint_is_foreign_a_stamped_or_torn_one_of_a_run_is_not(tmp_path: Path) -> None:
    out = _folder(tmp_path, "README.md")
    _checkpoint(out, "checkpoint-100", json.dumps({"global_step": 100, "stateful_callbacks": {}}))
    assert foreign_files(out) == ["checkpoint-100/", "README.md"]
    with pytest.raises(OptBenchError, match=r"checkpoint-100/, README.md") as err:
        check_no_foreign_files(out)
    assert "unfinished" not in str(err.value)
    run = tmp_path / "run"
    run.mkdir()
    (run / "README.md").write_text("the card a run wrote\n")
    _checkpoint(run, "checkpoint-4", json.dumps({"stateful_callbacks": {STAMP_KEY: {"args": {}}}}))
    _checkpoint(run, "checkpoint-6", None)  # torn mid-save: its run's own
    assert foreign_files(run) == []
    _checkpoint(run, "checkpoint-8", json.dumps({"stateful_callbacks": {}}))  # another tool's, beside a run's
    assert foreign_files(run) == ["checkpoint-8/"]


def test_what_may_be_written(tmp_path: Path) -> None:
    check_no_foreign_files(tmp_path / "new")  # not there yet
    check_no_foreign_files(_folder(tmp_path, "notes.txt"))  # nothing the run writes
    for marker in ("run_identity.json", "summary.json", "metrics.jsonl"):
        run = tmp_path / marker
        run.mkdir()
        (run / "README.md").write_text("the card a run wrote\n")
        (run / marker).write_text("{}")
        check_no_foreign_files(run)  # a run directory: config.parse.check_output_dir's rules apply
