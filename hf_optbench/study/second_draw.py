"""The second tuning draw, the sweep-file side: which cells tune again at another tuning seed.

Why: a sweep tunes at one seed (``tune.seed``) and compares at others, so the comparison's intervals cover the
comparison seeds' noise and nothing of the tuning's. Rerunning one cell of the main job identical but for the tuning
seed (6 instead of 0) moved AdamW's non-matrix pick from x2 to x1 and Muon's speedup from 2.36 to 2.19, 15 % of the
reported interval's width. The second draw measures that shift where it is cheap enough, and the report states it
beside every interval and widens the intervals it is large against (:mod:`hf_optbench.measure.tuning_noise`)::

    tune:
      ...
      second_draw:
        seed: 6                                         # one more tuning seed (not a tuning, confirm or compared seed)
        cells:                                          # the cells tuned again: at least one per size, ideally
          - {model_size: nano, tokens_per_param: 0.15}  # tokens_per_param: one of budget.tokens_per_param
          - {model_size: tiny}                          # (left out in a sweep with one ratio)

The draw runs after the comparison (:mod:`hf_optbench.study.second_draw_phase`): the whole tuning protocol of each
cell again at ``seed`` (every optimizer, every axis, every rung of the ladder, extensions included), its own tuned
file, then only the comparison runs whose tuned values it changed. A run at the same values and seed is the main
run again (a CPU run with one thread repeats itself exactly), so where no pick changed, the shift is exactly 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.study.budget import Budget, ratio_keys
from hf_optbench.study.sweep_values import seed_list

SECOND_DRAW_KEY = "second_draw"
DRAW_KEYS = {"seed", "cells"}
CELL_KEYS = {"model_size", "tokens_per_param"}
EXAMPLE = "second_draw: {seed: 6, cells: [{model_size: tiny, tokens_per_param: 0.5}]}"


@dataclass(frozen=True)
class SecondDraw:
    """The checked ``tune.second_draw``: the second tuning seed and the cells (size, ratio key: None in a sweep
    with one ratio) it tunes."""

    seed: int
    cells: tuple[tuple[str, float | None], ...]

    def includes(self, size: str, tpp: float | None) -> bool:
        return (size, tpp) in self.cells


def _cell(value: Any, sizes: Sequence[str], budget: Budget | None) -> tuple[str, float | None]:
    if not isinstance(value, Mapping) or not set(value) <= CELL_KEYS or "model_size" not in value:
        raise OptBenchError(f"tune.second_draw.cells entries must be mappings {{model_size, tokens_per_param}}, got "
                            f"{value!r}. E.g. {EXAMPLE}.")
    size = str(value["model_size"])
    if size not in sizes:
        raise OptBenchError(f"tune.second_draw cell model_size '{size}' is not in the matrix ({', '.join(sizes)}): "
                            "the draw tunes a cell the comparison ran. Use one of those sizes.")
    keys = ratio_keys(budget)
    tpp = value.get("tokens_per_param")
    if keys == (None,):
        one = isinstance(tpp, (int, float)) and not isinstance(tpp, bool) and budget is not None and \
            float(tpp) == budget.ratios[0]
        if tpp is not None and not one:  # a string, a list or another number: not the one ratio
            raise OptBenchError(f"tune.second_draw cell {size}: tokens_per_param {tpp!r} is not the sweep's one data "
                                "ratio. Leave it out in a sweep with one ratio.")
        return size, None
    if isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or float(tpp) not in keys:
        raise OptBenchError(f"tune.second_draw cell {size} needs tokens_per_param, one of budget.tokens_per_param "
                            f"{list(keys)}, got {tpp!r}. E.g. {EXAMPLE}.")
    assert budget is not None
    if not budget.includes(size, float(tpp)):
        raise OptBenchError(f"tune.second_draw cell {size} at {float(tpp):g} tokens/param is excluded by "
                            "budget.exclude: the comparison never ran it. Choose a cell that runs.")
    return size, float(tpp)


def parse_second_draw(value: Any, *, tune_seeds: Sequence[int], confirm_seeds: Sequence[int],
                      compared_seeds: Sequence[int], sizes: Sequence[str], budget: Budget | None) -> SecondDraw | None:
    """``tune.second_draw`` checked against the matrix (sizes, seeds) and the budget (ratios, exclusions); None when
    absent. Every mistake is one OptBenchError naming the key, before any run."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != DRAW_KEYS:
        raise OptBenchError(f"tune.second_draw must be a mapping with exactly seed and cells, got {value!r}. "
                            f"E.g. {EXAMPLE}.")
    (seed,) = seed_list([value["seed"]], "tune.second_draw.seed")
    for seeds, what in ((tune_seeds, "tune.seed"), (confirm_seeds, "tune.confirm_seeds"),
                        (compared_seeds, "matrix seed")):
        if seed in seeds:
            raise OptBenchError(f"tune.second_draw.seed {seed} is one of {what} {list(seeds)}: the second draw needs "
                                "a tuning seed no other run uses (a compared seed would let the comparison's own luck "
                                "pick its rate). Choose another, e.g. 6.")
    cells_raw = value["cells"]
    if not isinstance(cells_raw, list) or not cells_raw:
        raise OptBenchError(f"tune.second_draw.cells must be a non-empty list of cells, got {cells_raw!r}. "
                            f"E.g. {EXAMPLE}.")
    cells = tuple(_cell(c, sizes, budget) for c in cells_raw)
    if len(set(cells)) != len(cells):
        raise OptBenchError(f"tune.second_draw.cells lists a cell twice: {list(cells)}. Remove the duplicate.")
    return SecondDraw(seed, cells)
