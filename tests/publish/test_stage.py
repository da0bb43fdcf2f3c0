"""The staging folder of publish/stage.py: cleared for a new staging only when it holds exactly what an earlier
staging recorded in its manifest, refused by name otherwise (issue 43: a staged folder into which the user had put
NOTES.txt was replaced whole); and issue 43's cases through the installed `hf-optbench push --dry_run`."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.publish import stage
from hf_optbench.publish.content import MAX_ARCHIVE_MEMBERS

from fixtures.hub_run import fake_run
from fixtures.installed import hf_optbench_command


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_folder_an_earlier_staging_left_is_staged_again(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    dest = stage.stage_upload_folder(run, tmp_path / "st")
    recorded = json.loads((dest / stage.STAGE_MARKER).read_text())["files"]
    assert sorted(recorded) == sorted(p.name for p in dest.iterdir() if p.name != stage.STAGE_MARKER)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 2, "loss": 5.0}\n')
    stage.stage_upload_folder(run, dest)  # cleared and staged again: the new metrics are there
    assert '"step": 2' in (dest / "metrics.jsonl").read_text()


@pytest.mark.parametrize("spoil", ["user-file", "edited-card", "subfolder"])
def test_a_staged_folder_holding_what_no_staging_wrote_is_refused_and_kept(tmp_path: Path, spoil: str) -> None:
    run = fake_run(tmp_path)
    dest = stage.stage_upload_folder(run, tmp_path / "st")
    named = {"user-file": "NOTES.txt", "edited-card": "README.md", "subfolder": "drafts"}[spoil]
    if spoil == "user-file":
        (dest / "NOTES.txt").write_text("my notes\n")
    elif spoil == "edited-card":
        (dest / "README.md").write_text((dest / "README.md").read_text() + "\nmy edit, a longer card\n")
    else:
        (dest / "drafts").mkdir()
        (dest / "drafts" / "x.md").write_text("draft\n")
    before = _tree(dest)
    with pytest.raises(OptBenchError, match=f"no earlier staging by hf-optbench wrote.*: {named}\\."):
        stage.stage_upload_folder(run, dest)
    assert _tree(dest) == before


def test_a_folder_never_staged_into_is_refused_unless_empty(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    old = tmp_path / "old"  # an older hf-optbench's marker listed no files: nothing in it can be told apart
    old.mkdir()
    (old / stage.STAGE_MARKER).write_text("made by hf_optbench.publish.hub\n")
    (old / "README.md").write_text("card\n")
    with pytest.raises(OptBenchError, match="holds files no earlier staging by hf-optbench wrote: README.md"):
        stage.stage_upload_folder(run, old)
    assert (old / "README.md").read_text() == "card\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (stage.stage_upload_folder(run, empty) / "model.safetensors").is_file()


def test_a_staging_that_failed_its_checks_is_cleared_by_the_next(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    config = run / "checkpoint-10" / "tokenizer_config.json"
    config.write_text(json.dumps({"notes": "ghp_" + "Ab3d" * 9}))
    with pytest.raises(OptBenchError, match="tokenizer_config.json: contains a GitHub token"):
        stage.stage_upload_folder(run, tmp_path / "st")
    config.write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    assert stage.check_upload_folder(stage.stage_upload_folder(run, tmp_path / "st")) == []


# ------------------------------------------------------------------------------- through the installed command
def _tokens_in_notes(run: Path, tmp_path: Path) -> None:
    (run / "checkpoint-10" / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>",
        "notes": f"gh {'ghp_' + 'Zq9x' * 9} openai {'sk-' + 'Pq7r' * 12} wandb {'wandb_v1_' + 'Wd4b' * 20}"}))


def _zip_of_300(run: Path, tmp_path: Path) -> None:
    import pickle

    with zipfile.ZipFile(run / "checkpoint-10" / "tokenizer.model", "w") as z:
        for i in range(299):
            z.writestr(f"piece{i}", b"text %d" % i)
        z.writestr("piece299", pickle.dumps({"lr": 3e-4}))


def _zip_past_the_bound(run: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(run / "checkpoint-10" / "tokenizer.model", "w") as z:
        for i in range(MAX_ARCHIVE_MEMBERS + 1):
            z.writestr(f"piece{i}", b"x")


def _notes_in_stage_dir(run: Path, tmp_path: Path) -> None:
    dest = stage.stage_upload_folder(run, tmp_path / "st")
    (dest / "NOTES.txt").write_text("my notes\n")


def _gzipped_token(run: Path, tmp_path: Path) -> None:
    import gzip

    (run / "checkpoint-10" / "tokenizer.model").write_bytes(gzip.compress(b"HF_TOKEN=hf_" + b"Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"))


# case -> (how the run (or its staging folder) is spoiled, what the one line must say, what it must not)
CASES: dict[str, tuple[Callable[[Path, Path], None], list[str], list[str]]] = {
    "tokens-in-tokenizer-config": (_tokens_in_notes, [
        "tokenizer_config.json: contains a GitHub token", "tokenizer_config.json: contains an OpenAI API key",
        "tokenizer_config.json: contains a W&B API key"], ["Zq9x", "Pq7r", "Wd4b"]),
    "pickle-as-zip-member-300": (_zip_of_300, ["tokenizer.model: holds a pickle in zip member piece299"], []),
    "zip-past-the-member-bound": (_zip_past_the_bound, [f"tokenizer.model: a zip archive of {MAX_ARCHIVE_MEMBERS + 1:,} members"], []),
    "gzipped-token": (_gzipped_token, ["tokenizer.model: contains a Hugging Face token (in gzip-compressed content)"],
                      ["Ab3dEf"]),  # was: staged
    "user-file-in-stage-dir": (_notes_in_stage_dir, ["holds files no earlier staging by hf-optbench wrote",
                                                     "NOTES.txt"], []),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_push_dry_run_through_the_installed_command_refuses_in_one_line(tmp_path: Path, case: str) -> None:
    exe = hf_optbench_command()
    run = fake_run(tmp_path)
    spoil, needles, absent = CASES[case]
    spoil(run, tmp_path)
    before = _tree(tmp_path)
    proc = subprocess.run([str(exe), "push", str(run), "--repo_id", "me/x", "--dry_run", "--stage_dir",
                           str(tmp_path / "st")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(f"{case}: rc {proc.returncode}: {proc.stderr.strip()}")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(n in lines[0] for n in needles) and not any(a in lines[0] for a in absent), lines[0]
    if case == "user-file-in-stage-dir":
        assert _tree(tmp_path) == before  # the user's NOTES.txt and the earlier staging untouched


def test_the_staged_config_holds_no_absolute_path_of_this_machine() -> None:
    """Not only output_dir: data_files (each item), the tuned file and a local tokenizer directory become their last
    part, in the values and the rerun comment; relative paths and Hub ids stay as written."""
    import yaml

    from hf_optbench.publish.stage import _portable_config

    text = ("# hf-optbench run /home/me/runs/x/config.yaml --output_dir NEW_DIR\n"
            + yaml.safe_dump({"output_dir": "/home/me/runs/x", "data_files": ["/data/me/th/a.txt", "rel/b.txt"],
                              "tuned_hparams_file": "/home/me/runs/sweep/tuned_hparams__tpp0.5.yaml",
                              "tokenizer_name": "/home/me/tok", "dataset_name": "allenai/c4"}))
    out = _portable_config(text)
    assert "/home/me" not in out and "/data/me" not in out
    values = yaml.safe_load(out)
    assert values["output_dir"] == "x" and values["data_files"] == ["a.txt", "rel/b.txt"]
    assert values["tuned_hparams_file"] == "tuned_hparams__tpp0.5.yaml" and values["tokenizer_name"] == "tok"
    assert values["dataset_name"] == "allenai/c4" and out.startswith("# hf-optbench run x/config.yaml")
