"""The second tuning draw's runs (the sweep file's side, ``tune.second_draw``, is :mod:`hf_optbench.study.second_draw`).

After the comparison, in ``<output_dir>/second_draw/``:

* ``tuning/``: the drawn cells' whole tuning protocol again at the draw's seed (:func:`draw_spec`): the same grids,
  extensions, later axes and ladder rungs (the main sweep's, extensions included: ``SweepSpec.ladder_dir``), decided
  by the same rule (``study.tuning_phase.tuning_additions``), so the only difference from the main tuning is its seed;
* ``tuned_hparams[__tpp<ratio>].yaml``: its selection, written like the main one (``study.tuning_phase.tune_phase``);
* ``runs/``: only the comparison and ladder runs whose tuned values the draw changed (:func:`draw_comparison`), under
  the main run's id and seed, reading the draw's tuned file. A run whose values did not change is not run again: at
  the same values and seed it repeats the main run (CPU kernels with one thread are deterministic), so the report
  reads the main run in its place and the shift it makes is exactly 0;
* :data:`CHANGES_FILE`: which tuned values changed, per optimizer, cell and ladder rung, and which runs ran again.

Cost: per drawn cell, its tuning runs once more (every tuning run of the cell, at one seed) and, per changed pick,
the compared seeds of that optimizer (or that ladder rung). The report (``report.sections.tuning_noise``) composes
each drawn cell's comparison from the main runs and these, and states the shift.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.optim.adamw import NONMATRIX_KEY
from hf_optbench.rundir import TUNING_DIR, write_json_atomic
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, _expand, resolve_grid, validate_runs
from hf_optbench.study.tracking_env import tracker_env
from hf_optbench.study.tuning import TuneSpec

DRAW_DIR = "second_draw"
CHANGES_FILE = "second_draw.json"
# The tuned values a run takes from its tuned file (optim.tuned.lookup_tuned): a run whose values are equal under
# both files trains exactly as the main run did.
RUN_KEYS = ("learning_rate", "weight_decay", NONMATRIX_KEY)


def draw_dir(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / DRAW_DIR


def draw_tune(spec: SweepSpec) -> TuneSpec:
    """The draw's ``tune:`` section: the main one at the draw's seed (its only difference from the main tuning)."""
    assert spec.second_draw is not None and spec.tune is not None
    return dataclasses.replace(spec.tune, seeds=[spec.second_draw.seed])


def draw_spec(spec: SweepSpec) -> SweepSpec:
    """The second draw as a sweep of its own in ``<output_dir>/second_draw``: its tuning phase holds the drawn
    cells' initial grids at the draw's seed (every optimizer of the matrix), its tune section the main one at that
    seed, its rungs the main sweep's (``ladder_dir``); no comparison runs until its tuned file exists
    (:func:`draw_comparison`). Its tuning runs are resolved (and validated, as the sweep's are) here."""
    assert spec.second_draw is not None and spec.tune is not None and spec.tuning is not None
    out = draw_dir(spec.output_dir)
    seed = spec.second_draw.seed
    tuning = dataclasses.replace(spec.tuning, output_dir=out / TUNING_DIR, name=f"{spec.name}-second-draw-tuning",
                                 runs=[], current=set())
    optimizers = list(dict.fromkeys(r.optimizer for r in spec.tuning.runs))
    for size, tpp in spec.second_draw.cells:
        _expand(tuning, optimizers, [size], [seed], spec.tune.multipliers, phase="tune", ratios=[tpp])
    (validate_runs if spec.launcher.get("validate", True) else resolve_grid)(tuning)
    return dataclasses.replace(spec, output_dir=out, name=f"{spec.name}-second-draw", runs=[], tuning=tuning,
                               tune=draw_tune(spec), second_draw=None,
                               ladder_dir=spec.output_dir, current=set())


def _steps(run: RunSpec) -> int | None:
    """The run's max_steps (validated runs hold it; else its last --max_steps argument): a ladder rung's tuned rate
    is found by it."""
    if run.max_steps is not None:
        return run.max_steps
    given = [run.args[i + 1] for i, a in enumerate(run.args[:-1]) if a == "--max_steps"]
    return int(given[-1]) if given else None


def run_values(path: Path, run: RunSpec) -> dict[str, Any]:
    """The tuned values ``run`` reads from the tuned file ``path`` (its rung's, for a ladder run)."""
    from hf_optbench.optim.tuned import lookup_tuned

    found = lookup_tuned(str(path), run.optimizer, run.model_size, _steps(run)) if path.is_file() else {}
    return {k: found[k] for k in RUN_KEYS if k in found}


def _with_file(run: RunSpec, path: Path) -> list[str]:
    """The run's arguments reading ``path`` as its tuned file."""
    args = [a for i, a in enumerate(run.args)
            if a != "--tuned_hparams_file" and not (i and run.args[i - 1] == "--tuned_hparams_file")]
    return args + ["--tuned_hparams_file", str(path)]


def draw_comparison(spec: SweepSpec, draw: SweepSpec, say: Callable[[str], None]) -> list[RunSpec]:
    """After the draw's tuned file is written: the main sweep's comparison and ladder runs at the drawn cells whose
    tuned values the draw changed (each reading the draw's file), validated; write :data:`CHANGES_FILE` and say what
    changed. Returns those runs, the draw's comparison, and changes neither spec: the planner
    (``study.sweep_plan``) sets them as ``draw.runs``."""
    assert spec.second_draw is not None
    changed: dict[tuple[str, str, float | None, float | None], dict[str, Any]] = {}
    runs: list[RunSpec] = []
    for run in spec.runs:
        if not spec.second_draw.includes(run.model_size, run.budget_tpp):
            continue
        before = run_values(spec.tuned_file_for(run.budget_tpp), run)
        after = run_values(draw.tuned_file_for(run.budget_tpp), run)
        if before == after:
            continue
        key = (run.optimizer, run.model_size, run.budget_tpp, run.budget_multiple)
        changed.setdefault(key, {"optimizer": run.optimizer, "model_size": run.model_size,
                                 "tokens_per_param": run.budget_tpp, "budget_multiple": run.budget_multiple,
                                 "main": before, "second_draw": after, "runs": []})["runs"].append(run.run_id)
        new = dataclasses.replace(run, args=_with_file(run, draw.tuned_file_for(run.budget_tpp)))
        new.env = tracker_env(draw, new)
        runs.append(new)
    if runs and spec.launcher.get("validate", True):
        validate_runs(dataclasses.replace(draw, runs=runs, tuning=None))
    for c in changed.values():
        say(f"{_where(c)}: {_change_text(c)}: {len(c['runs'])} run(s) again")
    if not changed:
        say("no tuned value changed at any drawn cell: every shift is exactly 0 (no comparison run again)")
    write_json_atomic(draw.output_dir / CHANGES_FILE, {
        "schema": 1, "seed": spec.second_draw.seed, "tuning_seeds": list(spec.tune.seeds if spec.tune else []),
        "cells": [{"model_size": s, "tokens_per_param": t} for s, t in spec.second_draw.cells],
        "changed": list(changed.values())})
    return runs


def _where(change: dict[str, Any]) -> str:
    tpp, dx = change["tokens_per_param"], change["budget_multiple"]
    return (f"{change['optimizer']}/{change['model_size']}" + ("" if tpp is None else f" at {tpp:g} tokens/param")
            + ("" if dx is None else f", ladder rung x{dx:g}"))


def _change_text(change: dict[str, Any]) -> str:
    """"learning_rate 0.004 -> 0.002, nonmatrix_lr_ratio 2 -> 1"."""
    a, b = change["main"], change["second_draw"]
    return ", ".join(f"{k} {a.get(k, '–'):g} -> {b.get(k, '–'):g}" if isinstance(a.get(k), float | int)
                     and isinstance(b.get(k), float | int) else f"{k} {a.get(k, '–')} -> {b.get(k, '–')}"
                     for k in RUN_KEYS if a.get(k) != b.get(k))


def change_lines(changes: Sequence[dict[str, Any]]) -> list[str]:
    """One line per changed pick of a :data:`CHANGES_FILE` (for the report)."""
    return [f"{_where(c)}: {_change_text(c)}" for c in changes]
