"""Every subcommand's --help reads as a help page (issue 39 item 7): no reStructuredText markup (`tune --help`
printed ":func:" and double backquotes), lines of at most 100 columns at a 100-column terminal (`validate` had a
149-column line, `sweep` a 199-column one), every option explained (`memory` had 8 bare options), and one
spelling per flag (`data difficulty` showed `--data_source, --data-source`)."""

from __future__ import annotations

import re

import pytest

from hf_optbench import cli

WIDTH = 100
PAGES = [["run"], ["validate"], ["sweep"], ["report"], ["tune"], ["memory"], ["optimizers"], ["find-lr"],
         ["tokenizer"], ["tokenizer", "train"], ["tokenizer", "stats"], ["tokenizer", "list"], ["data"],
         ["data", "difficulty"], ["push"], []]
MARKUP = re.compile(r"``|:(func|class|mod|meth|attr|data|ref):`|\w- \w")
OPTION = re.compile(r"^  (-\w, )?(--?[\w-]+)([ =][^ ].*?)?(  +(?P<help>\S.*))?$")


def _help(argv: list[str], capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    try:
        cli.main([*argv, "--help"])
    except SystemExit as exc:  # argparse's own --help
        assert exc.code == 0
    return capsys.readouterr().out


def unexplained(text: str) -> list[str]:
    """Options of an argparse help page with no help text: an option line with nothing after it and no deeper
    indented line below it."""
    lines = text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        found = OPTION.match(line)
        if not found or found.group("help"):
            continue
        below = lines[i + 1] if i + 1 < len(lines) else ""
        if not re.match(r"^ {6,}\S", below):
            bare.append(found.group(2))
    return bare


@pytest.mark.parametrize("argv", PAGES, ids=lambda a: " ".join(a) or "hf-optbench")
def test_help_is_plain_text_within_100_columns_with_every_option_explained(argv, capsys, monkeypatch) -> None:
    text = _help(argv, capsys, monkeypatch)
    assert text.strip(), argv
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, wide
    assert not MARKUP.findall(text), [m for m in text.splitlines() if MARKUP.search(m)]
    assert unexplained(text) == [], unexplained(text)
    twice = re.findall(r"(--[\w-]+), (--[\w-]+)", text)
    assert not [pair for pair in twice if pair[0].replace("-", "_") == pair[1].replace("-", "_")], twice


def test_the_checks_can_fail() -> None:
    assert unexplained("options:\n  --a A\n  --b B      what b is\n  --c\n          what c is\n") == ["--a"]
    assert MARKUP.search("see :func:`x`") and MARKUP.search("held- out") and not MARKUP.search("held-out, x - y")


def test_the_readme_spells_flags_as_the_help_shows_them(capsys, monkeypatch) -> None:
    """Every --flag of the README's `hf-optbench <command>` lines is one its command's --help shows."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    wrong = []
    for line in readme.splitlines():
        found = re.search(r"hf-optbench ([a-z-]+)( [a-z]+)?\s(.*)", line)
        if not found or found.group(1) not in cli.SUBCOMMANDS or found.group(1) == "run":
            continue
        argv = [found.group(1)] + ([found.group(2).strip()] if found.group(1) in ("data", "tokenizer") and
                                   found.group(2) else [])
        shown = _help(argv, capsys, monkeypatch)
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", found.group(3).split("#")[0].split("`")[0]):
            if flag not in shown:
                wrong.append((" ".join(argv), flag))
    assert wrong == [], wrong
