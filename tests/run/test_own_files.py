"""run.own_files: a run refuses an output_dir that is a user's folder holding files it would replace (issue 32 item
2: README.md, config.json and config.yaml were overwritten without a word); a run directory, an empty or new one,
and --overwrite_output_dir true pass. The refusal through the installed command is a row of
tests/cli/test_bad_inputs.py ("output-dir-holds-user-files")."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.run.own_files import check_own_files, is_run_directory


def _folder(tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    for name in names:
        (out / name).write_text("mine\n")
    return out


@pytest.mark.parametrize("names", [("README.md",), ("config.json",), ("config.yaml",), ("tokenizer.json",),
                                   ("README.md", "config.json", "config.yaml", "notes.txt")])
def test_a_users_files_are_refused_by_name(tmp_path: Path, names: tuple[str, ...]) -> None:
    out = _folder(tmp_path, *names)
    with pytest.raises(OptBenchError, match="--overwrite_output_dir true") as err:
        check_own_files(out, overwrite=False)
    assert all(name in str(err.value) for name in names if name != "notes.txt")
    assert "notes.txt" not in str(err.value)  # a file the run never writes is no reason to refuse
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # nothing touched


def test_what_may_be_written(tmp_path: Path) -> None:
    check_own_files(tmp_path / "new", overwrite=False)  # not there yet
    check_own_files(_folder(tmp_path, "notes.txt"), overwrite=False)  # nothing the run writes
    check_own_files(tmp_path / "out", overwrite=True)  # the user said so
    for marker in ("run_identity.json", "summary.json", "metrics.jsonl", "checkpoint-4"):
        run = tmp_path / marker
        run.mkdir()
        (run / "README.md").write_text("the card a run wrote\n")
        (run / marker).mkdir() if marker.startswith("checkpoint") else (run / marker).write_text("{}")
        assert is_run_directory(run)
        check_own_files(run, overwrite=False)  # a run directory: config.parse.check_output_dir's rules apply
