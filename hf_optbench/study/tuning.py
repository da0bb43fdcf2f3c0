"""Tuning for a fair comparison: pick, per optimizer and model size, the best learning rate (and, for optimizers
whose cited weight decay is not AdamW's, the best weight decay) of a grid around the optimizer's cited defaults,
selected on a held-out tuning split, and write it where runs read it.

The main protocol is one sweep file with a ``tune:`` section (``recipes/sweeps/cpu_demo.yaml``): ``hf-optbench
sweep`` runs the grid into ``<output_dir>/tuning``, extends it beyond any edge that holds the best point until the
optimum is bracketed (:mod:`hf_optbench.study.tuning_grid`), calls :func:`tune_phase` (which writes
``<output_dir>/tuned_hparams.yaml``), then runs the comparison at the tuned values. By hand (no extension: a plain
grid, its edges only warned about), the same in steps::

    hf-optbench sweep recipes/sweeps/tune_cpu.yaml          # matrix.lr_multipliers: [0.25, 0.5, 1, 2, 4]
    hf-optbench tune runs/tune_cpu --output tuned_hparams.yaml
    hf-optbench run recipes/quickstart_cpu.yaml --tuned_hparams_file tuned_hparams.yaml

Why: comparing optimizers at one hand-picked learning rate measures the pick, not the optimizer (Schmidt et al.
2021, "Descending through a Crowded Valley"; Kaddour et al. 2023, "No Train No Gain", tune every method on the
same budget). The rule: a multiplier's score is the mean ``final_tuning_loss`` over its seeds, the loss on a split
held out from training and from the reported eval split (``DataArguments.tuning_blocks``), so the reported eval
loss is never the one the rate was picked on; a multiplier with any diverged, failed or out-of-memory seed loses
(a rate that diverges for one seed is not a safe default); ties go to the multiplier closest to 1 (the cited
default). A best value still at the edge of the grid is flagged ``bracketed: false``.

File format (read by ``hf_optbench.optim.tuned.lookup_tuned``; keys beyond the hyperparameters are provenance)::

    lion:
      mini: {learning_rate: 0.00133, multiplier: 4.0, tuning_loss: 5.12, metric: final_tuning_loss,
             grid: [1.0, 4.0, 16.0, 32.0], extensions: [32.0], lr_bracketed: true,
             curve: [{multiplier: 1.0, learning_rate: 0.000333, tuning_loss: 5.3}, ...],
             weight_decay: 0.9, wd_multiplier: 3.0, wd_grid: [0.333333, 1.0, 3.0, 9.0], wd_extensions: [9.0],
             wd_curve: [{multiplier: 0.333333, weight_decay: 0.1, tuning_loss: 5.2}, ...], wd_bracketed: true,
             bracketed: true, seeds: [0], tuning_dir: runs/cpu_demo/tuning,
             source: "tuned by runs/cpu_demo/tuning on 2026-11-22: ..."}

``tuning_loss`` is the best point's (the weight-decay axis's best where weight decay was tuned); ``bracketed`` is
false when a best point is still at an edge after ``tune.max_extensions``; ``wd_not_tuned`` says why an optimizer
marked ``tune_weight_decay`` kept its cited weight decay.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import LOST_STATUSES, TUNED_FILE, write_text_atomic
from hf_optbench.study.sweep_spec import TUNING_METRIC, SweepSpec
from hf_optbench.study.tune_spec import TuneSpec
from hf_optbench.study.tuning_grid import (
    PairPlan,
    TuningPlan,
    choose,
    grid_text,
    is_bracketed,
    plan_tuning,
    score_runs,
    wd_multiplier_of,
    weight_decay_at,
)
from hf_optbench.yaml_file import dump_yaml, load_yaml_mapping, read_yaml_or_empty

Records = dict[float, list[Mapping[str, Any]]]
# A tuning run that ended LOST (after the sweep's one retry) says nothing about its rate, yet its point counts as a
# rise of the loss: the tuned file lists it under ``missing_points`` and the report repeats it.


def _missing_points(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tuned file's ``missing_points``: each lost run with its grid point and how it ended."""
    return [{"run_id": r.get("run_id"), "lr_multiplier": float(r["lr_multiplier"]) if r.get("lr_multiplier")
             not in (None, "") else None, "wd_multiplier": wd_multiplier_of(r), "status": r.get("status")}
            for r in runs]


