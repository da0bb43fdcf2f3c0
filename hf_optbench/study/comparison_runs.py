"""Runs a sweep's comparison phase adds beyond its matrix, each decided from runs that have finished:

* **the ladder's extension** (:func:`ladder_additions`): while a compared run ends below its seed's ladder curve at
  the top rung (its speedup would only be a bound), every seed of that size gets a baseline run at twice the top
  budget, up to the ladder's cap (``ladder.max_multiple``); the tuning phase first tunes that rung's own rate
  (``study.tuning``), so the new rung is as tuned as the others. The rule is ``study.budget.ladder_multiples``.
* **the attribution runs** (:func:`attribution_phase`): part of Muon's speedup can come from its embeddings, head,
  gains and biases training at Muon's own (4-8x AdamW's) rate. For every compared optimizer with
  a tuned non-matrix group other than the baseline, the same runs (same seeds, same tuned matrix rate) with that
  group at the *baseline's* tuned rate, in ``<output_dir>/attribution`` with their own tuned file. The report puts
  their speedup beside the fully tuned one: how much of the advantage is the matrix optimizer's.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_optbench.optim.adamw import NONMATRIX_KEY
from hf_optbench.rundir import BASELINE
from hf_optbench.study import budget as budgets
from hf_optbench.study.sweep_spec import (
    RunSpec,
    SweepSpec,
    _expand,
    attach_tuned_file,
    tuned_file_name,
    validate_runs,
)
from hf_optbench.study.tracking_env import tracker_env
from hf_optbench.study.tuning_phase import ATTRIBUTION_DIR, compared_records, write_tuned
from hf_optbench.yaml_file import read_yaml_or_empty

ATTRIBUTION_FILE = "tuned_hparams_attribution.yaml"


# ------------------------------------------------------------------------------------------ the ladder
def ladder_additions(spec: SweepSpec, say: Callable[[str], None]) -> list[RunSpec]:
    """The baseline's runs at every ladder rung the extension rule calls for that ``spec.runs`` does not hold yet
    (every comparison seed of the size), validated; say each decision. The tuning phase picks up the new rung from
    the same rule (``tuning_phase.setups``) once the planner (``study.sweep_plan``) has added them to the spec.
    Returns them (none: the ladder is done) and changes nothing."""
    if spec.ladder is None:
        return []
    records = compared_records(spec)
    known = {r.run_id for r in spec.runs}
    seeds = sorted({r.seed for r in spec.runs if r.phase == "compare"})
    added: list[RunSpec] = []
    for size, tpp in dict.fromkeys((r.model_size, r.budget_tpp) for r in spec.runs):
        mults = budgets.ladder_multiples(spec.ladder, size, records, tpp)
        new_mults = [m for m in mults if m not in spec.ladder.multiples]
        scratch = dataclasses.replace(spec, runs=[], ladder=budgets.Ladder(tuple(new_mults) or (1.0,),
                                                                            spec.ladder.optimizer))
        if not new_mults:
            continue
        _expand(scratch, optimizers=[spec.ladder.optimizer], sizes=[size], seeds=seeds, mults=[], ratios=[tpp])
        new = [r for r in scratch.runs if r.budget_multiple is not None and r.run_id not in known]
        if new:
            top = _top_tokens(records, spec.ladder.optimizer, size, max(new_mults) / 2, tpp)
            beaten = budgets.beats_top(records, spec.ladder.optimizer, size, top, tpp)
            where = size if tpp is None else f"{size} at {tpp:g} tokens/param"
            say(f"{where}: {', '.join(beaten) or 'a compared run'} beat the ladder's top rung: adding "
                f"x{max(new_mults):g} (cap x{spec.ladder.cap:g})")
        added += new
    if added:
        scratch = dataclasses.replace(spec, runs=added, tuning=None)
        attach_tuned_file(scratch)
        if spec.launcher.get("validate", True):
            validate_runs(scratch)
    return added


def _top_tokens(records: list[dict[str, Any]], baseline: str, size: str, multiple: float,
                tpp: float | None = None) -> float:
    tokens = [budgets.budget_tokens(r) or 0.0 for r in records if r.get("optimizer") == baseline
              and r.get("model_size") == size and r.get("budget_tpp") == tpp
              and float(r.get("budget_multiple") or 1.0) == multiple]
    return max(tokens, default=0.0)


# ------------------------------------------------------------------------------------- the attribution runs
def _attributed(spec: SweepSpec, tuned: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """{optimizer: {size: entry}}: each compared optimizer's tuned entry with its non-matrix group's ratio set so
    that the group trains at the baseline's tuned rate for it (learning_rate x ratio of the baseline)."""
    from hf_optbench.optim.registry import OPTIMIZERS

    baseline = spec.ladder.optimizer if spec.ladder is not None else BASELINE
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for opt in dict.fromkeys(r.optimizer for r in spec.runs):
        registered = OPTIMIZERS.get(opt)
        if opt == baseline or registered is None or NONMATRIX_KEY not in registered.kwargs:
            continue
        for size, entry in (tuned.get(opt) or {}).items():
            base = (tuned.get(baseline) or {}).get(size)
            if not isinstance(entry, dict) or NONMATRIX_KEY not in entry or not isinstance(base, dict):
                continue
            base_rate = float(base["learning_rate"]) * float(base.get(NONMATRIX_KEY, 1.0))
            new = {k: copy.deepcopy(v) for k, v in entry.items() if k in ("learning_rate", "weight_decay")}
            new.update({NONMATRIX_KEY: float(f"{base_rate / float(entry['learning_rate']):.6g}"),
                        "nonmatrix_lr": base_rate, "tuned_nonmatrix_lr": entry.get("nonmatrix_lr"),
                        "attribution": f"{opt}'s tuned matrix rate; its non-matrix group at {baseline}'s tuned rate"})
            out.setdefault(opt, {})[str(size)] = new
    return out


