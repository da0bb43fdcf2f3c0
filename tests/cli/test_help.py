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


def _run_help(columns: int) -> tuple[int, list[str], str]:
    code = ("import io, sys, contextlib; from hf_optbench.cli import main; buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf): rc = main(['run', '--help'])\n"
            "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
            "print(repr((rc, heavy, buf.getvalue())))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": str(columns)})
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout)  # noqa: S307 - our own repr()


def test_short_run_help_fits_a_screen_and_imports_no_torch() -> None:
    rc, heavy, text = _run_help(100)  # a 100 x 80 terminal
    assert rc == 0 and heavy == []
    lines = text.splitlines()
    assert len(lines) < 80, len(lines)
    assert lines[0].startswith("usage: hf-optbench run ")
    assert max(len(line) for line in _run_help(200)[2].splitlines()) <= 100  # a wide terminal: 100 columns at most
    for _, cls, _ in GROUPS:  # every hf_optbench key is named, grouped under its dataclass
        assert cls.__name__ in text
        for f in dataclasses.fields(cls):
            assert f"--{f.name}" in text, f.name
    for key in TRAINER_KEYS:
        assert f"--{key} " in text, key
    assert "--help-all" in text


def test_short_run_help_wraps_instead_of_cutting() -> None:
    """At 80 columns (the narrowest it lays out for) every line fits and each shown key's help and default are
    whole: before, "flax-commun" (a default cut to its column) and "lio..." (a help cut to the line)."""
    from hf_optbench.config.help import _SHORT_HELP

    _, _, text = _run_help(80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert not [line for line in text.splitlines()[1:] if line.rstrip().endswith("...")]
    joined = " ".join(text.split())  # wrapped lines joined back
    assert "[flax-community/gpt2-base-thai]" in joined
    for key, short in _SHORT_HELP.items():
        assert f"--{key} {short}" in joined, key


def test_every_size_is_listed_where_sizes_are_listed(capsys) -> None:
    """From the one size table (models._SIZE_ROWS): `nano` was missing from `run --help`."""
    from hf_optbench.config.help import short_help
    from hf_optbench.models import GPT2_SIZES

    texts = {"run": " ".join(short_help(width=100).split())}
    for argv in (["memory", "--help"], ["optimizers", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        texts[argv[0]] = " ".join(capsys.readouterr().out.split())
    for name, text in texts.items():
        missing = [size for size in GPT2_SIZES if size not in text]
        assert not missing, (name, missing)


def test_validate_help_explains_full(capsys) -> None:
    assert cli.main(["validate", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--full" in text and "TrainingArguments" in text and "--config" in text


def test_optimizers_help_has_no_rst_markup(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["optimizers", "--help"])
    assert "``" not in capsys.readouterr().out


def test_short_help_reads_trainer_defaults_and_help_from_source() -> None:
    from transformers import TrainingArguments

    from hf_optbench.config.help import training_fields_help

    got = training_fields_help(TRAINER_KEYS)
    fields = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    assert set(got) == set(TRAINER_KEYS)
    for name in ("seed", "bf16", "max_steps", "save_steps"):
        assert got[name][0] == fields[name].default, name
        assert got[name][1] == fields[name].metadata.get("help", ""), name


def test_help_all_lists_every_training_argument(capsys) -> None:
    from transformers import TrainingArguments

    assert cli.main(["run", "--help-all"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: hf-optbench run ")
    for f in dataclasses.fields(TrainingArguments):
        assert f"--{f.name}" in text, f.name
    assert max(map(len, text.splitlines())) <= 100
    assert "--max_steps  [default: 200]" in text and "--model_size  [default: tiny]" in text  # our defaults shown


def test_help_all_needs_neither_torch_nor_transformers() -> None:
    """--help-all reads transformers' fields from its source: no import of torch (seconds) before the first line."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io; from hf_optbench import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()): rc = cli.main(['run', '--help-all'])\n"
            "print(rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "[]"], out.stdout + out.stderr


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
