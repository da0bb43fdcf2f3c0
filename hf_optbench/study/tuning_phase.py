"""A sweep's tuning phase and what it writes: the runs the tuning rule asks for next (:func:`tuning_additions`), and the
tuned-values file, written by one function (:func:`write_tuned`) for the sweep (:func:`tune_phase`) and for
``hf-optbench tune`` (:func:`tune`) alike, from one selection (:func:`entries`).

The rule itself (grids, bracketing, noise, the axes' order) is :mod:`hf_optbench.study.tuning`. By hand (no
extension, no confirmation: a plain grid, its edges only warned about)::

    hf-optbench sweep recipes/sweeps/tune_cpu.yaml          # matrix.lr_multipliers: [0.25, 0.5, 1, 2, 4]
    hf-optbench tune runs/tune_cpu --output tuned_hparams.yaml
    hf-optbench run recipes/quickstart_cpu.yaml --tuned_hparams_file tuned_hparams.yaml

``hf-optbench tune SWEEP/tuning`` on a sweep with a ``tune:`` section replays that sweep's own rule (its ``tune:``
section from the sweep's manifest) and writes what the sweep wrote.

File format (read by ``hf_optbench.optim.tuned.lookup_tuned``; keys beyond the hyperparameters are provenance)::

    muon:
      mini: {learning_rate: 0.016, multiplier: 16.0, tuning_loss: 2.39, metric: final_tuning_loss,
             grid: [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], extensions: [32.0], lr_bracketed: true,
             curve: [{multiplier: 1.0, learning_rate: 0.001, tuning_loss: 2.6, seeds: 1}, ...],
             lr_margin: 0.0024, lr_noise: 0.0036, lr_seeds: [0, 1000, 1001], lr_within_noise: true,
             nonmatrix_lr_ratio: 0.25, nonmatrix_lr: 0.004, nonmatrix_grid: [0.125, 0.25, 0.5, 1.0, 2.0],
             nonmatrix_curve: [{ratio: 0.125, nonmatrix_lr: 0.002, tuning_loss: 2.385, seeds: 1}, ...],
             nonmatrix_bracketed: true, nonmatrix_margin: 0.004, nonmatrix_noise: 0.0036, nonmatrix_seeds: [0],
             bracketed: true, seeds: [0], tuning_dir: runs/cpu_demo/tuning, source: "tuned by ..."}
    adamw:
      mini: {..., ladder: [{budget_multiple: 4.0, max_steps: 928, learning_rate: 0.002, multiplier: 2.0,
                            grid: [1.0, 2.0, 4.0, 8.0], curve: [...], bracketed: true, margin: ..., noise: ...}]}

``tuning_loss`` is the compared budget's best point's; ``bracketed`` is false when a best point (any axis, any rung)
is still at an edge after ``tune.max_extensions``; ``wd_not_tuned`` / ``nonmatrix_not_tuned`` say why an axis the
optimizer could tune was not; ``missing_points`` lists runs lost to failures.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.adamw import NONMATRIX_KEY
from hf_optbench.rundir import (
    LOST_STATUSES,
    MANIFEST_FILE,
    RUNS_DIR,
    TUNED_FILE,
    portable_path,
    run_id_for,
    write_text_atomic,
)
from hf_optbench.study import budget as budgets
from hf_optbench.study.sweep_spec import (
    RunSpec,
    SweepSpec,
    _expand,
    resolve_grid,
    tuned_file_name,
    validate_runs,
)
from hf_optbench.study.tracking_env import tracker_env
from hf_optbench.study.tuning import (
    Axis,
    Coords,
    PairPlan,
    PairSetup,
    TuneSpec,
    TuningPlan,
    grid_text,
    plan_tuning,
    weight_decay_at,
)
from hf_optbench.yaml_file import dump_yaml, load_yaml_mapping, read_yaml_or_empty

# A tuning run that ended LOST (after the sweep's one retry) says nothing about its rate, yet its point counts as a
# rise of the loss: the tuned file lists it under ``missing_points`` and the report repeats it.
# The first line of every tuned file this module writes: `hf-optbench tune --output` merges into such a file and
# refuses any other (a recipe given as --output would otherwise be rewritten).
HEADER = "# Tuned hyperparameters (hf-optbench)"
# Where a sweep runs the attribution runs (Muon with its non-matrix group at the baseline's tuned rate), and the
# tuned file they read (study.comparison_runs).
ATTRIBUTION_DIR = "attribution"


# ------------------------------------------------------------------------------------------- the sweep's runs
def _sets(recipe: Mapping[str, Any], args: Sequence[str], key: str) -> bool:
    return key in recipe or any(a == f"--{key}" or a.startswith(f"--{key}=") for a in args)


def _user_kwargs(recipe: Mapping[str, Any], args: Sequence[str]) -> dict[str, Any]:
    """The optimizer_kwargs a run's recipe and arguments set (the last --optimizer_kwargs wins, as in argparse)."""
    from hf_optbench.config.optim_args import parse_json_mapping

    text = recipe.get("optimizer_kwargs")
    for i, a in enumerate(args[:-1]):
        if a == "--optimizer_kwargs":
            text = args[i + 1]
    return parse_json_mapping("optimizer_kwargs", text)


