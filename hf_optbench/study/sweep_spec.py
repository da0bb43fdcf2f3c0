"""A sweep file, read and checked: the matrix expanded into one :class:`RunSpec` per run, before anything is launched.

The file format is documented in :mod:`hf_optbench.study.sweep` (the ``hf-optbench sweep --help`` text). Every
mistake raises OptBenchError naming the key and the fix: a sweep that fails after its tenth run because of a typo
in its last one wastes the first nine. A sweep with a ``tune:`` section holds two phases: the tuning grid (its own
:class:`SweepSpec` in ``<output_dir>/tuning``) and the comparison, whose runs read ``<output_dir>/tuned_hparams.yaml``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError, suggest
from hf_optbench.measure.primary import ReportSpec, parse_report_spec
from hf_optbench.optim.dotted import is_dotted_path
from hf_optbench.rundir import RUNS_DIR, TUNED_FILE, TUNING_DIR, run_id_for
from hf_optbench.study import budget as budgets
from hf_optbench.study.budget import Budget, Ladder
from hf_optbench.study.second_draw import SECOND_DRAW_KEY, SecondDraw, parse_second_draw
from hf_optbench.study.sweep_values import (
    as_list,
    check_unique_ids,
    distinct_optimizers,
    distinct_sizes,
    multiplier_list,
    seed_list,
)
from hf_optbench.study.tracking_env import tracker_env
from hf_optbench.study.tuning import TUNE_KEYS, TUNING_METRIC, TuneSpec, parse_tune
from hf_optbench.yaml_file import load_yaml_mapping

if TYPE_CHECKING:
    from hf_optbench.config.parse import RunConfig

SWEEP_KEYS = {"base", "output_dir", "overrides", "matrix", "per_optimizer", "per_model_size", "launcher", "name",
              "description", "tune", "budget", "ladder", "calibration", "report"}
# Keys that would beat or bypass the tuned value (an explicit value wins in run.plan.resolve_optimization).
TUNED_KEYS = ("learning_rate", "tuned_hparams_file")
MATRIX_KEYS = {"optimizer", "model_size", "seed", "lr_multipliers"}
LAUNCHER_KEYS = {"type", "accelerate_config", "command", "executor", "slurm", "timeout_s", "env", "validate",
                 "progress_interval_s", "warm_worker", "jobs"}
LAUNCHER_TYPES = ("accelerate", "python", "command")
EXECUTORS = ("local", "slurm")
# Keys the sweep sets per run: in overrides they would be silently replaced.
RESERVED_KEYS = {"optimizer", "model_size", "seed", "output_dir"}


@dataclass
class RunSpec:
    """One point of the matrix and the arguments of its run (without --output_dir)."""

    run_id: str
    optimizer: str
    model_size: str
    seed: int
    lr_multiplier: float | None
    args: list[str]
    learning_rate: float | None = None
    max_steps: int | None = None
    phase: str = "compare"  # "tune" for a run of the tuning grid
    env: dict[str, str] = field(default_factory=dict)  # tracker grouping (W&B), added to the run's environment
    budget_multiple: float | None = None  # a run of the baseline's ladder (study/budget.py): x the budget
    budget_tpp: float | None = None  # its cell's tokens per parameter, in a sweep with several (study/budget.py)


@dataclass
class SweepSpec:
    """A checked sweep file: where its runs go, how they are launched, and the runs themselves."""

    path: Path
    base: Path
    output_dir: Path
    overrides: dict[str, Any]
    per_optimizer: dict[str, dict[str, Any]]
    per_model_size: dict[str, dict[str, Any]]
    launcher: dict[str, Any]
    runs: list[RunSpec] = field(default_factory=list)
    name: str = ""
    tune: TuneSpec | None = None
    tuning: SweepSpec | None = None  # the tuning phase (runs into <output_dir>/tuning), when ``tune`` is set
    budget: Budget | None = None  # tokens per parameter (study/budget.py)
    ladder: Ladder | None = None  # the baseline's budget ladder (comparison phase only)
    steps: budgets.Steps = field(default_factory=dict)  # (size, optimizer, ratio key) -> max_steps at x1
    current: set[str] = field(default_factory=set)  # run ids known to match the file (study.kept_runs), or run now
    second_draw: SecondDraw | None = None  # tune.second_draw (study.second_draw): cells tuned again at another seed
    ladder_dir: Path | None = None  # whose comparison runs decide the ladder's rungs (None: this sweep's own)
    calibration: bool | dict[str, int] = True  # the sweep-end step-time calibration (study/calibration.py)
    report: ReportSpec = field(default_factory=ReportSpec)  # primary questions, transient cells (measure/primary.py)

    @property
    def runs_dir(self) -> Path:
        return self.output_dir / RUNS_DIR

    @property
    def tuned_file(self) -> Path:
        """Where the tuning phase writes the selected values (read by every comparison run); a sweep with several
        data ratios writes one per ratio (:meth:`tuned_file_for`)."""
        return self.output_dir / TUNED_FILE

    def tuned_file_for(self, tpp: float | None) -> Path:
        """The tuned file the runs of ratio ``tpp`` read (:func:`tuned_file_name`)."""
        return self.output_dir / tuned_file_name(tpp)

    def run_dir(self, run: RunSpec) -> Path:
        return self.runs_dir / run.run_id


def tuned_file_name(tpp: float | None, name: str = TUNED_FILE) -> str:
    """``tuned_hparams.yaml``, or ``tuned_hparams__tpp0.5.yaml`` for the runs of one ratio of a sweep with several.
    Why a file per ratio and not one entry per ratio in one file: a run finds its values by its optimizer, size and
    max_steps (optim.tuned.lookup_tuned), and two ratios' runs can share a step count with different tuned values (the
    2x rung at 1 token/param and the compared budget at 2 are both 782 steps at tiny), so only the file can tell them
    apart; each file is in the single-ratio format, read as before."""
    if tpp is None:
        return name
    stem, dot, ext = name.rpartition(".")
    return f"{stem}__tpp{tpp:g}{dot}{ext}" if dot else f"{name}__tpp{tpp:g}"


def _resolve_path(value: str, sweep_file: Path, key: str) -> Path:
    p = Path(value).expanduser()
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, sweep_file.parent / p]):
        if cand.is_file():
            return cand.resolve()
    raise OptBenchError(
        f"{key} '{value}' of sweep '{sweep_file}' not found (looked in the current directory and next to the "
        "sweep file). Fix the path."
    )


def mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` as a dict ({} for None); anything else is an OptBenchError naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OptBenchError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    return value


def _check_keys(value: Any, allowed: set[str], where: str) -> dict[str, Any]:
    value = mapping(value, where)
    unknown = sorted(set(value) - allowed)
    if unknown:
        hint = suggest(unknown[0], sorted(allowed))
        raise OptBenchError(f"unknown key '{unknown[0]}' in {where}.{hint} Allowed: {', '.join(sorted(allowed))}.")
    return value


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    raw = load_yaml_mapping(path, "sweep file", "Pass a sweep YAML file with base: and matrix: (see recipes/sweeps/).")
    raw = _check_keys(raw, SWEEP_KEYS, f"sweep '{path}'")
    if "base" not in raw:
        raise OptBenchError(f"sweep '{path}' needs 'base: <recipe.yaml>' (the recipe every run starts from).")
    return raw


def _overrides(raw: dict[str, Any]) -> dict[str, Any]:
    overrides = dict(mapping(raw.get("overrides"), "overrides"))
    bad = sorted(RESERVED_KEYS & set(overrides))
    if bad:
        raise OptBenchError(f"'{bad[0]}' cannot be an override: the sweep sets it per run. Put it in 'matrix' "
                            "(optimizer, model_size, seed) or use --output-dir / 'output_dir' for the sweep.")
    return overrides


def _matrix(raw: dict[str, Any]) -> tuple[list[str], list[str], list[int], list[float]]:
    """(optimizers, sizes, seeds, lr multipliers) of the matrix, each checked."""
    matrix = _check_keys(raw.get("matrix"), MATRIX_KEYS, "matrix")
    optimizers = distinct_optimizers([str(o) for o in as_list(matrix, "optimizer", True)])
    sizes = distinct_sizes([str(s) for s in as_list(matrix, "model_size", True)])
    seeds = seed_list(as_list(matrix, "seed", False) or [0], "matrix seed")
    return optimizers, sizes, seeds, multiplier_list(as_list(matrix, "lr_multipliers", False), "lr_multipliers")


def _tune(raw: dict[str, Any], mults: list[float], tables: list[tuple[str, dict[str, Any]]]) -> TuneSpec | None:
    """The ``tune:`` section, checked (:func:`hf_optbench.study.tuning.parse_tune`: grids of >= 3 multipliers
    that hold x1, the cited default, so the tuned value is never worse than the citation on the tuning split), and
    nothing in ``tables`` (overrides and the per-point keys, by where they stand) that would replace the tuned
    learning rate."""
    if raw.get("tune") is None:
        return None
    tune = _check_keys(raw["tune"], TUNE_KEYS, "tune")
    spec = parse_tune(tune, seed_list(as_list(tune, "seed", False, "tune") or [0], "tune.seed"), TUNING_METRIC)
    if mults:
        raise OptBenchError("a sweep with 'tune' compares at the tuned learning rates: remove matrix.lr_multipliers "
                            "(the grid belongs in tune.lr_multipliers).")
    for where, table in tables:
        bad = [k for k in TUNED_KEYS if k in table]
        if bad:
            raise OptBenchError(f"'{bad[0]}' in {where} would replace the tuned learning rate of a sweep with 'tune': "
                                f"remove it (the tuning phase writes {TUNED_FILE} and every compared run reads it).")
    return spec


def _per_point(raw: dict[str, Any], key: str, names: list[str], what: str) -> dict[str, Any]:
    """per_optimizer / per_model_size: keys must be matrix values, and none may set a reserved key."""
    table = _check_keys(raw.get(key), set(names), f"{key} (keys must be matrix {what})")
    for name, extra in table.items():
        _check_keys(extra, set(mapping(extra, f"{key}.{name}")) - RESERVED_KEYS, f"{key}.{name}")
    return table


def _launcher(raw: dict[str, Any], sweep_file: Path) -> dict[str, Any]:
    launcher = dict(_check_keys(raw.get("launcher"), LAUNCHER_KEYS, "launcher"))
    launcher.setdefault("type", "accelerate")
    launcher.setdefault("executor", "local")
    launcher.setdefault("validate", True)
    launcher.setdefault("jobs", "auto")  # runs at once, local executor (study/sweep_state.py plan_slots)
    launcher["env"] = {str(k): v for k, v in mapping(launcher.get("env"), "launcher.env").items()}
    if launcher["type"] not in LAUNCHER_TYPES:
        raise OptBenchError(f"launcher.type '{launcher['type']}' is not one of {', '.join(LAUNCHER_TYPES)}.")
    if launcher["executor"] not in EXECUTORS:
        raise OptBenchError(f"launcher.executor '{launcher['executor']}' is not one of {', '.join(EXECUTORS)}.")
    if launcher["type"] == "accelerate":
        if not launcher.get("accelerate_config"):
            raise OptBenchError("launcher.type accelerate needs launcher.accelerate_config (e.g. "
                                "accelerate_configs/cpu.yaml), or use type: python.")
        launcher["accelerate_config"] = str(_resolve_path(str(launcher["accelerate_config"]), sweep_file,
                                                          "launcher.accelerate_config"))
    for key in ("timeout_s", "progress_interval_s"):
        value = launcher.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value <= 0):
            raise OptBenchError(f"launcher.{key} must be a positive number of seconds, got {value!r}. Fix it in "
                                f"'{sweep_file}'.")
    if not isinstance(launcher.get("warm_worker", True), bool):
        raise OptBenchError("launcher.warm_worker must be true or false (false: every run starts its own "
                            f"interpreter). Fix it in '{sweep_file}'.")
    jobs = launcher["jobs"]
    if jobs != "auto" and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise OptBenchError(f"launcher.jobs must be a positive integer (runs at once on this machine) or \"auto\" (as "
                            f"many as its cores or GPUs fit), got {jobs!r}. Fix it in '{sweep_file}'.")
    if launcher["type"] == "command" and not (isinstance(launcher.get("command"), list) and launcher["command"]):
        raise OptBenchError("launcher.type command needs launcher.command: a list, e.g. [python, wrapper.py].")
    return launcher


def _report(raw: dict[str, Any]) -> ReportSpec:
    """``report:``: the sweep's pre-declared primary questions and whether transient cells join the trends."""
    from hf_optbench.measure.verdict import METRICS

    return parse_report_spec(raw.get("report"), [m.key for m in METRICS])


