"""``hf-optbench validate RECIPE``: check a recipe's keys in ~0.1 s, without importing torch."""

from __future__ import annotations

import sys

from hf_optbench.errors import OptBenchError

USAGE = "usage: hf-optbench validate RECIPE.yaml [--key value ...] [--full]"


def main(argv: list[str] | None = None) -> int:
    """Fast recipe check (no torch import): unknown keys, file presence, YAML shape. A full type check of every
    value needs transformers' parser: pass --full."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not argv:
        raise OptBenchError(f"validate needs a recipe. {USAGE}")
    full = "--full" in argv
    argv = [a for a in argv if a != "--full"]
    from hf_optbench.config import parse as config

    recipe_path, cli_tokens = config._split_argv(argv)
    recipe = config.load_recipe(recipe_path) if recipe_path else {}
    config.check_keys(recipe, cli_tokens, recipe_path)
    if full:
        config.parse_args(argv)
    print(f"ok: {recipe_path or '(no recipe)'}" + (" (full check)" if full else " (keys)"))
    return 0