def setups(spec: SweepSpec) -> list[PairSetup]:
    """Every optimizer x size's axes beyond the learning rate, from the sweep file, its base recipe and the
    registry; the baseline's rungs include the ladder's extensions so far (:func:`ladder_multiples`)."""
    from hf_optbench.config.parse import load_recipe
    from hf_optbench.optim.registry import OPTIMIZERS, resolve_optimizer_name

    assert spec.tuning is not None and spec.tune is not None
    recipe = load_recipe(spec.base)
    compared = compared_records(spec) if spec.ladder is not None else []
    out = []
    for opt, size, tpp in dict.fromkeys((r.optimizer, r.model_size, r.budget_tpp) for r in spec.tuning.runs):
        args = next(r.args for r in spec.tuning.runs if r.optimizer == opt and r.model_size == size)
        try:
            registered = OPTIMIZERS.get(resolve_optimizer_name(opt))
        except OptBenchError:
            registered = None
        wd = bool(registered and registered.tune_weight_decay)
        nm = bool(registered and NONMATRIX_KEY in registered.kwargs and spec.tune.nonmatrix_multipliers)
        wd_note = nm_note = ""
        if wd and _sets(recipe, args, "weight_decay"):
            wd, wd_note = False, (f"{opt}/{size}{_at(tpp)}: weight decay not tuned: the sweep or its base recipe sets "
                                  "weight_decay, which would replace a tuned value; remove it to tune it")
        if nm and NONMATRIX_KEY in _user_kwargs(recipe, args):
            nm, nm_note = False, (f"{opt}/{size}{_at(tpp)}: the non-matrix group's rate not tuned: optimizer_kwargs sets "
                                  f"{NONMATRIX_KEY}; remove it to tune it")
        rungs = tuple(m for m in budgets.ladder_multiples(spec.ladder, size, compared, tpp) if m != 1.0) \
            if spec.ladder is not None and opt == spec.ladder.optimizer else ()
        out.append(PairSetup(opt, size, wd, nm, rungs, wd_note, nm_note, tpp))
    return out


def compared_records(spec: SweepSpec) -> list[dict[str, Any]]:
    """The finished and unfinished runs of the comparison (and of its attribution runs, :data:`ATTRIBUTION_DIR`),
    as the ladder's extension reads them."""
    from hf_optbench.study.records import load_runs

    root = spec.ladder_dir or spec.output_dir  # a second tuning draw tunes the main sweep's rungs
    out = load_runs(root) if (root / RUNS_DIR).is_dir() else []
    attribution = root / ATTRIBUTION_DIR
    if (attribution / "runs").is_dir():  # named apart: the same ids as the compared runs
        out += [{**r, "run_id": f"{ATTRIBUTION_DIR}/{r['run_id']}"} for r in load_runs(attribution)]
    return out