def _calibration(raw: dict[str, Any]) -> bool | dict[str, int]:
    """``calibration:``: true (the default), false (none: test sweeps), or {rounds, steps_per_round}, each an integer
    >= 1 (study/calibration.py)."""
    value = raw.get("calibration", True)
    if isinstance(value, bool):
        return value
    value = _check_keys(value, {"rounds", "steps_per_round"}, "calibration")
    for key, n in value.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise OptBenchError(f"calibration.{key} must be an integer >= 1, got {n!r}. E.g. calibration: {{rounds: 3, "
                                "steps_per_round: 12}, or calibration: false to skip it.")
    return value


def _point_args(spec: SweepSpec, opt: str, size: str) -> list[str]:
    """The run arguments of one optimizer x size before the sweep's own (seed, id, steps)."""
    from hf_optbench.config.parse import to_tokens

    return [str(spec.base)] + to_tokens(spec.overrides) + to_tokens(spec.per_model_size.get(size) or {}) \
        + to_tokens(spec.per_optimizer.get(opt) or {}) + ["--optimizer", opt, "--model_size", size]


def _expand(spec: SweepSpec, optimizers: list[str], sizes: list[str], seeds: list[int], mults: list[float],
            phase: str = "compare", ratios: list[float | None] | None = None) -> None:
    """Append one RunSpec per matrix point (and per ladder budget of the baseline) at every data ratio of the budget
    (``ratios``: only these) whose cell is not excluded. Seeds outermost: a half-finished sweep already holds one
    complete seed of every optimizer x size x ratio."""
    keys = ratios if ratios is not None else budgets.ratio_keys(spec.budget)
    for seed in seeds:
        for size in sizes:
            for tpp in (k for k in keys if spec.budget is None or spec.budget.includes(size, k)):
                for mult in (mults or [None]):
                    for opt in optimizers:
                        _expand_point(spec, opt, size, seed, None if mult is None else float(mult), tpp, phase)
    check_unique_ids(spec.runs)


