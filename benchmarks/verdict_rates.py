"""How often the scaling verdict is wrong, measured by simulation: python benchmarks/verdict_rates.py

A benchmark of the statistics, not of speed. Simulated sweeps at the demo's three sizes (0.11M, 0.81M, 2.7M
parameters) feed hf_optbench.measure.verdict.verdict_for:

* null: no true difference at any size; every run's metric carries independent log-normal noise (sd ``noise``
  on the log scale, for the optimizer and the baseline alike) plus a seed effect shared by the pair. Any verdict
  other than "no difference" / "level" / "insufficient data" is a false verdict; the rule's nominal level is 5 %.
* constant: a true ratio of 0.8 at every size: a "grows", "shrinks" or "deficit vanishes" is a false trend.
* trend: the ratio falls from 1.0 at the smallest size to 0.5 at the largest: "grows" or "deficit vanishes"
  (or "holds" counted separately) is the detection rate.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from hf_optbench.measure.verdict import MetricSpec, Observation, verdict_for

SIZES = {"tiny": 108_288, "mini": 809_728, "midi": 2_694_144}
SPEC = MetricSpec("m", "convergence", "simulated metric")
NO_CLAIM = ("no difference", "level", "insufficient data")
TREND_CLAIMS = ("grows", "shrinks", "deficit vanishes")


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
    """Fraction of trials per verdict for one scenario."""
    rng = np.random.default_rng(rng_seed)
    counts: dict[str, int] = {}
    truth = scenario(name)
    for _ in range(trials):
        label = verdict_for(simulate(truth, seeds, noise, rng), "opt", SPEC).verdict
        counts[label] = counts.get(label, 0) + 1
    return {k: v / trials for k, v in sorted(counts.items())}


def summarise(name: str, r: dict[str, float]) -> tuple[str, float]:
    if name == "null":
        return "false verdict", sum(v for k, v in r.items() if k not in NO_CLAIM)
    if name == "constant":
        return "false trend", sum(v for k, v in r.items() if k in TREND_CLAIMS)
    return "trend found", r.get("grows", 0.0) + r.get("deficit vanishes", 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
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
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