def _with_kwargs(args: list[str], extra: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[str]:
    """``args`` with ``extra`` merged into the optimizer_kwargs they already give (one flag, the last one wins)."""
    merged = {**_user_kwargs(recipe, args), **extra}
    out = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--optimizer_kwargs" and i + 1 < len(args):
            skip = True
            continue
        out.append(a)
    return out + ["--optimizer_kwargs", json.dumps(merged, sort_keys=True)]


def _point_runs(spec: SweepSpec, opt: str, size: str, point: Coords, seeds: Sequence[int],
                tpp: float | None = None) -> list[RunSpec]:
    """The tuning runs of one point (at data ratio ``tpp``) at ``seeds``, made as the initial grid's are
    (``_expand``), then given the point's weight decay, group ratio and budget."""
    from hf_optbench.config.parse import load_recipe
    assert spec.tuning is not None
    scratch = dataclasses.replace(spec.tuning, runs=[])
    _expand(scratch, optimizers=[opt], sizes=[size], seeds=list(seeds), mults=[point.lr], phase="tune", ratios=[tpp])
    if point.wd is None and point.nm is None and point.dx is None:
        return scratch.runs
    recipe = load_recipe(spec.base) if point.nm is not None else {}
    runs = []
    for run in scratch.runs:
        rid = run_id_for(opt, size, run.seed, run.lr_multiplier, wd_multiplier=point.wd,
                         nonmatrix_multiplier=point.nm, budget_multiple=point.dx, budget_tpp=tpp)
        args = [rid if i and run.args[i - 1] == "--run_name" else a for i, a in enumerate(run.args)]
        if point.wd is not None:
            args += ["--weight_decay", f"{weight_decay_at(opt, size, point.wd):g}"]
        if point.nm is not None:
            args = _with_kwargs(args, {NONMATRIX_KEY: point.nm}, recipe)
        if point.dx is not None and (size, opt, tpp) in spec.steps:
            args += ["--max_steps", str(budgets.ladder_steps(spec.steps[(size, opt, tpp)], point.dx))]
        new = dataclasses.replace(run, run_id=rid, args=args, budget_multiple=point.dx)
        new.env = tracker_env(spec.tuning, new)
        runs.append(new)
    return runs


def current_plan(spec: SweepSpec) -> TuningPlan:
    from hf_optbench.study.records import load_runs

    assert spec.tuning is not None and spec.tune is not None
    records = load_runs(spec.tuning.output_dir) if spec.tuning.output_dir.is_dir() else []
    return plan_tuning(spec.tune, setups(spec), records)


def tuning_additions(spec: SweepSpec, say: Callable[[str], None]) -> list[RunSpec]:
    """Every run the plan needs that ``spec.tuning.runs`` does not hold yet (extensions beyond an edge,
    confirmations, the later axes and the rungs, and on a restart the points an earlier sweep added), each resolved
    like the initial grid; say each decision. Returns them (none: the tuning is done) and changes nothing: the
    planner (``study.sweep_plan``) adds them to the spec."""
    assert spec.tuning is not None
    plan = current_plan(spec)
    known = {r.run_id for r in spec.tuning.runs}
    added: list[RunSpec] = []
    for pair in plan.pairs:
        new = [run for point, seeds in pair.points() for run in _point_runs(spec, pair.optimizer, pair.size, point,
                                                                              seeds, pair.tpp)
               if run.run_id not in known]
        if new and pair.points(pending=True):
            for axis, _ in pair.axes():
                if axis.pending and axis.note:
                    say(f"{pair.name}: {axis.note}")
        known |= {r.run_id for r in new}
        added += new
    if added:
        scratch = dataclasses.replace(spec.tuning, runs=added)
        (validate_runs if spec.tuning.launcher.get("validate", True) else resolve_grid)(scratch)
    return added


# ----------------------------------------------------------------------------------------- the tuned file
def _one_value(runs: Sequence[Mapping[str, Any]], key: str, where: str) -> float | None:
    """The one ``key`` (learning_rate, max_steps) the runs of one point used; mixed values are an error."""
    values = {float(r[key]) for r in runs if r.get(key) is not None}
    if len(values) > 1:
        raise OptBenchError(f"{where}: its runs used {key} {sorted(values)}; expected one. Were runs of different "
                            "sweeps mixed in this directory?")
    return values.pop() if values else None


def _rounded(score: float | None) -> float | None:
    return round(score, 6) if score is not None and math.isfinite(score) else None


def _noise_fields(axis: Axis, prefix: str) -> dict[str, Any]:
    """Beside each choice: its margin over the nearest neighbour, the seed-to-seed noise it was judged against, the
    seeds it was decided on, and whether the margin is still within the noise."""
    return {f"{prefix}margin": _rounded(axis.margin) if axis.margin is not None and math.isfinite(axis.margin)
            else ("inf" if axis.margin is not None else None),
            f"{prefix}noise": _rounded(axis.noise), f"{prefix}noise_measured_here": axis.noise_measured,
            f"{prefix}seeds": list(axis.seeds), f"{prefix}within_noise": axis.within_noise}


def _curve(axis: Axis, value: Callable[[float], dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**value(m), "tuning_loss": _rounded(axis.scores.get(m)), "seeds": len(axis.required.get(m, ()))}
            for m in axis.grid]


def _lr_part(plan: TuningPlan, pair: PairPlan) -> dict[str, Any]:
    """The learning-rate axis of one entry: the best, its grid with every extension, the curve, its noise."""
    o, s, lr = pair.optimizer, pair.size, pair.lr
    assert lr.best is not None

    def rate(m: float) -> float | None:
        return _one_value(plan.at(o, s, Coords.of(m), pair.tpp), "learning_rate", f"{pair.name} x{m:g}")

    value = rate(lr.best)
    if value is None:
        raise OptBenchError(f"{pair.name} x{lr.best:g}: its runs record no learning_rate in summary.json.")
    return {"learning_rate": value, "multiplier": lr.best, "tuning_loss": _rounded(lr.scores[lr.best]),
            "grid": lr.grid, "extensions": lr.extensions, "lr_bracketed": lr.bracketed,
            "curve": _curve(lr, lambda m: {"multiplier": m, "learning_rate": rate(m)}), **_noise_fields(lr, "lr_")}


def _wd_part(pair: PairPlan) -> dict[str, Any]:
    o, s, wd = pair.optimizer, pair.size, pair.wd
    assert wd is not None and wd.best is not None
    return {"weight_decay": weight_decay_at(o, s, wd.best), "wd_multiplier": wd.best, "wd_grid": wd.grid,
            "wd_extensions": wd.extensions, "wd_bracketed": wd.bracketed, "tuning_loss": _rounded(wd.scores[wd.best]),
            "wd_curve": _curve(wd, lambda w: {"multiplier": w, "weight_decay": weight_decay_at(o, s, w)}),
            **_noise_fields(wd, "wd_")}


def _nm_part(lr_value: float, pair: PairPlan) -> dict[str, Any]:
    nm = pair.nm
    assert nm is not None and nm.best is not None
    return {NONMATRIX_KEY: nm.best, "nonmatrix_lr": float(f"{lr_value * nm.best:.6g}"), "nonmatrix_grid": nm.grid,
            "nonmatrix_extensions": nm.extensions, "nonmatrix_bracketed": nm.bracketed,
            "tuning_loss": _rounded(nm.scores[nm.best]),
            "nonmatrix_curve": _curve(nm, lambda n: {"ratio": n, "nonmatrix_lr": float(f"{lr_value * n:.6g}")}),
            **_noise_fields(nm, "nonmatrix_")}


def _rung_part(plan: TuningPlan, pair: PairPlan, dx: float, axis: Axis) -> dict[str, Any]:
    """One ladder rung's own learning rate (``lookup_tuned`` finds it by ``max_steps``)."""
    o, s = pair.name, pair.size
    best = pair.best()
    assert best is not None

    def runs(m: float) -> list[dict[str, Any]]:
        return plan.at(pair.optimizer, s, Coords.of(m, best.wd, best.nm, dx), pair.tpp)

    entry: dict[str, Any] = {"budget_multiple": dx}
    if axis.best is not None:
        entry.update(max_steps=int(_one_value(runs(axis.best), "max_steps", f"{o} x{dx:g}") or 0),
                     learning_rate=_one_value(runs(axis.best), "learning_rate", f"{o} x{dx:g}"),
                     multiplier=axis.best, tuning_loss=_rounded(axis.scores[axis.best]))
        if best.nm is not None:
            entry[NONMATRIX_KEY] = best.nm
    entry.update(grid=axis.grid, extensions=axis.extensions, bracketed=axis.bracketed,
                 curve=_curve(axis, lambda m: {"multiplier": m, "learning_rate": _one_value(
                     runs(m), "learning_rate", f"{o} x{dx:g} x{m:g}")}), **_noise_fields(axis, ""))
    return entry


def _entry(plan: TuningPlan, pair: PairPlan) -> tuple[dict[str, Any] | None, list[str]]:
    """(entry of the tuned file or None, warnings) of one optimizer x size: never an unbracketed optimum silently."""
    o, s, name = pair.optimizer, pair.size, pair.name
    if pair.lr.best is None:
        return None, [f"{name}: {pair.lr.note or 'every learning rate diverged or failed'}; nothing written"]
    entry = {**_lr_part(plan, pair), "metric": plan.metric, "bracketed": pair.bracketed}
    warnings = []
    for axis, _ in pair.axes():
        if not axis.bracketed:
            warnings.append(f"{name}: {axis.note or f'best {axis.name} not bracketed'}; the comparison uses it "
                            "(bracketed: false)")
    lost = [r for point, _ in pair.points() for r in plan.at(o, s, point, pair.tpp)
            if r.get("status") in LOST_STATUSES]
    if lost:
        entry["missing_points"] = _missing_points(lost)
        warnings.append(_missing_warning(name, lost))
    for key, note in (("wd_not_tuned", pair.setup.wd_note), ("nonmatrix_not_tuned", pair.setup.nm_note)):
        if note:
            entry[key] = note.split(": ", 1)[1]
            warnings.append(note)
    if pair.wd is not None and pair.wd.best is not None:
        entry.update(_wd_part(pair))
    if pair.nm is not None and pair.nm.best is not None:
        entry.update(_nm_part(entry["learning_rate"], pair))
    if pair.rungs:
        entry["ladder"] = [_rung_part(plan, pair, dx, axis) for dx, axis in sorted(pair.rungs.items())]
    return entry, warnings


Selection = dict[str, dict[str, dict[str, Any]]]  # {optimizer: {size: entry}}: one tuned file's content


def entries(plan: TuningPlan) -> tuple[dict[float | None, Selection], list[str]]:
    """The one selection: {data ratio: {optimizer: {size: entry}}} (one ratio, None, in a sweep with one: one
    tuned file per ratio, ``sweep_spec.tuned_file_name``) and the warnings, of every pair of ``plan``."""
    best: dict[float | None, Selection] = {}
    warnings: list[str] = []
    for pair in plan.pairs:
        entry, notes = _entry(plan, pair)
        warnings += notes
        best.setdefault(pair.tpp, {})
        if entry is not None:
            best[pair.tpp].setdefault(pair.optimizer, {})[pair.size] = entry
    return best, warnings


def _missing_points(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tuned file's ``missing_points``: each lost run with how it ended."""
    return [{"run_id": r.get("run_id"), "status": r.get("status")} for r in runs]


def _missing_warning(pair: str, runs: Sequence[Mapping[str, Any]]) -> str:
    ids = ", ".join(f"{r.get('run_id')} ({r.get('status')})" for r in runs)
    return (f"{pair}: {len(runs)} tuning run(s) failed or ran out of memory (a sweep retries each once): {ids}. "
            "Each counts as a rise of the loss, so the choice was made without those points (missing_points in the "
            "tuned file); fix the failure and rerun the sweep with --retry-failed to fill them")


def lost_tuning_points(sweep_dir: str | os.PathLike[str]) -> list[str]:
    """'optimizer/size: run_id (status), ...' for every tuned-file entry with ``missing_points``, for the report
    (every ratio's file of a sweep with several)."""
    return [f"{o}/{s}{_at(tpp)}: " + ", ".join(f"{p.get('run_id')} ({p.get('status')})" for p in e["missing_points"])
            for tpp, path in tuned_files(sweep_dir).items()
            for o, sizes in (read_yaml_or_empty(path) or {}).items() if isinstance(sizes, dict)
            for s, e in sizes.items() if isinstance(e, dict) and e.get("missing_points")]


def _at(tpp: float | None) -> str:
    return "" if tpp is None else f" at {tpp:g} tokens/param"


def tuned_files(sweep_dir: str | os.PathLike[str], name: str = TUNED_FILE) -> dict[float | None, Path]:
    """{data ratio: tuned file} of a sweep directory: {None: tuned_hparams.yaml} for a sweep with one ratio, one per
    ratio (``tuned_hparams__tpp0.5.yaml``, ``sweep_spec.tuned_file_name``) for a sweep with several; {} when it has
    none. ``name``: another family of tuned files (the attribution runs')."""
    from hf_optbench.rundir import parse_run_id

    d = Path(sweep_dir)
    out: dict[float | None, Path] = {None: d / name} if (d / name).is_file() else {}
    stem, _, ext = name.rpartition(".")
    for path in sorted(d.glob(f"{stem}__tpp*.{ext}")):
        tpp = parse_run_id(f"x__x__s0__{path.name[len(stem) + 2:-len(ext) - 1]}").get("budget_tpp")
        if tpp is not None and path.name == tuned_file_name(tpp, name):
            out[tpp] = path
    return dict(sorted(out.items(), key=lambda kv: -1.0 if kv[0] is None else kv[0]))


def check_output(path: str | os.PathLike[str]) -> None:
    """A tuned file may replace or merge into only a tuned file this module wrote: any other existing file (a
    recipe, a sweep) is refused, before anything is selected."""
    out = Path(path)
    if out.is_dir():
        raise OptBenchError(f"--output '{out}' is a directory: name a file, e.g. {out / TUNED_FILE}.")
    if out.exists():
        try:
            first = out.read_text(encoding="utf-8").split("\n", 1)[0]
        except (OSError, UnicodeDecodeError):
            first = ""
        if not first.startswith(HEADER):
            raise OptBenchError(f"--output '{out}' exists and is not a tuned-values file hf-optbench wrote (its first "
                                f"line is not '{HEADER}...'): nothing was written. Choose another --output, e.g. "
                                f"{TUNED_FILE}, or move that file away.")


def write_tuned(best: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str | os.PathLike[str],
                source: str, warnings: Sequence[str] = (), *, provenance: Mapping[str, Any] | None = None,
                merge: bool = True) -> Path:
    """Write the tuned-values YAML, the one writer of such files; each entry gets ``source`` and ``provenance``.
    ``merge``: keep the other optimizers/sizes of an existing tuned file (``hf-optbench tune``); a sweep's own file
    is written whole. Refuses to replace a file that is not a tuned file (:func:`check_output`)."""
    out = Path(path)
    check_output(out)
    data: dict[str, Any] = {}
    if merge and out.is_file():
        data = load_yaml_mapping(out, "the existing tuned-values file", "Choose another --output.", empty_ok=True)
    for opt, sizes in best.items():
        for size, entry in sizes.items():
            data.setdefault(opt, {})[size] = {**copy.deepcopy(dict(entry)), **copy.deepcopy(dict(provenance or {})),
                                              "source": source}  # copies: no YAML anchors between entries
    header = [f"{HEADER}: per optimizer and size, each hyperparameter's best grid point by mean final_tuning_loss",
              "# (a held-out split, not the reported eval split); a point with a diverged or failed seed loses; beside "
              "each choice its", f"# margin over its neighbour and the seed-to-seed noise. {source}",
              "# Use: --tuned_hparams_file " + portable_path(out, Path.cwd())]
    header += [f"# warning: {w}" for w in warnings]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "\n".join(header) + "\n" + dump_yaml(data))
    return out


def _source(tuning_dir: str, tune: TuneSpec, seeds: Sequence[int]) -> str:
    """One line of provenance for every entry: where, when, which grids (and how they grow), selected by what."""
    text = (f"tuned by {tuning_dir} on {_dt.date.today().isoformat()}: learning-rate grid "
            f"{grid_text(tune.multipliers)[1:-1]} of the cited default, extended in x{tune.lr_step:g} steps beyond "
            f"an edge holding the best (at most {tune.max_extensions})")
    if tune.max_extensions:
        text += (f"; then weight decay {grid_text(tune.wd_multipliers)[1:-1]} (optimizers marked tune_weight_decay)"
                 + (f", the non-matrix group's rate {grid_text(tune.nonmatrix_multipliers)[1:-1]} of the tuned rate"
                    if tune.nonmatrix_multipliers else "") + " and each ladder rung's rate, one at a time")
    if tune.confirm_seeds:
        text += f"; choices within the seed noise confirmed at seeds {list(tune.confirm_seeds)}"
    return text + f"; best mean {tune.metric} over seeds {list(seeds)}"


def _check_unchanged(spec: SweepSpec, best: Mapping[float | None, Selection]) -> None:
    """A selection that differs from the file the comparison runs already used is an error (those runs would no
    longer match the file); a new ladder rung (the ladder's extension) is an addition, not a change."""
    changed: dict[str, list[str]] = {}
    for tpp, selection in best.items():
        path = spec.tuned_file_for(tpp)
        old = (load_yaml_mapping(path, "tuned_hparams_file", "Move it aside to tune again.", empty_ok=True)
               if path.is_file() else None)
        keys = [f"{o}/{s}{_at(tpp)} {key}" for o, sizes in selection.items() for s, e in sizes.items()
                for key in ("learning_rate", "weight_decay", NONMATRIX_KEY)
                if isinstance(old, dict) and (old.get(o) or {}).get(s, {}).get(key) not in (None, e.get(key))]
        if keys:
            changed[path.name] = keys
    if changed and spec.runs_dir.is_dir() and any(spec.runs_dir.iterdir()):
        raise OptBenchError(
            f"the tuning phase now selects other values for {', '.join(k for v in changed.values() for k in v)} than "
            f"{', '.join(changed)} held when the comparison runs in {spec.runs_dir} started. Move that directory aside "
            "(or use another --output-dir) to compare at the new values; nothing was overwritten.")


def tune_phase(spec: SweepSpec) -> tuple[list[Path], list[str]]:
    """After a sweep's tuning phase (every run :func:`tuning_additions` asked for has run): select, check that every
    compared optimizer x size (x ratio) has a value (OptBenchError otherwise: never a silent fallback to the
    citation), and write ``spec.tuned_file`` (one per ratio in a sweep with several: ``tuned_file_for``)."""
    assert spec.tuning is not None and spec.tune is not None
    plan = current_plan(spec)
    unfinished = [p.name for p in plan.pairs if not p.done]
    if unfinished:
        raise OptBenchError(f"the tuning of {', '.join(unfinished)} is not finished (runs of its grid have not run): "
                            "start the sweep again, it continues where it stopped.")
    best, warnings = entries(plan)
    missing = sorted({f"{r.optimizer}/{r.model_size}{_at(r.budget_tpp)}" for r in spec.runs
                      if "learning_rate" not in best.get(r.budget_tpp, {}).get(r.optimizer, {}).get(r.model_size, {})})
    if missing:
        raise OptBenchError(
            f"the tuning phase found no usable learning rate for {', '.join(missing)} (every multiplier of the grid "
            f"and its extensions diverged, failed or did not run; see {spec.tuning.output_dir}/summary.csv), so the "
            "comparison does not start. Lower tune.lr_multipliers or raise tune.max_extensions, or fix the failures "
            "and rerun with --retry-failed.")
    _check_unchanged(spec, best)
    tuning_dir = portable_path(spec.tuning.output_dir, spec.tuned_file_for(None).parent)  # beside the tuned files
    source = _source(tuning_dir, spec.tune, spec.tune.seeds)
    paths = []
    for tpp, selection in best.items():
        provenance = {"tuning_dir": tuning_dir, "seeds": spec.tune.seeds,
                      **({} if tpp is None else {"tokens_per_param": tpp})}
        paths.append(write_tuned(selection, spec.tuned_file_for(tpp), source + _at(tpp),
                                 [w for w in warnings if tpp is None or w.split(": ", 1)[0].endswith(_at(tpp))],
                                 provenance=provenance, merge=False))
    return paths, warnings


# -------------------------------------------------------------------------------------- hf-optbench tune
def _sweep_tune_spec(d: Path) -> TuneSpec | None:
    """The ``tune:`` section of the sweep whose tuning directory ``d`` is (its manifest, one level up)."""
    manifest = d.parent / MANIFEST_FILE
    if not manifest.is_file():
        return None
    try:
        tune = json.loads(manifest.read_text(encoding="utf-8")).get("tune")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(tune, dict) or Path(str(tune.get("tuning_dir", ""))).resolve() != d.resolve():
        return None
    names = {f.name for f in dataclasses.fields(TuneSpec)}
    return TuneSpec(**{k: v for k, v in tune.items() if k in names})


PairKey = tuple[str, str, float | None]  # optimizer, size, data ratio (None: a sweep with one)


def _found_setups(plan_records: Sequence[Mapping[str, Any]]) -> tuple[list[PairSetup], dict[PairKey, list[float]]]:
    """The pairs of a tuning directory and the axes their runs show (weight-decay, ratio, rung runs), with each
    pair's own learning-rate grid (the points its x1 runs used)."""
    from hf_optbench.study.tuning import index_records

    found: dict[PairKey, dict[str, Any]] = {}
    for (o, s, tpp, point) in index_records(plan_records):
        f = found.setdefault((o, s, tpp), {"wd": False, "nm": False, "rungs": set(), "grid": set()})
        f["wd"] |= point.wd is not None
        f["nm"] |= point.nm is not None and point.dx is None
        if point.dx is not None:
            f["rungs"].add(point.dx)
        elif point.wd is None and point.nm is None:
            f["grid"].add(point.lr)
    setups_ = [PairSetup(o, s, f["wd"], f["nm"], tuple(sorted(f["rungs"])), tpp=tpp)
               for (o, s, tpp), f in sorted(found.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0.0))]
    return setups_, {k: sorted(f["grid"]) for k, f in found.items()}