def _expand_point(spec: SweepSpec, opt: str, size: str, seed: int, multiplier: float | None, tpp: float | None,
                  phase: str) -> None:
    """The runs of one matrix point: the compared (or tuning) run and, for the baseline, its ladder's other rungs."""
    ladder = spec.ladder.extra if spec.ladder and opt == spec.ladder.optimizer and multiplier is None else ()
    for budget_multiple in (None, *ladder):
        args = _point_args(spec, opt, size) + ["--seed", str(seed)]
        if (size, opt, tpp) in spec.steps:
            args += ["--max_steps", str(budgets.ladder_steps(spec.steps[(size, opt, tpp)], budget_multiple))]
        rid = run_id_for(opt, size, seed, multiplier, budget_multiple=budget_multiple, budget_tpp=tpp)
        if "run_name" not in spec.overrides:
            args += ["--run_name", rid]
        run = RunSpec(rid, opt, size, int(seed), multiplier, args, phase=phase, budget_multiple=budget_multiple,
                      budget_tpp=tpp)
        run.env = tracker_env(spec, run)
        spec.runs.append(run)



def _budget_steps(spec: SweepSpec, optimizers: list[str], sizes: list[str]) -> None:
    """Every optimizer x size's max_steps at the budget (tokens per parameter, or the runs' own steps when only a
    ladder is set), from each point's parsed arguments."""
    if spec.budget is None and spec.ladder is None:
        return

    def probe(opt: str, size: str) -> Any:
        return probe_run_config(spec, RunSpec(f"{opt}__{size}", opt, size, 0, None, _point_args(spec, opt, size)))

    spec.steps = budgets.steps_table(spec.budget, sizes, optimizers, budgets.world_size(spec.launcher), probe)
    if spec.ladder is not None:
        budgets.check_ladder(spec.ladder, spec.steps)