def _missing_warning(pair: str, runs: Sequence[Mapping[str, Any]]) -> str:
    ids = ", ".join(f"{r.get('run_id')} ({r.get('status')})" for r in runs)
    return (f"{pair}: {len(runs)} tuning run(s) failed or ran out of memory (a sweep retries each once): {ids}. "
            "Each counts as a rise of the loss, so the choice was made without those points (missing_points in the "
            "tuned file); fix the failure and rerun the sweep with --retry-failed to fill them")


def lost_tuning_points(sweep_dir: str | os.PathLike[str]) -> list[str]:
    """'optimizer/size: run_id (status), ...' for every tuned-file entry with ``missing_points``, for the report."""
    data = read_yaml_or_empty(Path(sweep_dir) / TUNED_FILE)
    return [f"{o}/{s}: " + ", ".join(f"{p.get('run_id')} ({p.get('status')})" for p in e["missing_points"])
            for o, sizes in (data or {}).items() if isinstance(sizes, dict)
            for s, e in sizes.items() if isinstance(e, dict) and e.get("missing_points")]


def _group(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Records]:
    """Learning-rate grid runs by optimizer x size and multiplier; runs of a weight-decay grid are left out (their
    learning rate is the tuned one, their loss answers another question)."""
    groups: dict[tuple[str, str], Records] = {}
    for r in records:
        mult = r.get("lr_multiplier")
        if mult is None or mult == "":
            continue
        if wd_multiplier_of(r) is not None:
            continue
        groups.setdefault((str(r["optimizer"]), str(r["model_size"])), {}).setdefault(float(mult), []).append(r)
    if not groups:
        raise OptBenchError("no runs with an lr_multiplier found: tune needs a sweep whose matrix has "
                            "lr_multipliers (e.g. recipes/sweeps/tune_cpu.yaml), or a sweep with a 'tune:' section.")
    return groups


def _one_value(runs: Sequence[Mapping[str, Any]], key: str, where: str) -> float | None:
    """The one ``key`` (learning_rate) the runs of one grid point used; mixed values are an error."""
    values = {float(r[key]) for r in runs if r.get(key) is not None}
    if len(values) > 1:
        raise OptBenchError(f"{where}: its runs used {key} {sorted(values)}; expected one. Were runs of different "
                            "sweeps mixed in this directory?")
    return values.pop() if values else None


def _rounded(score: float) -> float | None:
    return round(score, 6) if math.isfinite(score) else None


def select_best(records: Sequence[Mapping[str, Any]], metric: str = TUNING_METRIC
                ) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """({optimizer: {model_size: {learning_rate, multiplier, tuning_loss, curve, bracketed}}}, warnings) from run
    records with ``optimizer``, ``model_size``, ``lr_multiplier``, ``status``, ``learning_rate`` and ``metric`` (a
    column or in ``_summary``). ``curve`` is the mean ``metric`` of every multiplier (None where a seed failed).
    A grid by hand (``hf-optbench tune``): a best at its edge is warned about, not extended."""
    best: dict[str, dict[str, dict[str, Any]]] = {}
    warnings: list[str] = []
    for (opt, size), by_mult in sorted(_group(records).items()):
        scores = {m: score_runs(runs, metric) for m, runs in by_mult.items()}
        choice = choose(scores)
        if choice is None:
            warnings.append(f"{opt}/{size}: every multiplier has a diverged or failed seed; nothing written")
            continue
        lr = _one_value(by_mult[choice], "learning_rate", f"{opt}/{size} x{choice:g}")
        if lr is None:
            raise OptBenchError(f"{opt}/{size} x{choice:g}: its runs record no learning_rate in summary.json.")
        bracketed = is_bracketed(list(by_mult), choice)
        if len(by_mult) > 1 and not bracketed:
            warnings.append(f"{opt}/{size}: best multiplier x{choice:g} is at the edge of the grid "
                            f"{sorted(by_mult)}; widen lr_multipliers")
        curve = [{"multiplier": m, "learning_rate": _one_value(by_mult[m], "learning_rate", f"{opt}/{size} x{m:g}"),
                  "tuning_loss": _rounded(scores[m])} for m in sorted(by_mult)]
        best.setdefault(opt, {})[size] = {"learning_rate": lr, "multiplier": choice, "bracketed": bracketed,
                                          "tuning_loss": round(scores[choice], 6), "metric": metric, "curve": curve}
        lost = [r for m in sorted(by_mult) for r in by_mult[m] if r.get("status") in LOST_STATUSES]
        if lost:
            best[opt][size]["missing_points"] = _missing_points(lost)
            warnings.append(_missing_warning(f"{opt}/{size}", lost))
    return best, warnings


