"""How often the scaling verdict is wrong, measured by simulation: python benchmarks/verdict_rates.py

A benchmark of the statistics, not of speed. Simulated sweeps at three sizes (0.11M, 0.81M, 2.7M parameters) feed
hf_optbench.measure.verdict:

* one cell (one optimizer, one metric; ``verdict_for``):
  - null: no true difference at any size; every run's metric carries independent log-normal noise (sd ``noise``
    on the log scale, for the optimizer and the baseline alike) plus a seed effect shared by the pair. Any word
    that claims a difference (``verdict.CLAIMS``) is a false verdict; the nominal level is 5 %.
  - constant: a true ratio of 0.8 at every size: a trend word ("grows", "gaining", "shrinks", "deficit
    vanishes") is a false trend; "holds" or "ahead, trend unresolved" is the saving found.
  - trend: the ratio falls from 1.0 at the smallest size to 0.5 at the largest: "grows", "gaining" or "deficit
    vanishes" is the detection rate.
* the whole table (``verdict``: 3 optimizers x every metric of the report, 24 cells, Holm's procedure over them):
  null data for every metric on its own scale (log-normal ratios, losses in nats, spike counts, a speedup around 1,
  no divergence). The family-wise false-verdict rate, the share of tables with any false claim, must stay at 5 %;
  beside it, the same tables judged cell by cell at 5 % each (no control), as the report did before issue 29.
* the whole table over two axes (issue 31: ``grid_families`` + ``verdict_table``): sizes x data ratios (tokens per
  parameter) with the costliest corner left out, as the CPU study runs it; the size axis at each ratio every size
  ran, the data axis at each size, Holm's procedure over every cell of both. Null data again: the seed's effect is
  shared by every run of that seed, at every size and ratio (one initialisation and data order per seed).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np

from hf_optbench.measure.verdict import (
    CLAIMS,
    METRICS,
    MetricSpec,
    Observation,
    grid_families,
    verdict,
    verdict_for,
    verdict_table,
)

SIZES = {"tiny": 108_288, "mini": 809_728, "midi": 2_694_144}
SPEC = MetricSpec("m", "convergence", "simulated metric")
TREND_CLAIMS = ("grows", "gaining", "shrinks", "deficit vanishes")
FOUND = ("holds", "ahead, trend unresolved")
OPTIMIZERS = ("opt_a", "opt_b", "opt_c")
# The first CPU study's grid (docs/results/cpu_study_v1): three sizes x three ratios, the largest size at the largest
# ratio left out.
GRID_SIZES = {"nano": 25_088, "tiny": 100_352, "mini": 793_088}
GRID_RATIOS = (0.15, 0.5, 2.0)
GRID_EXCLUDE = (("mini", 2.0),)


def simulate(log_ratio: dict[str, float], seeds: int, noise: float, rng: np.random.Generator) -> list[Observation]:
    """One simulated sweep: baseline and optimizer values per size and seed."""
    obs = []
    for seed in range(seeds):
        shared = rng.normal(0.0, 0.3)  # the seed's init/data effect, the same for both optimizers
        for size, params in SIZES.items():
            b = math.exp(5.0 + shared + rng.normal(0.0, noise))
            o = math.exp(5.0 + shared + log_ratio[size] + rng.normal(0.0, noise))
            obs += [Observation("adamw", size, params, seed, b), Observation("opt", size, params, seed, o)]
    return obs


def scenario(name: str) -> dict[str, float]:
    xs = {s: math.log10(p) for s, p in SIZES.items()}
    lo, hi = min(xs.values()), max(xs.values())
    if name == "null":
        return dict.fromkeys(SIZES, 0.0)
    if name == "constant":
        return dict.fromkeys(SIZES, math.log(0.8))
    if name == "trend":  # ratio 1.0 -> 0.5, linear in log10(parameters)
        return {s: math.log(0.5) * (x - lo) / (hi - lo) for s, x in xs.items()}
    raise ValueError(name)


def rates(name: str, seeds: int, noise: float, trials: int, rng_seed: int = 0) -> dict[str, float]:
    """Fraction of trials per verdict for one scenario (one cell)."""
    rng = np.random.default_rng(rng_seed)
    counts: dict[str, int] = {}
    truth = scenario(name)
    for _ in range(trials):
        label = verdict_for(simulate(truth, seeds, noise, rng), "opt", SPEC).verdict
        counts[label] = counts.get(label, 0) + 1
    return {k: v / trials for k, v in sorted(counts.items())}


def summarise(name: str, r: dict[str, float]) -> tuple[str, float]:
    if name == "null":
        return "false verdict", sum(v for k, v in r.items() if k in CLAIMS)
    if name == "constant":
        return "false trend", sum(v for k, v in r.items() if k in TREND_CLAIMS)
    return "trend found", sum(r.get(k, 0.0) for k in ("grows", "gaining", "deficit vanishes"))


# ------------------------------------------------------------------------------------------------ whole table
def _value(spec: MetricSpec, shared: float, noise: float, rng: np.random.Generator) -> float:
    """One run's null value of ``spec`` on its own scale (the optimizer's and the baseline's alike)."""
    if spec.baseline_value is not None:  # a speedup: the optimizer's alone, around the baseline's 1
        return math.exp(rng.normal(0.0, noise))
    if spec.key == "diverged":
        return 0.0
    if spec.mode == "difference":  # losses (nats) and spike counts: additive noise on the margin's scale
        return 3.0 + 5 * spec.margin * shared + rng.normal(0.0, 2 * spec.margin)
    return math.exp(5.0 + shared + rng.normal(0.0, noise))


