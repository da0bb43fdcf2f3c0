"""The ``tune:`` section of a sweep file, checked into a :class:`TuneSpec`: the initial learning-rate grid, the
weight-decay grid, the tuning seeds and the cap on grid extensions.

A module of its own (below ``sweep_spec``, which reads the rest of the file and calls :func:`parse_tune`) so that
both stay small; ``study.tuning_grid`` runs what it describes. The keys, as ``hf-optbench sweep --help`` shows them::

    tune:
      lr_multipliers: [1, 4, 16]      # the initial grid, x each optimizer's cited learning rate (>= 3, x1 among them)
      lr_grid: {low: 0.25, high: 4}   # or: factor-2 steps from low to high (powers of 2, low <= 1 <= high)
      wd_multipliers: [0.333333, 1, 3]   # the weight-decay grid, x the cited value (optimizers that tune it)
      max_extensions: 3               # points the tuner may add beyond an edge, per optimizer x size and hyperparameter
      seed: [0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError

TUNE_KEYS = {"lr_multipliers", "lr_grid", "wd_multipliers", "max_extensions", "seed"}
# An extension adds one factor-2 step of the learning rate beyond the edge (the spacing of Marin's phase-I
# learning-rate grids, marin-community/marin experiments/optimizer_sweep, e.g. 8e-3, 1.6e-2, 3.2e-2).
LR_STEP = 2.0
# Weight decay moves in factor-3 steps: Chen et al. 2023 (arXiv:2302.06675, Sec. 5) give Lion a decoupled weight
# decay 3-10x AdamW's; the cited Lion value is already AdamW's x 3 (optim/lion.py), so x1/3, x1, x3 spans AdamW's
# own value to 9x it, the paper's band with a point on each side of it.
WD_STEP = 3.0
WD_MULTIPLIERS = (1 / 3, 1.0, 3.0)
# Three factor-2 steps reach 8x beyond the initial grid's edge, more than the 4x by which the demo's 3-point grid
# missed (measured 2026-11-23/25: adafactor's best at the grid's x1 edge, lion's and Muon's at the x16 edge), for at most 3 more
# runs per tuning seed, optimizer x size and hyperparameter.
MAX_EXTENSIONS = 3


@dataclass
class TuneSpec:
    """The ``tune:`` section: the initial learning-rate grid (multipliers of each optimizer's cited default), the
    weight-decay grid (multipliers of the cited weight decay, for optimizers whose spec sets ``tune_weight_decay``),
    the seeds, the selection metric and how far the tuner may extend a grid whose best point is at an edge."""

    multipliers: list[float]
    seeds: list[int]
    metric: str
    max_extensions: int = MAX_EXTENSIONS
    wd_multipliers: list[float] = field(default_factory=lambda: list(WD_MULTIPLIERS))
    lr_step: float = LR_STEP
    wd_step: float = WD_STEP


def _numbers(value: Any, where: str, example: str) -> list[float]:
    values = value if isinstance(value, list) else [value]
    for m in values:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or not m > 0:
            raise OptBenchError(f"{where} must be positive numbers, got {m!r}. E.g. {example}.")
    if len({float(m) for m in values}) != len(values):
        raise OptBenchError(f"{where} lists a value twice: {values}. Remove the duplicate.")
    return sorted(float(m) for m in values)


def _around_one(grid: list[float], where: str, example: str) -> list[float]:
    """A grid must hold x1 (the cited value: the tuned one is then never worse on the tuning split) and a point on
    each side of it, or at least 3 points."""
    if len(grid) < 3 or 1.0 not in grid:
        raise OptBenchError(f"{where} {grid} is not a grid around the cited default: give at least 3 multipliers, "
                            f"1 (the cited default) among them, e.g. {example}.")
    return grid


def _factor2(value: Any) -> list[float]:
    """``lr_grid: {low, high}``: the powers of 2 from low to high."""
    if not isinstance(value, dict) or set(value) != {"low", "high"}:
        raise OptBenchError(f"tune.lr_grid must be a mapping {{low: ..., high: ...}} (factor-2 steps between them), "
                            f"got {value!r}. E.g. lr_grid: {{low: 0.25, high: 4}}.")
    low, high = (_numbers(value[k], f"tune.lr_grid.{k}", "0.25")[0] for k in ("low", "high"))
    exps = [math.log2(low), math.log2(high)]
    if any(abs(e - round(e)) > 1e-9 for e in exps) or not low <= 1.0 <= high:
        raise OptBenchError(f"tune.lr_grid {{low: {low:g}, high: {high:g}}} must be powers of 2 with low <= 1 <= "
                            "high (the cited default on the grid), e.g. {low: 0.25, high: 4}.")
    return [2.0 ** k for k in range(round(exps[0]), round(exps[1]) + 1)]


def parse_tune(tune: dict[str, Any], seeds: list[int], metric: str) -> TuneSpec:
    """The checked ``tune:`` mapping (its keys already checked against :data:`TUNE_KEYS`) as a TuneSpec."""
    if ("lr_multipliers" in tune) == ("lr_grid" in tune):
        raise OptBenchError("tune needs lr_multipliers or lr_grid (one of them): the grid around each cited "
                            "default, e.g. lr_multipliers: [0.5, 1, 2] or lr_grid: {low: 0.25, high: 4}.")
    if "lr_grid" in tune:
        grid = _factor2(tune["lr_grid"])
    else:
        grid = _numbers(tune["lr_multipliers"], "tune.lr_multipliers", "[0.25, 0.5, 1, 2, 4]")
    grid = _around_one(grid, "tune.lr_grid" if "lr_grid" in tune else "tune.lr_multipliers", "[0.5, 1, 2] or [1, 2, 4]")
    wd = _around_one(_numbers(tune.get("wd_multipliers", list(WD_MULTIPLIERS)), "tune.wd_multipliers",
                              "[0.333333, 1, 3]"), "tune.wd_multipliers", "[0.333333, 1, 3]")
    cap = tune.get("max_extensions", MAX_EXTENSIONS)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise OptBenchError(f"tune.max_extensions must be a whole number >= 0 (0: never extend), got {cap!r}.")
    return TuneSpec(multipliers=grid, seeds=seeds, metric=metric, max_extensions=cap, wd_multipliers=wd)