def write_tuned(best: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str | os.PathLike[str],
                source: str, warnings: Sequence[str] = (), *, provenance: Mapping[str, Any] | None = None,
                merge: bool = True) -> Path:
    """Write the tuned-values YAML; each entry gets ``source`` and ``provenance`` (tuning dir, grid, seeds).
    ``merge``: keep the other optimizers/sizes of an existing file (``hf-optbench tune``); a sweep's own file is
    written whole."""
    out = Path(path)
    data: dict[str, Any] = {}
    if merge and out.is_file():
        data = load_yaml_mapping(out, "the existing tuned-values file", "Choose another --output.", empty_ok=True)
    for opt, sizes in best.items():
        for size, entry in sizes.items():
            data.setdefault(opt, {})[size] = {**copy.deepcopy(dict(entry)), **copy.deepcopy(dict(provenance or {})),
                                              "source": source}  # copies: no YAML anchors between entries
    header = ["# Tuned hyperparameters (hf-optbench): per optimizer and size, the grid multiplier with the best mean",
              f"# {TUNING_METRIC} (a held-out split, not the reported eval split); a multiplier with a diverged or",
              f"# failed seed loses. {source}", "# Use: --tuned_hparams_file " + str(out)]
    header += [f"# warning: {w}" for w in warnings]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "\n".join(header) + "\n" + dump_yaml(data))
    return out


def _source(tuning_dir: Path, grid: Sequence[float], seeds: Sequence[int], metric: str,
            spec: TuneSpec | None = None) -> str:
    """One line of provenance for every entry: where, when, which grid (and how it may grow), selected by what."""
    text = (f"tuned by {tuning_dir} on {_dt.date.today().isoformat()}: learning-rate grid {grid_text(grid)[1:-1]} "
            "of the cited default")
    if spec is not None:
        text += (f", extended in x{spec.lr_step:g} steps beyond an edge holding the best (at most "
                 f"{spec.max_extensions}); then, for optimizers marked tune_weight_decay, weight decay at the tuned "
                 f"rate: {grid_text(spec.wd_multipliers)[1:-1]} of the cited value, extended in x{spec.wd_step:g} "
                 "steps")
    return text + f"; best mean {metric} over seeds {list(seeds)}"