def load_sweep(path: str | os.PathLike[str], output_dir: str | None = None) -> SweepSpec:
    """Read and check a sweep file (structure only; :func:`validate_runs` checks every run's arguments)."""
    sweep_file = Path(path)
    raw = _read_yaml(path)
    base = _resolve_path(str(raw["base"]), sweep_file, "base")
    overrides = _overrides(raw)
    optimizers, sizes, seeds, mults = _matrix(raw)
    per_opt = _per_point(raw, "per_optimizer", optimizers, "optimizers")
    per_size = _per_point(raw, "per_model_size", sizes, "model sizes")
    # every place a run's keys come from, by its name in the file (tune and budget refuse keys they would override)
    tables = [("overrides", overrides)] + [(f"per_optimizer.{k}", mapping(v, k)) for k, v in per_opt.items()] \
        + [(f"per_model_size.{k}", mapping(v, k)) for k, v in per_size.items()]
    tune = _tune(raw, mults, tables)
    launcher = _launcher(raw, sweep_file)
    out = Path(output_dir or raw.get("output_dir") or Path("runs") / sweep_file.stem).resolve()
    name = str(raw.get("name") or sweep_file.stem)
    common = dict(path=sweep_file.resolve(), base=base, overrides=overrides, per_optimizer=per_opt,
                  per_model_size=per_size, launcher=launcher, budget=budgets.parse_budget(raw, tables, sizes))
    spec = SweepSpec(output_dir=out, name=name, tune=tune, ladder=budgets.parse_ladder(raw, optimizers),
                     calibration=_calibration(raw), report=_report(raw), **common)
    if tune is not None:  # the file's own structure, before the budget parses a run (transformers, torch: seconds)
        spec.second_draw = parse_second_draw(
            raw["tune"].get(SECOND_DRAW_KEY), tune_seeds=tune.seeds, confirm_seeds=tune.confirm_seeds,
            compared_seeds=seeds, sizes=sizes, budget=spec.budget)
    _budget_steps(spec, optimizers, sizes)
    if tune is not None:
        # Same base, overrides, per-point keys and budget as the comparison: the grid runs at the real horizon.
        spec.tuning = SweepSpec(output_dir=out / TUNING_DIR, name=f"{name}-tuning", steps=spec.steps, **common)
        _expand(spec.tuning, optimizers, sizes, tune.seeds, tune.multipliers, phase="tune")
    _expand(spec, optimizers, sizes, seeds, mults)
    return spec