def select_best(records: Sequence[Mapping[str, Any]], sweep_tune: TuneSpec | None = None
                ) -> tuple[dict[float | None, Selection], list[str]]:
    """The entries of the tuning runs among ``records`` (those with an lr multiplier) and the warnings, by the
    sweep's own rule when ``sweep_tune`` is its ``tune:`` section, else as a grid run by hand: each pair's own
    points, no extension, no confirmation. Keyed by data ratio (:func:`entries`)."""
    from hf_optbench.study.tuning import _plan_pair, index_records

    records = [r for r in records if r.get("lr_multiplier") not in (None, "")]
    if not records:
        raise OptBenchError("no runs with an lr_multiplier found: tune needs a sweep whose matrix has "
                            "lr_multipliers (e.g. recipes/sweeps/tune_cpu.yaml), or a sweep with a 'tune:' section.")
    found, grids = _found_setups(records)
    plan = TuningPlan([], index_records(records), sweep_tune.metric if sweep_tune else "final_tuning_loss")
    for setup in found:
        grid = grids[(setup.optimizer, setup.size, setup.tpp)]
        plan.pairs.append(_plan_pair(sweep_tune or _hand_spec(records, grid), setup, plan.runs))
    best, warnings = entries(plan)
    unfinished = [p.name for p in plan.pairs if not p.done]
    if unfinished:
        warnings.append(f"the tuning of {', '.join(unfinished)} is not finished (points of its grid have not run): "
                        "its entry uses the points that ran")
    return best, warnings


