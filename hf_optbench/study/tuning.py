"""Learning-rate tuning for a fair comparison: pick, per optimizer and model size, the best multiplier of a grid
around the optimizer's cited default, selected on a held-out tuning split, and write it where runs read it.

The main protocol is one sweep file with a ``tune:`` section (``recipes/sweeps/cpu_demo.yaml``): ``hf-optbench
sweep`` runs the grid into ``<output_dir>/tuning``, calls :func:`tune_phase` (which writes
``<output_dir>/tuned_hparams.yaml``), then runs the comparison at the tuned rates. By hand, the same in steps::

    hf-optbench sweep recipes/sweeps/tune_cpu.yaml          # matrix.lr_multipliers: [0.5, 1, 2]
    hf-optbench tune runs/tune_cpu --output tuned_hparams.yaml
    hf-optbench run recipes/quickstart_cpu.yaml --tuned_hparams_file tuned_hparams.yaml

Why: comparing optimizers at one hand-picked learning rate measures the pick, not the optimizer (Schmidt et al.
2021, "Descending through a Crowded Valley"; Kaddour et al. 2023, "No Train No Gain", tune every method on the
same budget). The rule: a multiplier's score is the mean ``final_tuning_loss`` over its seeds, the loss on a split
held out from training and from the reported eval split (``DataArguments.tuning_blocks``), so the reported eval
loss is never the one the rate was picked on; a multiplier with any diverged, failed or out-of-memory seed loses
(a rate that diverges for one seed is not a safe default); ties go to the multiplier closest to 1 (the cited
default). A best value at the edge of the grid is flagged: widen the grid.

File format (read by ``hf_optbench.optim.registry.lookup_tuned``; keys beyond the hyperparameters are provenance)::

    lion:
      mini: {learning_rate: 0.0001, multiplier: 0.5, tuning_loss: 5.12, metric: final_tuning_loss,
             grid: [0.5, 1.0, 2.0], seeds: [0], tuning_dir: runs/cpu_demo/tuning,
             curve: [{multiplier: 0.5, learning_rate: 0.0001, tuning_loss: 5.12}, ...],
             source: "tuned by runs/cpu_demo/tuning on 2026-11-22: ..."}
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import write_text_atomic
from hf_optbench.study.sweep_spec import TUNING_METRIC, SweepSpec

Records = dict[float, list[Mapping[str, Any]]]


def _metric(r: Mapping[str, Any], metric: str) -> Any:
    """``metric`` of a run record: a column of its own, else its summary.json (analysis.load_runs keeps it whole)."""
    value = r.get(metric)
    return value if value is not None else (r.get("_summary") or {}).get(metric)


def _score(runs: Sequence[Mapping[str, Any]], metric: str) -> float:
    """Mean ``metric`` over the seeds; inf when a seed did not complete or its value is not finite."""
    losses = []
    for r in runs:
        if r.get("status") != "completed":
            return math.inf
        loss = _metric(r, metric)
        if loss is None:
            raise OptBenchError(
                f"tuning run '{r.get('run_id') or r.get('optimizer')}' has no {metric} in its summary.json: it ran "
                f"without a held-out tuning split. Set tuning_blocks (e.g. 16) in the tuning sweep's overrides and "
                "run it again; learning rates are never selected on the reported eval split.")
        if not math.isfinite(float(loss)):
            return math.inf
        losses.append(float(loss))
    return statistics.fmean(losses) if losses else math.inf


def _group(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Records]:
    groups: dict[tuple[str, str], Records] = {}
    for r in records:
        mult = r.get("lr_multiplier")
        if mult is None or mult == "":
            continue
        groups.setdefault((str(r["optimizer"]), str(r["model_size"])), {}).setdefault(float(mult), []).append(r)
    if not groups:
        raise OptBenchError("no runs with an lr_multiplier found: tune needs a sweep whose matrix has "
                            "lr_multipliers (e.g. recipes/sweeps/tune_cpu.yaml), or a sweep with a 'tune:' section.")
    return groups


def _one_lr(by_mult: Records, mult: float, where: str) -> float | None:
    lrs = {float(r["learning_rate"]) for r in by_mult[mult] if r.get("learning_rate") is not None}
    if len(lrs) > 1:
        raise OptBenchError(f"{where} x{mult:g}: its runs used learning rates {sorted(lrs)}; expected one. Were runs "
                            "of different sweeps mixed in this directory?")
    return lrs.pop() if lrs else None


def select_best(records: Sequence[Mapping[str, Any]], metric: str = TUNING_METRIC
                ) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """({optimizer: {model_size: {learning_rate, multiplier, tuning_loss, curve}}}, warnings) from run records
    with ``optimizer``, ``model_size``, ``lr_multiplier``, ``status``, ``learning_rate`` and ``metric`` (a column
    or in ``_summary``). ``curve`` is the mean ``metric`` of every multiplier (None where a seed failed)."""
    best: dict[str, dict[str, dict[str, Any]]] = {}
    warnings: list[str] = []
    for (opt, size), by_mult in sorted(_group(records).items()):
        scores = {m: _score(runs, metric) for m, runs in by_mult.items()}
        choice = min(sorted(by_mult), key=lambda m: (scores[m], abs(math.log(m))))
        if not math.isfinite(scores[choice]):
            warnings.append(f"{opt}/{size}: every multiplier has a diverged or failed seed; nothing written")
            continue
        lr = _one_lr(by_mult, choice, f"{opt}/{size}")
        if lr is None:
            raise OptBenchError(f"{opt}/{size} x{choice:g}: its runs record no learning_rate in summary.json.")
        if len(by_mult) > 1 and choice in (min(by_mult), max(by_mult)):
            warnings.append(f"{opt}/{size}: best multiplier x{choice:g} is at the edge of the grid "
                            f"{sorted(by_mult)}; widen lr_multipliers")
        curve = [{"multiplier": m, "learning_rate": _one_lr(by_mult, m, f"{opt}/{size}"),
                  "tuning_loss": round(scores[m], 6) if math.isfinite(scores[m]) else None} for m in sorted(by_mult)]
        best.setdefault(opt, {})[size] = {"learning_rate": lr, "multiplier": choice,
                                          "tuning_loss": round(scores[choice], 6), "metric": metric, "curve": curve}
    return best, warnings


def write_tuned(best: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str | os.PathLike[str],
                source: str, warnings: Sequence[str] = (), *, provenance: Mapping[str, Any] | None = None,
                merge: bool = True) -> Path:
    """Write the tuned-values YAML; each entry gets ``source`` and ``provenance`` (tuning dir, grid, seeds).
    ``merge``: keep the other optimizers/sizes of an existing file (``hf-optbench tune``); a sweep's own file is
    written whole."""
    import yaml

    out = Path(path)
    data: dict[str, Any] = {}
    if merge and out.is_file():
        data = yaml.safe_load(out.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise OptBenchError(f"'{out}' exists and is not a tuned-values mapping: choose another --output.")
    for opt, sizes in best.items():
        for size, entry in sizes.items():
            data.setdefault(opt, {})[size] = {**copy.deepcopy(dict(entry)), **copy.deepcopy(dict(provenance or {})),
                                              "source": source}  # copies: no YAML anchors between entries
    header = ["# Tuned learning rates (hf-optbench): per optimizer and size, the grid multiplier with the best mean",
              f"# {TUNING_METRIC} (a held-out split, not the reported eval split); a multiplier with a diverged or",
              f"# failed seed loses. {source}", "# Use: --tuned_hparams_file " + str(out)]
    header += [f"# warning: {w}" for w in warnings]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=True))
    return out


def _source(tuning_dir: Path, grid: Sequence[float], seeds: Sequence[int], metric: str) -> str:
    return (f"tuned by {tuning_dir} on {_dt.date.today().isoformat()}: learning-rate grid "
            f"{', '.join(f'x{m:g}' for m in grid)} of the cited default, best mean {metric} over seeds "
            f"{list(seeds)}")


def tune(sweep_dir: str | os.PathLike[str], output: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    """Select the best multipliers of a tuning sweep's runs and write them to ``output``; (path, warnings)."""
    from hf_optbench.study.analysis import load_runs

    d = Path(sweep_dir)
    if not d.is_dir():
        raise OptBenchError(f"sweep directory not found: '{sweep_dir}'. Pass the output_dir of a tuning sweep.")
    records = load_runs(d)
    best, warnings = select_best(records)
    grid = sorted({float(r["lr_multiplier"]) for r in records if r.get("lr_multiplier") not in (None, "")})
    seeds = sorted({int(r["seed"]) for r in records if r.get("lr_multiplier") not in (None, "") and
                    r.get("seed") is not None})
    provenance = {"tuning_dir": str(d.resolve()), "grid": grid, "seeds": seeds}
    return write_tuned(best, output, _source(d.resolve(), grid, seeds, TUNING_METRIC), warnings,
                       provenance=provenance), warnings