def attach_tuned_file(spec: SweepSpec) -> None:
    """Point every comparison run of a sweep with ``tune`` at its tuned-values file, its ratio's (once)."""
    for run in spec.runs:
        if "--tuned_hparams_file" not in run.args:
            run.args = run.args + ["--tuned_hparams_file", str(spec.tuned_file_for(run.budget_tpp))]


def probe_run_config(spec: SweepSpec, run: RunSpec) -> Any:
    """The run's RunConfig, parsed in-process; on a machine without CUDA (a laptop, a SLURM login node) with
    ``--use_cpu true`` so that TrainingArguments accepts a GPU recipe's bf16/fp16 (hardware is checked where the
    run runs). The output_dir given is never created."""
    import torch

    from hf_optbench.config.parse import parse_args

    hardware = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    probe = spec.output_dir / ".validate-never-created" / run.run_id
    return parse_args(run.args + ["--output_dir", str(probe)] + hardware)


def _check_run(spec: SweepSpec, run: RunSpec, cfg: RunConfig) -> None:
    """What a sweep requires of a run beyond valid arguments: a tuning run evaluates a held-out tuning split, and a
    run that reads a tuned-values file finds its learning rate there (never a silent fallback to the citation)."""
    from hf_optbench.optim.tuned import lookup_tuned

    if run.phase == "tune" and not (getattr(cfg.data, "tuning_blocks", 0) or 0) > 0:
        raise OptBenchError("the tuning grid selects learning rates on a held-out tuning split, never on the reported "
                            "eval split: set tuning_blocks (e.g. 16) in the sweep's overrides.")
    if spec.tune is not None and "learning_rate" in cfg.explicit:
        raise OptBenchError("its recipe sets learning_rate, which would replace the tuned rate of a sweep with "
                            "'tune': remove learning_rate from the base recipe.")
    tuned = cfg.optim.tuned_hparams_file
    if tuned and "learning_rate" not in cfg.explicit and os.path.isfile(tuned) \
            and "learning_rate" not in lookup_tuned(tuned, run.optimizer, run.model_size):
        raise OptBenchError(
            f"tuned_hparams_file '{tuned}' has no learning rate for {run.optimizer}/{run.model_size}, and a tuned "
            "comparison never falls back to the cited default. Tune that optimizer at that size (add it to the "
            "tuning sweep, then `hf-optbench tune`), or give the sweep a 'tune:' section, which tunes every size "
            "it compares.")
    if is_dotted_path(run.optimizer):  # a dotted path has no cited learning rate: refused here, not when it launches
        from hf_optbench.run.plan import resolve_optimization

        resolve_optimization(cfg)


