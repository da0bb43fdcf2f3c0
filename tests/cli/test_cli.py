"""The `hf-optbench` command: lazy dispatch, fast validation, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench import cli
from hf_optbench.measure import provenance
from hf_optbench.run import train as run_mod

from fixtures.installed import hf_optbench_command

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")


def test_help_lists_every_subcommand(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert name in out


def test_every_subcommand_target_exists() -> None:
    import importlib

    for name, (module, func, _) in cli.SUBCOMMANDS.items():
        assert callable(getattr(importlib.import_module(module), func)), name


def test_unknown_subcommand_suggests(capsys) -> None:
    assert cli.main(["swep"]) == 2
    assert "Did you mean 'sweep'" in capsys.readouterr().err


def test_help_and_validate_do_not_import_torch() -> None:
    code = (
        "import sys; from hf_optbench.cli import main; "
        f"assert main(['--help']) == 0; assert main(['validate', {QUICK!r}]) == 0; "
        "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_validate_reports_bad_key_with_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_size: tiny\nlearnin_rate: 0.1\n")
    assert cli.main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "learnin_rate" in err and "learning_rate" in err


def test_validate_full_checks_values(capsys) -> None:
    assert cli.main(["validate", QUICK, "--full"]) == 0
    assert cli.main(["validate", QUICK, "--full", "--model_size", "huge"]) == 2
    assert "model_size" in capsys.readouterr().err


def test_console_script_runs_validate() -> None:
    exe = hf_optbench_command()
    proc = subprocess.run([str(exe), "validate", QUICK], capture_output=True, text=True)
    assert proc.returncode == 0 and "ok" in proc.stdout


def test_require_clean_git_refuses_a_dirty_tree(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(run_mod, "git_state", lambda path=None: {"commit": "abc", "dirty": True})
    monkeypatch.setattr(run_mod, "prepare", lambda cfg: (_ for _ in ()).throw(AssertionError("no work")))
    rc = run_mod.main([QUICK, "--output_dir", str(tmp_path / "o"), "--require_clean_git", "true"])
    assert rc == 2
    assert "uncommitted" in capsys.readouterr().err


def test_git_state_reads_this_checkout() -> None:
    state = provenance.git_state(ROOT)
    if state["commit"] is None:
        pytest.skip("not a git checkout")
    assert len(state["commit"]) == 40 and isinstance(state["dirty"], bool)
