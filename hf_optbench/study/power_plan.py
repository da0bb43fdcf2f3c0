"""How many seeds a sweep needs to detect a given trend of its speedup along data (``sweep --dry_run
--target_trend T --power_from FILE``).

The primary test along data is a one-sample t test of the per-seed least-squares slopes of ln(speedup) on
log10(tokens per parameter) against ``± threshold`` (:mod:`hf_optbench.measure.verdict`, the trend). Its power is
fixed by three things a plan can know before running: the per-point noise of ln(speedup) across seeds (measured in an
earlier sweep, pooled within its cells), the design's ratios (which set the slope's spread through
``sum((x - mean x)^2)``), and the level Holm's procedure can give a cell of the primary family (planned at its
worst, Bonferroni's ``ALPHA / cells``, each cell's two tests at half of it). :mod:`hf_optbench.measure.primary`
holds the arithmetic; tests/measure/test_primary.py checks it by simulating the test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.primary import pooled_point_sd, seeds_for_trend, slope_sd, trend_mde
from hf_optbench.measure.verdict import ALPHA, SPEEDUP_MARGIN
from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import compared_rows


@dataclass(frozen=True)
class PowerPlan:
    """The plan's inputs and answers, for one line of the dry run."""

    point_sd: float
    cells: int
    source: str
    ratios: tuple[float, ...]
    primary_cells: int
    seeds: int
    mde: float
    target: float | None
    seeds_needed: int | None
    threshold: float

    def describe(self) -> str:
        span = math.log10(max(self.ratios)) - math.log10(min(self.ratios))
        decades = f"{span:.2g}"  # as printed: 24 over 2.4 is 1.0000000000000002 decades in floats
        text = (f"power along data: ln(speedup) varies by sd {self.point_sd:.3g} between seeds (pooled over "
                f"{self.cells} cells of {self.source}); over {', '.join(f'{r:g}' for r in self.ratios)} tokens/param "
                f"({decades} decade{'' if decades == '1' else 's'}, trend threshold ±{self.threshold:.3g}) and "
                f"{self.primary_cells} primary cells "
                f"(planned at Bonferroni's level {ALPHA / self.primary_cells:.2g}), {self.seeds} seeds detect a trend of "
                f"±{self.mde:.3g} ln/decade with 80 % power")
        if self.target is not None:
            text += (f"; a trend of {self.target:g} needs {self.seeds_needed} seeds" if self.seeds_needed is not None
                     else f"; a trend of {self.target:g} cannot be reached with up to 200 seeds (at or inside the "
                          f"threshold {self.threshold:.3g}, or too noisy)")
        return text + "."


def _summary_csv(source: Path) -> Path:
    """An earlier sweep's summary.csv: the file itself, or a sweep directory's report/summary.csv."""
    path = source / "report" / "summary.csv" if source.is_dir() else source
    if not path.is_file():
        raise OptBenchError(f"--power_from '{source}': no summary.csv there. Pass an earlier sweep's report/summary.csv "
                            "(or its sweep directory, once `hf-optbench report` has run on it).")
    return path


def point_sd_from(source: str | Path) -> tuple[float, int]:
    """(pooled sd of ln(speedup) between seeds within each optimizer x size x ratio cell, cells pooled) of an earlier
    sweep's completed, uncensored comparison runs."""
    by_cell: dict[tuple[str, str, float | None], list[float]] = {}
    for r in compared_rows(_summary_csv(Path(source))):
        speedup = r["speedup"]
        if r["optimizer"] in ("", BASELINE) or speedup is None or not speedup > 0 or r["speedup_censored"]:
            continue
        by_cell.setdefault((r["optimizer"], r["model_size"], r["budget_tpp"]), []).append(math.log(speedup))
    pooled = pooled_point_sd(by_cell)
    if pooled is None:
        raise OptBenchError(f"--power_from '{source}': no cell with two or more measured speedups to estimate the "
                            "spread from. Pass a sweep with an AdamW ladder and at least two seeds.")
    return pooled


def data_design(cells: Iterable[tuple[str, float]]) -> tuple[tuple[float, ...], int]:
    """(the data ratios the plan is for, how many ratios two sizes or more share) from a sweep's (size,
    tokens/param) cells. Each size has its own ratios (a sweep may leave cells out): the plan is for the size whose
    ratios span least (then the fewest), the hardest on which to see a trend; a ratio two sizes share is one cell
    of the size axis per optimizer."""
    by_size: dict[str, set[float]] = {}
    for size, ratio in cells:
        by_size.setdefault(size, set()).add(float(ratio))
    if not by_size:
        return (), 0
    ratios = tuple(sorted(min(by_size.values(), key=lambda rs: (max(rs) / min(rs), len(rs)))))
    shared = sum(1 for x in set().union(*by_size.values()) if sum(x in rs for rs in by_size.values()) > 1)
    return ratios, shared


def plan_power(ratios: tuple[float, ...], optimizers: int, sizes: int, seeds: int, source: str | Path,
               target: float | None = None, size_cells: int | None = None) -> PowerPlan:
    """The power of the primary test along data for a design of ``ratios`` with ``optimizers`` compared (AdamW
    aside) at ``sizes`` sizes and ``seeds`` seeds, and the seeds ``target`` needs, from ``source``'s spread.
    ``size_cells``: the primary family's cells along size (0 where the sweep's primary questions leave the size axis
    out); by default one per optimizer and ratio when there are two sizes or more."""
    if len(ratios) < 2:
        raise OptBenchError("--target_trend needs a sweep over at least two data ratios (budget.tokens_per_param): "
                            "a trend along data needs two points.")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise OptBenchError(f"--target_trend must be a positive trend in ln per decade (e.g. 0.1), got {target}.")
    point_sd, cells = point_sd_from(source)
    xs = [math.log10(r) for r in ratios]
    threshold = SPEEDUP_MARGIN / (max(xs) - min(xs))
    spread = slope_sd(point_sd, xs)
    along_size = (optimizers * len(ratios) if sizes > 1 else 0) if size_cells is None else size_cells
    primary_cells = max(1, optimizers * sizes + along_size)  # data + size axes
    level = ALPHA / primary_cells / 2
    return PowerPlan(point_sd, cells, str(source), tuple(ratios), primary_cells, seeds,
                     trend_mde(spread, seeds, level, threshold), target,
                     None if target is None else seeds_for_trend(target, spread, level, threshold), threshold)