def _set_grid_lr(run: RunSpec, cfg: RunConfig) -> None:
    """A grid run's learning rate: its multiplier x the rate the run would otherwise use (its cited default)."""
    from hf_optbench.run.plan import resolve_optimization

    if run.lr_multiplier is None or run.learning_rate is not None:
        return
    run.learning_rate = float(resolve_optimization(cfg)[0].learning_rate.value) * run.lr_multiplier
    run.args = run.args + ["--learning_rate", f"{run.learning_rate:.6g}"]


def resolve_grid(spec: SweepSpec) -> None:
    """Set the learning rate of every run with a multiplier; needed even when validation is switched off."""
    for run in spec.runs:
        if run.lr_multiplier is not None and run.learning_rate is None:
            try:
                _set_grid_lr(run, probe_run_config(spec, run))
            except OptBenchError as exc:
                raise OptBenchError(f"sweep run '{run.run_id}': {exc}") from exc


def validation_key(run: RunSpec) -> tuple[str, ...]:
    """The run's arguments with its seed and run name masked: a 10,000-run matrix of a few optimizer x size points
    parses a few times, not 10,000 (56 ms each). The seeds were range-checked with the matrix."""
    args = list(run.args)
    for i, arg in enumerate(args[:-1]):
        if arg in ("--seed", "--run_name"):
            args[i + 1] = "*"
    return (run.phase, *args)


def validate_runs(spec: SweepSpec) -> None:
    """Parse every run's arguments in-process (hf_optbench.config.parse.parse_args) before launching anything,
    tuning phase first, check what the sweep requires of each (:func:`_check_run`), and resolve the learning rate
    of each run with a multiplier. Raises OptBenchError naming the run."""
    for phase in ([spec.tuning] if spec.tuning is not None else []) + [spec]:
        checked: dict[tuple[str, ...], Any] = {}  # runs differing only in seed and name parse alike: once each
        for run in phase.runs:
            try:
                key = validation_key(run)
                cfg = checked[key] if key in checked else checked.setdefault(key, probe_run_config(phase, run))
                _check_run(phase, run, cfg)
                run.max_steps = int(cfg.training.max_steps)
                _set_grid_lr(run, cfg)
            except OptBenchError as exc:
                raise OptBenchError(f"sweep run '{run.run_id}': {exc}") from exc