def tune_phase(spec: SweepSpec) -> tuple[Path, list[str]]:
    """After a sweep's tuning phase: select, check that every compared optimizer x size has a value (OptBenchError
    otherwise: never a silent fallback to the citation), and write ``spec.tuned_file``. A selection that differs
    from the file comparison runs already used is an error (those runs would no longer match the file)."""
    import yaml

    from hf_optbench.study.analysis import load_runs

    assert spec.tuning is not None and spec.tune is not None
    best, warnings = select_best(load_runs(spec.tuning.output_dir), spec.tune.metric)
    missing = sorted({f"{r.optimizer}/{r.model_size}" for r in spec.runs
                      if "learning_rate" not in best.get(r.optimizer, {}).get(r.model_size, {})})
    if missing:
        raise OptBenchError(
            f"the tuning phase found no usable learning rate for {', '.join(missing)} (every multiplier of the grid "
            f"diverged, failed or did not run; see {spec.tuning.output_dir}/summary.csv), so the comparison does not "
            "start. Widen tune.lr_multipliers (lower values), or fix the failures and rerun with --retry-failed.")
    old = yaml.safe_load(spec.tuned_file.read_text(encoding="utf-8")) if spec.tuned_file.is_file() else None
    changed = [f"{o}/{s}" for o, sizes in best.items() for s, e in sizes.items()
               if isinstance(old, dict) and (old.get(o) or {}).get(s, {}).get("learning_rate") not in
               (None, e["learning_rate"])]
    if changed and spec.runs_dir.is_dir() and any(spec.runs_dir.iterdir()):
        raise OptBenchError(
            f"the tuning phase now selects other learning rates for {', '.join(changed)} than {spec.tuned_file} "
            f"held when the comparison runs in {spec.runs_dir} started. Move that directory aside (or use another "
            "--output-dir) to compare at the new rates; nothing was overwritten.")
    provenance = {"tuning_dir": str(spec.tuning.output_dir), "grid": spec.tune.multipliers,
                  "seeds": spec.tune.seeds}
    source = _source(spec.tuning.output_dir, spec.tune.multipliers, spec.tune.seeds, spec.tune.metric)
    return write_tuned(best, spec.tuned_file, source, warnings, provenance=provenance, merge=False), warnings
