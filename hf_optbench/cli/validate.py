"""``hf-optbench validate RECIPE``: check a recipe's keys without importing torch, in a fraction of a second
(benchmarks/bench_startup.py measures it; benchmarks/RESULTS.md has the figure)."""

from __future__ import annotations

import sys

from hf_optbench.cli import wrap_help
from hf_optbench.config.argv import help_requested, recipe_first
from hf_optbench.errors import OptBenchError

USAGE = "usage: hf-optbench validate RECIPE.yaml [--key value ...] [--full]"
HELP = wrap_help(f"""{USAGE}

Checks a recipe and the --key value overrides a run would get, without training. The recipe may also
come as --config RECIPE.yaml, anywhere on the line.

By default, without importing torch (little more than Python's start-up): the recipe file reads as one
flat YAML mapping, and every key, in it and on the command line, is one `hf-optbench run --help` lists
(a misspelt key gets a suggestion; a key hf_optbench replaces is refused with what to use instead;
TrainingArguments' optim, lr_scheduler_type, num_train_epochs... are translated as a run translates them).

  --full   also make every check a run makes before its data, through the same code:
           the output_dir, the hardware, the tokenizer (offline: in the cache), the Hub
           (push_to_hub), every value as HfArgumentParser and TrainingArguments parse it,
           the optimizer's arguments as the plan resolves them, a resume's checkpoint, the
           splits and memory the settings give. What needs no model answers before torch
           is imported; the rest takes as long as importing transformers and torch.""")


def main(argv: list[str] | None = None) -> int:
    """Fast recipe check (no torch import): the YAML's shape and unknown keys. A full check of every value needs
    transformers' parser: --full (see HELP)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):
        print(HELP)
        return 0
    if not argv:
        raise OptBenchError(f"validate needs a recipe. {USAGE}")
    full = "--full" in argv
    argv = recipe_first([a for a in argv if a != "--full"])
    from hf_optbench.config import parse as config

    recipe_path, cli_tokens = config._split_argv(argv)
    recipe = config.load_recipe(recipe_path) if recipe_path else {}
    config.check_keys(recipe, cli_tokens, recipe_path)
    if full:  # the run's own checks, in the run's order, up to its data: what needs no model answers before torch
        from hf_optbench.run.preflight import preflight
        from hf_optbench.run.train import validate_run

        validate_run(config.parse_args(argv, recipe=preflight(argv)))
    print(f"ok: {recipe_path or '(no recipe)'}" + (" (full check)" if full else " (keys)"))
    return 0
