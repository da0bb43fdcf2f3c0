"""The ``hf-optbench`` command. Subcommands are imported only when run, so ``--help`` answers without importing torch
and transformers, whose import takes seconds and more on a loaded machine (benchmarks/bench_startup.py measures
both; benchmarks/RESULTS.md has the figures)."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import Any

from hf_optbench.config.argv import help_requested
from hf_optbench.errors import OptBenchError, suggest

# subcommand -> (module, function, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("hf_optbench.run.train", "main", "one benchmark run from a recipe: hf-optbench run RECIPE.yaml [--key value]"),
    "validate": ("hf_optbench.cli.validate", "main", "check a recipe's keys and values without training"),
    "sweep": ("hf_optbench.cli.sweep", "main", "optimizers x sizes x seeds, one process per run, resumable"),
    "report": ("hf_optbench.cli.report", "main", "tables, plots and the scaling verdict of a sweep directory"),
    "tune": ("hf_optbench.cli.tune", "main", "pick the best learning rate per optimizer and size from a sweep"),
    "memory": ("hf_optbench.cli.memory", "main", "analytic memory plan: size x optimizer x precision x ZeRO"),
    "optimizers": ("hf_optbench.cli.optimizers", "main", "list optimizers with their cited default hyperparameters"),
    "find-lr": ("hf_optbench.cli.find_lr", "main", "LR range test on a recipe's model and data"),
    "tokenizer": ("hf_optbench.cli.tokenizer", "main", "train a byte-level BPE or char tokenizer offline"),
    "data": ("hf_optbench.cli.data", "main", "data tools: difficulty (gzip ratio, alpha calibration)"),
    "push": ("hf_optbench.cli.push", "main", "stage (and upload) a run directory to the Hugging Face Hub"),
}


# A write that failed for want of room or of a writable filesystem: what is wrong with the disk, by errno.
DISK_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
               errno.EROFS: "the filesystem is read-only"}


def disk_error(exc: OSError) -> str:
    """One line naming the directory that could not be written (where the output or the data cache lives) and the
    fix, for an OSError in DISK_ERRORS."""
    where = f"'{os.path.dirname(os.path.abspath(exc.filename))}'" if exc.filename else "the output directory"
    return (f"cannot write under {where}: {DISK_ERRORS[exc.errno]} ({exc.strerror}). Free space there, or choose an "
            "output directory (output_dir, --output-dir, --output) and a data cache (HF_OPTBENCH_CACHE) on a disk "
            "with room.")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (OptBenchError, exit 2) instead of the usage block plus a message, so
    every subcommand fails the same way: ``error: <what> ... `<prog> --help` lists the options``; and whose long
    options are spelled with underscores, the hyphen spelling and the ``aliases`` (old name -> new name) accepted
    unseen (:mod:`hf_optbench.cli.flags`)."""

    def __init__(self, *args: Any, aliases: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = dict(aliases or {})

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        from hf_optbench.cli.flags import canonical_flags

        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(canonical_flags(argv, self._option_string_actions, self.aliases), namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise OptBenchError(f"{message}. `{self.prog} --help` lists the options.")




HELP_WIDTH = 100  # every help page's lines fit a 100-column terminal (tests/cli/test_help_texts.py)


def wrap_help(text: str, width: int = HELP_WIDTH) -> str:
    """A help page written by hand, its prose paragraphs wrapped to ``width``: paragraphs are separated by blank
    lines; those whose first line starts with a space or "usage:" (usage lines, YAML, option tables) are kept."""
    import textwrap

    blocks = text.split("\n\n")
    return "\n\n".join(block if block.startswith((" ", "usage:")) else textwrap.fill(" ".join(block.split()), width)
                       for block in blocks)


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: hf-optbench <command> [args ...]", "",
             "Which optimizer should I use to pretrain a GPT-2-style LM, and does its advantage survive scale?", "",
             "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "`hf-optbench <command> --help` for a command's options. Options are spelled as recipe keys are,",
              "with underscores (--output_dir); the hyphen spelling (--output-dir) works too."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from hf_optbench import __version__

        print(f"hf_optbench {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"error: unknown command '{name}'.{suggest(name, SUBCOMMANDS, cutoff=0.6)} Commands: "
              f"{', '.join(SUBCOMMANDS)} (`hf-optbench --help` says what each does).", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    if name == "run" and help_requested(rest):
        # answered here: the short help imports neither torch nor the run module (config.help)
        from hf_optbench.config.help import print_run_help

        return print_run_help(full=help_requested(rest) == "full")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        code = func(rest)
    except OptBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C while a command works (a cache build, a report): one line, not a traceback
        print(f"interrupted: `hf-optbench {name}` stopped before it finished; run the same command again.",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hf-optbench optimizers | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        print(f"error: {disk_error(exc)}", file=sys.stderr)  # a full disk is the user's to fix, not a traceback
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
