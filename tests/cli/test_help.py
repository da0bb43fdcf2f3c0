"""Help that fits a screen (issue 17 item 3): `run --help` is short, grouped, names `run`, and imports no torch;
the full list is behind --help-all; every subcommand's --help exits 0."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from hf_optbench import cli
from hf_optbench.config.help import GROUPS, TRAINER_KEYS


def test_short_run_help_fits_a_screen_and_imports_no_torch() -> None:
    code = ("import io, sys, contextlib; from hf_optbench.cli import main; buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf): rc = main(['run', '--help'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
            "print(repr((rc, heavy, buf.getvalue())))")
    # COLUMNS=80: the narrowest terminal the help lays out for, where wrapping makes it longest
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    rc, heavy, text = eval(proc.stdout)  # noqa: S307 - our own repr()
    assert rc == 0 and heavy == []
    lines = text.splitlines()
    assert len(lines) < 80, len(lines)
    assert lines[0].startswith("usage: hf-optbench run ")
    for _, cls, _ in GROUPS:  # every hf_optbench key is named, grouped under its dataclass
        assert cls.__name__ in text
        for f in dataclasses.fields(cls):
            assert f"--{f.name}" in text, f.name
    for key in TRAINER_KEYS:
        assert f"--{key} " in text, key
    assert "--help-all" in text


def test_short_help_reads_trainer_defaults_and_help_from_source() -> None:
    from transformers import TrainingArguments

    from hf_optbench.config.help import training_fields_help

    got = training_fields_help(TRAINER_KEYS)
    fields = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    assert set(got) == set(TRAINER_KEYS)
    for name in ("seed", "bf16", "max_steps", "torch_compile"):
        assert got[name][0] == fields[name].default, name
        assert got[name][1] == fields[name].metadata.get("help", ""), name


def test_help_all_lists_every_training_argument(capsys) -> None:
    from transformers import TrainingArguments

    assert cli.main(["run", "--help-all"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: hf-optbench run ")
    for f in dataclasses.fields(TrainingArguments):
        assert f"--{f.name}" in text, f.name


@pytest.mark.parametrize("argv", [["data", "--help"], ["data", "-h"], ["validate", "--help"], ["memory", "--help"],
                                  ["optimizers", "--help"], ["report", "--help"], ["tokenizer", "--help"],
                                  ["find-lr", "--help"]])
def test_every_help_exits_0(argv: list[str], capsys) -> None:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own --help
        rc = exc.code
    assert rc == 0
    assert "usage:" in capsys.readouterr().out


def test_data_difficulty_help_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["data", "difficulty", "--help"])
    assert exc.value.code == 0
    assert "--target_ratio" in capsys.readouterr().out


def test_optimizers_says_which_take_the_adam_arguments(capsys) -> None:
    from hf_optbench.config.checks import adam_family

    assert cli.main(["optimizers", "--size", "tiny"]) == 0
    text = capsys.readouterr().out
    assert "adam_beta1 / adam_beta2 / adam_epsilon" in text and "optimizer_kwargs" in text
    assert cli.main(["optimizers", "--size", "tiny", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["optimizers"]
    assert {r["name"] for r in rows if r["takes_adam_arguments"]} == set(adam_family())