def tune(sweep_dir: str | os.PathLike[str], output: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    """Select the best multipliers of a tuning sweep's runs and write them to ``output``; (path, warnings)."""
    from hf_optbench.study.records import load_runs

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


def _lr_entry(plan: TuningPlan, pair: PairPlan) -> dict[str, Any]:
    """The learning-rate part of one entry: the best, its grid with every extension, the curve, bracketed."""
    o, s, lr = pair.optimizer, pair.size, pair.lr
    assert lr.best is not None

    def rate(m: float) -> float | None:
        return _one_value(plan.at(o, s, m), "learning_rate", f"{o}/{s} x{m:g}")

    value = rate(lr.best)
    if value is None:
        raise OptBenchError(f"{o}/{s} x{lr.best:g}: its runs record no learning_rate in summary.json.")
    return {"learning_rate": value, "multiplier": lr.best, "tuning_loss": _rounded(lr.scores[lr.best]),
            "grid": lr.grid, "extensions": lr.extensions, "lr_bracketed": lr.bracketed,
            "curve": [{"multiplier": m, "learning_rate": rate(m), "tuning_loss": _rounded(lr.scores[m])}
                      for m in lr.grid]}


def _entry(plan: TuningPlan, pair: PairPlan) -> tuple[dict[str, Any] | None, list[str]]:
    """(entry of the tuned file or None, warnings) of one optimizer x size: never an unbracketed optimum silently."""
    o, s = pair.optimizer, pair.size
    if pair.lr.best is None:
        return None, [f"{o}/{s}: {pair.lr.note}; nothing written"]
    entry = {**_lr_entry(plan, pair), "metric": plan.metric, "bracketed": pair.bracketed}
    warnings = [] if pair.lr.bracketed else [f"{o}/{s}: {pair.lr.note}; the comparison uses it (bracketed: false)"]
    lost = [r for lr, wd in pair.points() for r in plan.at(o, s, lr, wd) if r.get("status") in LOST_STATUSES]
    if lost:
        entry["missing_points"] = _missing_points(lost)
        warnings.append(_missing_warning(f"{o}/{s}", lost))
    if pair.wd_note:
        entry["wd_not_tuned"] = pair.wd_note.split(": ", 1)[1]
        warnings.append(pair.wd_note)
    wd = pair.wd
    if wd is not None and wd.best is not None:
        entry.update(weight_decay=weight_decay_at(o, s, wd.best), wd_multiplier=wd.best, wd_grid=wd.grid,
                     wd_extensions=wd.extensions, wd_bracketed=wd.bracketed, tuning_loss=_rounded(wd.scores[wd.best]),
                     wd_curve=[{"multiplier": w, "weight_decay": weight_decay_at(o, s, w),
                                "tuning_loss": _rounded(wd.scores[w])} for w in wd.grid])
        if not wd.bracketed:
            warnings.append(f"{o}/{s}: {wd.note}; the comparison uses it (bracketed: false)")
    return entry, warnings


def _check_unchanged(spec: SweepSpec, best: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    """A selection that differs from the file the comparison runs already used is an error (those runs would no
    longer match the file)."""
    old = (load_yaml_mapping(spec.tuned_file, "tuned_hparams_file", "Move it aside to tune again.", empty_ok=True)
           if spec.tuned_file.is_file() else None)
    changed = [f"{o}/{s} {key}" for o, sizes in best.items() for s, e in sizes.items()
               for key in ("learning_rate", "weight_decay")
               if isinstance(old, dict) and (old.get(o) or {}).get(s, {}).get(key) not in (None, e.get(key))]
    if changed and spec.runs_dir.is_dir() and any(spec.runs_dir.iterdir()):
        raise OptBenchError(
            f"the tuning phase now selects other values for {', '.join(changed)} than {spec.tuned_file} held when "
            f"the comparison runs in {spec.runs_dir} started. Move that directory aside (or use another --output-dir) "
            "to compare at the new values; nothing was overwritten.")


def tune_phase(spec: SweepSpec) -> tuple[Path, list[str]]:
    """After a sweep's tuning phase (every extension run: :func:`~hf_optbench.study.tuning_grid.extend_tuning`
    adds none): select, check that every compared optimizer x size has a value (OptBenchError otherwise: never a
    silent fallback to the citation), and write ``spec.tuned_file``."""
    from hf_optbench.study.records import load_runs

    assert spec.tuning is not None and spec.tune is not None
    plan = plan_tuning(spec, load_runs(spec.tuning.output_dir))
    unfinished = [f"{p.optimizer}/{p.size}" for p in plan.pairs if not p.done]
    if unfinished:
        raise OptBenchError(f"the tuning of {', '.join(unfinished)} is not finished (runs of its grid have not run): "
                            "start the sweep again, it continues where it stopped.")
    best: dict[str, dict[str, dict[str, Any]]] = {}
    warnings: list[str] = []
    for pair in plan.pairs:
        entry, notes = _entry(plan, pair)
        warnings += notes
        if entry is not None:
            best.setdefault(pair.optimizer, {})[pair.size] = entry
    missing = sorted({f"{r.optimizer}/{r.model_size}" for r in spec.runs
                      if "learning_rate" not in best.get(r.optimizer, {}).get(r.model_size, {})})
    if missing:
        raise OptBenchError(
            f"the tuning phase found no usable learning rate for {', '.join(missing)} (every multiplier of the grid "
            f"and its extensions diverged, failed or did not run; see {spec.tuning.output_dir}/summary.csv), so the "
            "comparison does not start. Lower tune.lr_multipliers or raise tune.max_extensions, or fix the failures "
            "and rerun with --retry-failed.")
    _check_unchanged(spec, best)
    provenance = {"tuning_dir": str(spec.tuning.output_dir), "seeds": spec.tune.seeds}
    source = _source(spec.tuning.output_dir, spec.tune.multipliers, spec.tune.seeds, spec.tune.metric, spec.tune)
    return write_tuned(best, spec.tuned_file, source, warnings, provenance=provenance, merge=False), warnings
