"""A run's command line before it is parsed: the recipe wherever ``--config`` names it, and ``--help`` wherever it
stands.

Why by hand: HfArgumentParser reads a recipe only as the first positional argument (``parse.parse_args``), and the
light pre-flight check (``run.preflight``) reads it from the same place before transformers is imported. TRL and
accelerate spell the recipe ``--config FILE``; a user who writes ``--key value --config recipe.yaml`` got "unknown
key 'config'. Did you mean 'fsdp_config'?". Moving it to the front here lets every reader keep its one rule.
"""

from __future__ import annotations

from hf_optbench.errors import OptBenchError

CONFIG_FLAG = "--config"
HELP_FLAGS = ("-h", "--help", "--help-all")


def recipe_first(argv: list[str]) -> list[str]:
    """``argv`` with ``--config RECIPE`` (or ``--config=RECIPE``), wherever it stands, moved to the front as the
    positional recipe. One recipe per run: a second one (another ``--config``, or a positional recipe beside it) is
    refused rather than silently dropped."""
    rest: list[str] = []
    recipes: list[str] = []
    tokens = iter(argv)
    for tok in tokens:
        if tok == CONFIG_FLAG:
            value = next(tokens, None)
            if value is None or value.startswith("-"):
                raise OptBenchError(f"{CONFIG_FLAG} needs a recipe file, e.g. {CONFIG_FLAG} "
                                    "recipes/quickstart_cpu.yaml.")
            recipes.append(value)
        elif tok.startswith(CONFIG_FLAG + "="):
            recipes.append(tok.split("=", 1)[1])
        else:
            rest.append(tok)
    if not recipes:
        return rest
    if rest and not rest[0].startswith("-"):
        recipes.insert(0, rest.pop(0))
    if len(recipes) > 1:
        raise OptBenchError(f"one recipe per run, got {len(recipes)}: {', '.join(recipes)}. Keep one; set other "
                            "values with --key value.")
    return [recipes[0], *rest]


def help_requested(argv: list[str]) -> str | None:
    """"full" for ``--help-all``, "short" for ``-h``/``--help``, wherever on the line (after a recipe too), else
    None."""
    if "--help-all" in argv:
        return "full"
    return "short" if any(a in HELP_FLAGS for a in argv) else None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def attach_negative_values(tokens: list[str]) -> list[str]:
    """``--key -inf`` (or ``-nan``, ``-1e-3``) as ``--key=-inf``. Why: argparse takes a token that starts with "-"
    for an option unless it looks like ``-1`` or ``-.5``, so ``--weight_decay -inf`` would fail with "expected one
    argument" instead of reaching the check that says the value must be finite."""
    out: list[str] = []
    for tok in tokens:
        if out and tok.startswith("-") and _is_number(tok) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out
