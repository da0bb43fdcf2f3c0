"""Learning-rate tuning for a fair comparison: pick, per optimizer and model size, the best multiplier of a
small grid around the optimizer's cited default, and write it where recipes can use it.

    hf-optbench sweep recipes/sweeps/tune_cpu.yaml          # matrix.lr_multipliers: [0.25, 0.5, 1, 2, 4]
    hf-optbench tune runs/tune_cpu --output tuned_hparams.yaml
    hf-optbench run recipes/quickstart_cpu.yaml --tuned_hparams_file tuned_hparams.yaml

Why: comparing optimizers at one hand-picked learning rate measures the pick, not the optimizer (Schmidt et al.
2021, "Descending through a Crowded Valley"; Kaddour et al. 2023, "No Train No Gain", tune every method on the
same budget). The rule: a multiplier's score is the mean final eval loss over its seeds; a multiplier with any
diverged, failed or out-of-memory seed loses (a rate that diverges for one seed is not a safe default); ties go to
the multiplier closest to 1 (the cited default). A best value at the edge of the grid is flagged: widen the grid.

File format (read by ``optimizers.lookup_tuned``)::

    lion:
      mini: {learning_rate: 0.0001, multiplier: 0.5, eval_loss: 5.12, source: "tuned by runs/tune_cpu on 2026-11-21"}
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import OptBenchError


def _score(runs: Sequence[Mapping[str, Any]]) -> float:
    losses = []
    for r in runs:
        loss = r.get("final_eval_loss")
        if r.get("status") != "completed" or loss is None or not math.isfinite(float(loss)):
            return math.inf
        losses.append(float(loss))
    return statistics.fmean(losses) if losses else math.inf


def select_best(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """({optimizer: {model_size: {learning_rate, multiplier, eval_loss}}}, warnings) from run records with
    ``optimizer``, ``model_size``, ``lr_multiplier``, ``status``, ``final_eval_loss``, ``learning_rate``."""
    groups: dict[tuple[str, str], dict[float, list[Mapping[str, Any]]]] = {}
    for r in records:
        mult = r.get("lr_multiplier")
        if mult is None or mult == "":
            continue
        groups.setdefault((str(r["optimizer"]), str(r["model_size"])), {}).setdefault(float(mult), []).append(r)
    if not groups:
        raise OptBenchError("no runs with an lr_multiplier found: tune needs a sweep whose matrix has "
                            "lr_multipliers (e.g. recipes/sweeps/tune_cpu.yaml).")
    best: dict[str, dict[str, dict[str, Any]]] = {}
    warnings: list[str] = []
    for (opt, size), by_mult in sorted(groups.items()):
        scored = sorted(by_mult, key=lambda m: (_score(by_mult[m]), abs(math.log(m))))
        choice = scored[0]
        score = _score(by_mult[choice])
        if not math.isfinite(score):
            warnings.append(f"{opt}/{size}: every multiplier has a diverged or failed seed; nothing written")
            continue
        lrs = {float(r["learning_rate"]) for r in by_mult[choice] if r.get("learning_rate") is not None}
        if len(lrs) != 1:
            raise OptBenchError(f"{opt}/{size} x{choice:g}: its runs used learning rates {sorted(lrs)}; expected "
                                "one. Were runs of different sweeps mixed in this directory?")
        if len(by_mult) > 1 and choice in (min(by_mult), max(by_mult)):
            warnings.append(f"{opt}/{size}: best multiplier x{choice:g} is at the edge of the grid "
                            f"{sorted(by_mult)}; widen lr_multipliers")
        best.setdefault(opt, {})[size] = {"learning_rate": lrs.pop(), "multiplier": choice,
                                          "eval_loss": round(score, 6)}
    return best, warnings


def write_tuned(best: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str | os.PathLike[str],
                source: str, warnings: Sequence[str] = ()) -> Path:
    """Write the tuned-values YAML (merging into an existing file: other optimizers/sizes are kept)."""
    import yaml

    out = Path(path)
    data: dict[str, Any] = {}
    if out.is_file():
        data = yaml.safe_load(out.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise OptBenchError(f"'{out}' exists and is not a tuned-values mapping: choose another --output.")
    for opt, sizes in best.items():
        for size, entry in sizes.items():
            data.setdefault(opt, {})[size] = {**entry, "source": source}
    header = ["# Tuned learning rates (hf-optbench tune): best mean final eval loss per optimizer and size;",
              "# a multiplier with a diverged/failed seed loses. Use: --tuned_hparams_file " + str(out)]
    header += [f"# warning: {w}" for w in warnings]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=True), encoding="utf-8")
    return out


def tune(sweep_dir: str | os.PathLike[str], output: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    from .report import load_runs

    d = Path(sweep_dir)
    if not d.is_dir():
        raise OptBenchError(f"sweep directory not found: '{sweep_dir}'. Pass the output_dir of a tuning sweep.")
    best, warnings = select_best(load_runs(d))
    source = f"tuned by {d} on {_dt.date.today().isoformat()}"
    return write_tuned(best, output, source, warnings), warnings


def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-optbench tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="output directory of a sweep with matrix.lr_multipliers")
    parser.add_argument("--output", default="tuned_hparams.yaml", help="YAML to write (merged if it exists)")
    args = parser.parse_args(argv)
    path, warnings = tune(args.sweep_dir, args.output)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(path.read_text(encoding="utf-8"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