def simulate_table(seeds: int, noise: float, rng: np.random.Generator, sizes: dict[str, int] | None = None,
                   ratios: tuple[float | None, ...] = (None,), exclude: tuple[tuple[str, float], ...] = (),
                   optimizers: tuple[str, ...] = OPTIMIZERS) -> list[dict[str, Any]]:
    """One sweep's records, the baseline and ``optimizers`` with no true difference in any metric, at every size
    (``SIZES`` unless given) and data ratio (``budget_tpp``; None: a sweep with one) not in ``exclude``."""
    records = []
    for seed in range(seeds):
        shared = rng.normal(0.0, 0.3)
        for size, params in (sizes or SIZES).items():
            for tpp in (t for t in ratios if (size, t) not in exclude):
                for opt in ("adamw", *optimizers):
                    rec: dict[str, Any] = {"optimizer": opt, "model_size": size, "num_params": params, "seed": seed,
                                           "budget_tpp": tpp}
                    for spec in METRICS:
                        if spec.baseline_value is None or opt != "adamw":
                            rec[spec.key] = _value(spec, shared, noise, rng)
                    records.append(rec)
    return records


def _null_rates(judge: Any, trials: int, rng_seed: int) -> dict[str, float]:
    """Over ``trials`` null tables (``judge(rng)`` simulates one and returns its verdicts): the share with any false
    claim under Holm's control, the share with one when each cell is judged alone at 5 %, the cells and how many lie
    on the data axis."""
    rng = np.random.default_rng(rng_seed)
    holm = alone = 0
    table: list[Any] = []
    for _ in range(trials):
        table = judge(rng)
        holm += any(v.verdict in CLAIMS for v in table)
        alone += any(v.p_value is not None and v.p_value <= 0.05 for v in table)
    return {"family-wise false verdict": holm / trials, "uncontrolled": alone / trials, "cells": len(table),
            "data-axis cells": sum(v.axis == "data" for v in table)}


def table_rates(seeds: int, noise: float, trials: int, rng_seed: int = 0) -> dict[str, float]:
    """{"family-wise false verdict": share of tables with a false claim under Holm's control, "uncontrolled": the
    same tables with each cell judged alone at 5 %, "cells": the table's cells}."""
    return _null_rates(lambda rng: verdict(simulate_table(seeds, noise, rng)), trials, rng_seed)


def grid_rates(seeds: int, noise: float, trials: int, rng_seed: int = 0,
               optimizers: tuple[str, ...] = OPTIMIZERS) -> dict[str, float]:
    """:func:`table_rates` for the table over both axes (sizes x data ratios, ``GRID_*``), Holm's procedure over
    every cell of both axes, and how many of its cells lie on the data axis."""
    return _null_rates(lambda rng: verdict_table(grid_families(simulate_table(
        seeds, noise, rng, GRID_SIZES, GRID_RATIOS, GRID_EXCLUDE, optimizers))), trials, rng_seed)


def _print_null(title: str, rates_of: Any, args: argparse.Namespace) -> None:
    print(f"\n{title}, null data ({args.table_trials} simulated sweeps per cell):\n")
    print("| noise sd (log) | seeds | cells (data axis) | family-wise false verdict (Holm) | without control |")
    print("|---|---|---|---|---|")
    for noise in args.noise:
        for seeds in args.seeds:
            r = rates_of(seeds, noise, args.table_trials)
            print(f"| {noise:g} | {seeds} | {r['cells']:.0f} ({r['data-axis cells']:.0f}) | "
                  f"{100 * r['family-wise false verdict']:.1f} % | {100 * r['uncontrolled']:.1f} % |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--table-trials", type=int, default=400)
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.05, 0.10])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(f"{args.trials} simulated sweeps per cell; sizes {', '.join(SIZES)}; nominal false-verdict level 5 %\n")
    print("| scenario | what is counted | noise sd (log) | " + " | ".join(f"{s} seeds" for s in args.seeds) + " |")
    print("|---|---|---|" + "---|" * len(args.seeds))
    for name in ("null", "constant", "trend"):
        for noise in args.noise:
            cells, what = [], ""
            for seeds in args.seeds:
                what, value = summarise(name, rates(name, seeds, noise, args.trials))
                cells.append(f"{100 * value:.1f} %")
            print(f"| {name} | {what} | {noise:g} | " + " | ".join(cells) + " |")
    _print_null("The whole table", table_rates, args)
    _print_null(f"The whole table over sizes {', '.join(GRID_SIZES)} x tokens per parameter "
                f"{', '.join(f'{t:g}' for t in GRID_RATIOS)} (without "
                f"{', '.join(f'{s} x {t:g}' for s, t in GRID_EXCLUDE)}), both axes", grid_rates, args)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