def attribution_phase(spec: SweepSpec) -> SweepSpec | None:
    """The attribution runs as a phase of their own (``<output_dir>/attribution``), reading
    ``attribution/tuned_hparams_attribution.yaml`` (written here from the sweep's tuned file; one per data ratio in a
    sweep with several, as the tuned files are); None when no compared optimizer has a tuned non-matrix group."""
    if spec.tune is None:
        return None
    out = spec.output_dir / ATTRIBUTION_DIR
    files: dict[float | None, tuple[Path, dict[str, dict[str, dict[str, Any]]]]] = {}
    for tpp in dict.fromkeys(r.budget_tpp for r in spec.runs):
        tuned = spec.tuned_file_for(tpp)
        attributed = _attributed(spec, read_yaml_or_empty(tuned)) if tuned.is_file() else {}
        if attributed:
            path = out / tuned_file_name(tpp, ATTRIBUTION_FILE)
            write_tuned(attributed, path, f"attribution runs of {spec.output_dir}: {tuned.name}'s values, each "
                        "optimizer's non-matrix group at the baseline's tuned rate", merge=False)
            files[tpp] = (path, attributed)
    if not files:
        return None
    runs = []
    phase = dataclasses.replace(spec, output_dir=out, name=f"{spec.name}-attribution", runs=[], tuning=None,
                                tune=None, ladder=None)
    for run in spec.runs:
        path, attributed = files.get(run.budget_tpp, (None, {}))
        if path is None or run.optimizer not in attributed or run.model_size not in attributed[run.optimizer] \
                or run.budget_multiple is not None:
            continue
        args = [str(path) if i and run.args[i - 1] == "--tuned_hparams_file" else a for i, a in enumerate(run.args)]
        if "--tuned_hparams_file" not in args:
            args += ["--tuned_hparams_file", str(path)]
        new = dataclasses.replace(run, args=args, phase="attribution")
        new.env = tracker_env(phase, new)
        runs.append(new)
    phase.runs = runs
    if spec.launcher.get("validate", True):
        validate_runs(phase)
    return phase


def attribution_dir(sweep_dir: str | Path) -> Path | None:
    """A sweep directory's attribution runs, where it has them (for the report)."""
    d = Path(sweep_dir) / ATTRIBUTION_DIR
    return d if (d / "runs").is_dir() else None