def _hand_spec(records: Sequence[Mapping[str, Any]], grid: Sequence[float]) -> TuneSpec:
    """A grid run by hand as a ``tune:`` section would state it: its points, its seeds, nothing added."""
    seeds = sorted({int(r["seed"]) for r in records if r.get("seed") is not None})
    return TuneSpec(list(grid) or [1.0], seeds, max_extensions=0, confirm_seeds=[], nonmatrix_multipliers=[])


def tune(sweep_dir: str | os.PathLike[str], output: str | os.PathLike[str]) -> tuple[list[Path], list[str]]:
    """``hf-optbench tune``: select the tuning runs of ``sweep_dir`` (:func:`select_best`) and write them to
    ``output`` by :func:`write_tuned` (merged into an existing tuned file; any other file is refused first). Runs of
    several data ratios (a sweep with ``budget.tokens_per_param`` a list) go to one file per ratio beside ``output``
    (``sweep_spec.tuned_file_name``), as the sweep writes them. Returns the files written."""
    from hf_optbench.study.records import load_runs

    d = Path(sweep_dir)
    if not d.is_dir():
        raise OptBenchError(f"sweep directory not found: '{sweep_dir}'. Pass the output_dir of a tuning sweep.")
    out = Path(output)
    check_output(out)
    records = load_runs(d)
    sweep_tune = _sweep_tune_spec(d)
    best, warnings = select_best(records, sweep_tune)
    paths = {tpp: out.with_name(tuned_file_name(tpp, out.name)) for tpp in best}
    for path in paths.values():
        check_output(path)
    grids = _found_setups([r for r in records if r.get("lr_multiplier") not in (None, "")])[1]
    spec = sweep_tune or _hand_spec(records, sorted({m for g in grids.values() for m in g}))
    source = _source(portable_path(d, out.parent), spec, spec.seeds)
    return [write_tuned(selection, paths[tpp], source + _at(tpp), warnings,
                        provenance={"tuning_dir": portable_path(d, out.parent), "seeds": spec.seeds,
                                    **({} if tpp is None else {"tokens_per_param": tpp})})
            for tpp, selection in best.items()], warnings
