"""The ``hf-optbench`` command. Subcommands are imported only when run, so ``--help`` answers in well under a
second (torch + transformers take 5-10 s to import on this class of machine)."""

from __future__ import annotations

import importlib
import sys

from .errors import OptBenchError

# subcommand -> (module, function, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("hf_optbench.run", "main", "one benchmark run from a recipe: hf-optbench run RECIPE.yaml [--key value]"),
    "validate": ("hf_optbench.cli", "validate_main", "check a recipe's keys and values without training"),
    "sweep": ("hf_optbench.sweep", "cli_main", "optimizers x sizes x seeds, one process per run, resumable"),
    "report": ("hf_optbench.report", "cli_main", "tables, plots and the scaling verdict of a sweep directory"),
    "tune": ("hf_optbench.tuning", "cli_main", "pick the best learning rate per optimizer and size from a sweep"),
    "memory": ("hf_optbench.memory", "cli_main", "analytic memory plan: size x optimizer x precision x ZeRO"),
    "optimizers": ("hf_optbench.optimizers", "cli_main", "list optimizers with their cited default hyperparameters"),
    "find-lr": ("hf_optbench.lr_finder", "find_lr_main", "LR range test on a recipe's model and data"),
    "tokenizer": ("hf_optbench.tokenization", "cli_main", "train a byte-level BPE or char tokenizer offline"),
    "data": ("hf_optbench.difficulty", "cli_main", "data tools: difficulty (gzip ratio, alpha calibration)"),
    "push": ("hf_optbench.hub", "cli_main", "stage (and upload) a run directory to the Hugging Face Hub"),
}


def _usage() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = ["usage: hf-optbench <command> [args ...]", "",
             "Which optimizer should I use to pretrain a GPT-2-style LM, and does its advantage survive scale?", "",
             "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "`hf-optbench <command> --help` for a command's options."]
    return "\n".join(lines)


def validate_main(argv: list[str] | None = None) -> int:
    """Fast recipe check (no torch import): unknown keys, file presence, YAML shape. A full type check of every
    value needs transformers' parser: pass --full."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: hf-optbench validate RECIPE.yaml [--key value ...] [--full]")
        return 0 if argv else 2
    full = "--full" in argv
    argv = [a for a in argv if a != "--full"]
    from . import config

    recipe_path, cli_tokens = config._split_argv(argv)
    recipe = config.load_recipe(recipe_path) if recipe_path else {}
    config.check_keys(recipe, cli_tokens, recipe_path)
    if full:
        config.parse_args(argv)
    print(f"ok: {recipe_path or '(no recipe)'}" + (" (full check)" if full else " (keys)"))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"hf_optbench {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, list(SUBCOMMANDS), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"error: unknown command '{name}'.{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        code = func(rest)
    except OptBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `hf-optbench optimizers | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
