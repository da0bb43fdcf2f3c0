"""A sweep's data budget per model size, stated as tokens per parameter, and the baseline's budget ladder.

Why tokens per parameter: a sweep that trains every size for the same number of steps lets the data per parameter
fall as the model grows (25x from ``tiny`` to ``midi`` at a fixed step count), so "does the advantage survive as
models grow" becomes "as the data per parameter shrinks". Scaling studies hold it fixed: Chinchilla (Hoffmann et al.
2022) and Marin (marin-community/marin, experiments/optimizer_sweep: 1x = 20 tokens per non-embedding parameter)
state budgets as multiples of it. The parameter count is the non-embedding one (Kaplan et al. 2020), as those
studies use: the embedding's size follows the tokenizer, not the model.

Sweep file::

    budget:
      tokens_per_param: 0.5        # max_steps per size = round(0.5 x non-embedding parameters / tokens per step)
    ladder:
      multiples: [0.5, 1, 2, 4]    # the baseline also runs at these multiples of the budget, each a full schedule
      optimizer: adamw             # the baseline (default adamw; must be in the matrix)

Without ``budget``, the steps of the recipe (or ``overrides.max_steps``) are the budget, and a ladder multiplies
them. Tokens per step = per_device_train_batch_size x gradient_accumulation_steps x processes x block_size, read
from each run's parsed arguments (processes: the launcher's accelerate config ``num_processes``, else 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import BASELINE

if TYPE_CHECKING:
    from hf_optbench.config.parse import RunConfig

BUDGET_KEYS = {"tokens_per_param"}
LADDER_KEYS = {"multiples", "optimizer"}
# Marin's ladder (experiments/optimizer_sweep) spans 1-8x Chinchilla; four points (0.5-4x) are the fewest that
# leave the three-parameter fit of hf_optbench.measure.speedup a degree of freedom to be judged by.
MIN_LADDER_POINTS = 3


@dataclass(frozen=True)
class Budget:
    """``tokens_per_param``: training tokens per non-embedding parameter, the same at every size."""

    tokens_per_param: float


@dataclass(frozen=True)
class Ladder:
    """The baseline's extra budgets: ``multiples`` of the sweep's budget (1 among them: the compared run)."""

    multiples: tuple[float, ...]
    optimizer: str = BASELINE

    @property
    def extra(self) -> tuple[float, ...]:
        """The multiples other than 1 (the x1 run is the baseline's ordinary comparison run)."""
        return tuple(m for m in self.multiples if m != 1.0)


def _positive(value: Any, where: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise OptBenchError(f"{where} must be a positive number, got {value!r}. E.g. {example}.")
    return float(value)


def _keys(value: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OptBenchError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise OptBenchError(f"unknown key '{unknown[0]}' in {where}. Allowed: {', '.join(sorted(allowed))}.")
    return value


def parse_budget(raw: dict[str, Any], tables: Iterable[tuple[str, dict[str, Any]]]) -> Budget | None:
    """The ``budget:`` section, checked; nothing else in the file may set max_steps (it would silently win)."""
    if raw.get("budget") is None:
        return None
    section = _keys(raw["budget"], BUDGET_KEYS, "budget")
    if "tokens_per_param" not in section:
        raise OptBenchError("budget needs tokens_per_param: training tokens per non-embedding parameter, e.g. 20 "
                            "(Chinchilla), or 0.5 for a CPU sweep.")
    for where, table in tables:
        if "max_steps" in table:
            raise OptBenchError(f"'max_steps' in {where} conflicts with budget.tokens_per_param, which sets every "
                                "run's max_steps per size: remove one of them.")
    return Budget(_positive(section["tokens_per_param"], "budget.tokens_per_param", "20 or 0.5"))


def parse_ladder(raw: dict[str, Any], optimizers: list[str]) -> Ladder | None:
    """The ``ladder:`` section, checked: >= 3 distinct multiples with 1 among them, and the baseline in the matrix."""
    if raw.get("ladder") is None:
        return None
    section = _keys(raw["ladder"], LADDER_KEYS, "ladder")
    values = section.get("multiples")
    if not isinstance(values, list) or not values:
        raise OptBenchError("ladder needs multiples: the baseline's budgets as multiples of the sweep's budget, "
                            "e.g. [0.5, 1, 2, 4].")
    mults = sorted({_positive(v, "ladder.multiples", "[0.5, 1, 2, 4]") for v in values})
    if len(mults) < MIN_LADDER_POINTS or 1.0 not in mults:
        raise OptBenchError(f"ladder.multiples {mults} must hold 1 (the compared budget) and at least "
                            f"{MIN_LADDER_POINTS} distinct values, e.g. [0.5, 1, 2, 4].")
    baseline = str(section.get("optimizer", BASELINE))
    if baseline not in optimizers:
        raise OptBenchError(f"ladder.optimizer '{baseline}' is not in matrix.optimizer {optimizers}: the ladder is "
                            "the baseline's, so add it to the matrix (or name the baseline there).")
    return Ladder(tuple(mults), baseline)


def world_size(launcher: dict[str, Any]) -> int:
    """Processes per run: the accelerate config's ``num_processes`` for an accelerate launcher (1 where it cannot be
    read), else 1. The one reader of that value: the sweep's slots use it too (study.sweep_state.plan_slots)."""
    if launcher.get("type") != "accelerate" or not launcher.get("accelerate_config"):
        return 1
    from hf_optbench.yaml_file import read_yaml_or_empty

    try:
        return max(1, int(read_yaml_or_empty(launcher["accelerate_config"]).get("num_processes") or 1))
    except (TypeError, ValueError):
        return 1


def tokens_per_step(cfg: RunConfig, processes: int) -> int:
    """Tokens one optimizer step consumes, from a parsed RunConfig."""
    from hf_optbench.models import tokens_per_step as tokens

    return tokens(cfg.training, cfg.data.block_size, processes)


def steps_table(budget: Budget | None, sizes: list[str], optimizers: list[str], processes: int,
                probe: Callable[[str, str], Any]) -> dict[tuple[str, str], int]:
    """{(size, optimizer): max_steps at budget x1}: from tokens per parameter when ``budget`` is set, else the
    run's own max_steps. ``probe(optimizer, size)`` parses that point's arguments (a RunConfig)."""
    from hf_optbench.models import non_embedding_params

    table: dict[tuple[str, str], int] = {}
    for size in sizes:
        for opt in optimizers:
            cfg = probe(opt, size)
            if budget is None:
                table[(size, opt)] = int(cfg.training.max_steps)
                continue
            per_step = tokens_per_step(cfg, processes)
            table[(size, opt)] = max(1, round(budget.tokens_per_param * non_embedding_params(size) / per_step))
    return table


def ladder_steps(steps: int, multiple: float | None) -> int:
    """max_steps of a ladder run: its multiple of the budget's steps (at least 1)."""
    return steps if multiple is None else max(1, round(multiple * steps))


def check_ladder(ladder: Ladder, table: dict[tuple[str, str], int]) -> None:
    """Every size's ladder budgets must differ in steps, or the curve has repeated points."""
    for (size, opt), steps in table.items():
        if opt != ladder.optimizer:
            continue
        counts = [ladder_steps(steps, m) for m in ladder.multiples]
        if len(set(counts)) < len(counts):
            raise OptBenchError(f"the ladder's budgets collapse to the same step count at {size} ({counts} steps for "
                                f"multiples {list(ladder.multiples)}): raise the budget or space the multiples wider.")
