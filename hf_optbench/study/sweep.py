"""Sweeps: a base recipe x a matrix of optimizers, model sizes, seeds (and learning-rate multipliers), one
process per run, restartable.

    hf-optbench sweep recipes/sweeps/cpu_demo.yaml [--dry_run] [--max_runs N] [--retry_failed] [--output_dir DIR]

Sweep file (YAML)::

    base: recipes/quickstart_cpu.yaml      # a run recipe; relative paths: current dir first, then the sweep file's
    output_dir: runs/cpu_demo              # relative to the current directory
    overrides: {max_steps: 60}             # recipe keys applied to every run
    matrix:
      optimizer: [adamw, lion]
      model_size: [tiny, mini]
      seed: [0, 1]
      lr_multipliers: [0.5, 1, 2]          # optional: x the run's resolved learning rate (a tuning grid by hand)
    tune:                                  # optional: tune, then compare (the main protocol, see below)
      lr_multipliers: [0.5, 1, 2]          # the initial grid: >= 3, around x1 (the cited default); or instead
      lr_grid: {low: 0.25, high: 4}        #   factor-2 steps from low to high (powers of 2, low <= 1 <= high)
      max_extensions: 3                    # steps the tuner may add beyond an edge holding the best (default 3)
      wd_multipliers: [0.333333, 1, 3]     # weight decay x the cited value, optimizers that tune it (default)
      nonmatrix_multipliers: [0.25, 0.5, 1, 2]  # the non-matrix group's rate x the tuned rate (adamw, muon); [] off
      seed: [0]                            # seeds of the tuning runs
      confirm_seeds: [1000, 1001]          # more seeds where a choice's margin is within the seed noise (default)
      confirm_rungs: true                  # the same for the ladder rungs' rates (study/tuning.py has the rule)
      second_draw: {seed: 6, cells: [{model_size: tiny}]}  # after the comparison, tune these cells again at
                                           #   another seed: the report states the shift (study/second_draw.py)
    budget: {tokens_per_param: 0.5}      # optional: max_steps per size = 0.5 x non-embedding params / tokens per
                                           # step, the same data per parameter at every size (study/budget.py);
                                           # a list ([0.5, 2]) runs the whole protocol at each ratio (ids __tpp0.5,
                                           # one tuned file per ratio), exclude: [{model_size, tokens_per_param}]
    ladder:                                # optional: the baseline also runs at these multiples of the budget,
      multiples: [0.25, 0.5, 1, 2]         #   each a full schedule, each at its own tuned rate; the report reads
      optimizer: adamw                     #   every other optimizer's speedup off it (measure/speedup.py)
      max_multiple: 16                     #   doubled while a run beats the top rung, up to this (default 8x top)
    per_optimizer: {lion: {weight_decay: 1.0}}   # optional recipe keys for one optimizer
    per_model_size: {gpt2-xl: {per_device_train_batch_size: 4}}   # optional recipe keys for one size
    launcher:
      type: accelerate                     # accelerate (default) | python | command
      accelerate_config: accelerate_configs/cpu.yaml
      command: [...]                       # type command: argv prefix that accepts hf_optbench.run's arguments
      executor: local                      # local (default) | slurm (submitit; one job per run)
      slurm: {partition: gpu, gpus_per_node: 4, timeout_min: 120}   # submitit parameters
      timeout_s: null                      # per-run wall-clock limit (local executor)
      env: {}                              # extra environment variables for every run; a value whose name
                                           # has TOKEN/KEY/SECRET/PASSWORD is never written (name kept)
      validate: true                       # parse every run's arguments in-process before launching
      jobs: auto                           # local executor: runs at once (a positive integer, or auto, below)
    calibration: {rounds: 3, steps_per_round: 12}   # optional: at the sweep's end each compared optimizer x size's
                                           # step measured alone -> step_calibration.json (false: none, and no
                                           # in-process step measurement for the ETA either: test sweeps)

Tune, then compare: with ``tune:``, every optimizer x size of the matrix first runs the learning-rate grid (cited
default x each multiplier, tune seeds, the same overrides, horizon and batch as the comparison) into
``<output_dir>/tuning/`` (a sweep directory of its own); the best multiplier by mean ``final_tuning_loss`` (a
held-out split: set ``tuning_blocks`` in overrides) goes to ``<output_dir>/tuned_hparams.yaml`` with its
provenance; then the comparison matrix runs with ``--tuned_hparams_file`` pointing at it. An optimizer x size
without a tuned value stops the sweep before the comparison starts. Tuning runs are never reused as comparison
runs: their seed's result picked the rate, so give the comparison other seeds (its runs are fresh either way).

ETA: every run's start and end line says the sweep's predicted time left (study/eta.py): the runs it will run, known
or still to be added (extensions, later axes, each rung's tuning at its budget multiple, the attribution, the
calibration), times the step and run costs measured here (a short measurement of each optimizer's step at the start,
then the finished runs), over the runs at once. ``--dry_run`` prints the prediction for the whole sweep.

Runs at once (``launcher.jobs``, local executor; SLURM stays one job per run): ``auto`` runs one per visible GPU
(per accelerate process group), else as many as the cores fit: the cores this process may use divided by the
threads each run uses (OMP_NUM_THREADS in launcher.env or the environment, default 1, times the accelerate
config's num_processes); 1 for type command, whose processes the sweep cannot count. Each run is pinned: to its
own block of cores (sched_setaffinity) and, on a GPU machine, its own CUDA_VISIBLE_DEVICES, so its memory and step
times stay its own; its summary.json records ``concurrent_runs`` and its ``pinning``, its start row in the state
file the same, and the report marks wall-clock comparisons measured while runs shared the machine. ``jobs: 1``
runs one after another, unpinned. An interrupt stops every run in flight; a restart (even after SIGKILL) stops
what a killed sweep left running, then reruns each unfinished run once.

Trackers: every run gets WANDB_RUN_GROUP (the sweep's name; ``<name>-tuning`` for the grid), WANDB_TAGS
(optimizer, model_size, seed, phase, lr_multiplier), WANDB_NAME (the run id), WANDB_JOB_TYPE (tune/compare) and
HF_OPTBENCH_SWEEP_POINT (the matrix point as JSON), so with ``report_to: wandb`` W&B groups and filters a sweep's
runs on its own.

Why one process per run: allocator caches and leftovers of a previous optimizer would skew the next run's memory
figures (peak memory is a per-process maximum: CUDA's max_memory_allocated, or the process's peak RSS on CPU). Why the state file: a sweep is killed (pre-emption, Ctrl-C, OOM killer) and must restart
without redoing or duplicating finished runs. The run's own ``summary.json`` decides whether it finished
(completed/diverged; failed/oom are final too unless ``--retry_failed``); ``sweep_state.jsonl`` records every
attempt, one JSON line per event written with a single O_APPEND write. An unfinished run directory is resumed
from its last ``checkpoint-*`` (``--resume_from_checkpoint true``) or moved aside to ``<run_id>.incomplete-<n>``;
nothing is ever deleted. A restart stops only processes its own sweep started (start rows carry the sweep's id and
directory: a sweep run on a copy of a live sweep's directory leaves the original's runs alone), and a run directory
whose run.lock another live process holds is never moved or written into: the sweep stops, naming the holder.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from dataclasses import asdict
from typing import Any

from hf_optbench.publish.redact import (
    REDACTED,
    argv_secret_values,
    public_env,
    redact_argv,
    scrub_secrets,
    secret_values,
)
from hf_optbench.rundir import (
    BASELINE,
    MANIFEST_FILE,
    STATE_FILE,
    SWEEP_COPY_FILE,
    finished_status,
    read_identity,
    read_state,
    write_json_atomic,
    write_text_atomic,
)
from hf_optbench.study.kept_runs import changed_runs, check_summaries, keep_current, kept_entries
from hf_optbench.study.launch import WORKER_LOG, build_command, run_local
from hf_optbench.study.slurm import check_job_script_values, run_slurm
from hf_optbench.study.sweep_spec import (
    RunSpec,
    SweepSpec,
    attach_tuned_file,
    load_sweep,
    resolve_grid,
    validate_runs,
)
from hf_optbench.study.sweep_state import Progress, attempt_number, sweep_identity, sweep_lock
from hf_optbench.study.worker_client import WorkerPool


def _redacted_copy(spec: SweepSpec, secrets: list[str]) -> str:
    """The sweep file's text with every secret value replaced (comments kept); when that does not read back as
    YAML free of them (a value written quoted or escaped), the parsed file re-dumped with the values replaced."""
    import yaml

    from hf_optbench.yaml_file import dump_yaml

    original = spec.path.read_text(encoding="utf-8")
    text = original
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    try:
        raw = yaml.safe_load(text) or {}
        env = (raw.get("launcher") or {}).get("env") or {}
        command = [str(c) for c in (raw.get("launcher") or {}).get("command") or []]
        clean = not any(str(v) in secrets for v in env.values()) and redact_argv(command) == command
    except (yaml.YAMLError, AttributeError):
        clean = False
    if not clean:
        raw = yaml.safe_load(original) or {}
        launcher = {**raw["launcher"], "env": public_env(dict(raw["launcher"].get("env") or {}))}
        if isinstance(launcher.get("command"), list):
            launcher["command"] = redact_argv(launcher["command"])
        text = "# secrets removed by hf-optbench\n" + dump_yaml({**raw, "launcher": launcher}, sort_keys=False)
    return str(scrub_secrets(text))


def _manifest(spec: SweepSpec, kept: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest of one phase: secret-named env values replaced by a marker, token-shaped strings removed.
    ``kept``: the entries of runs kept from earlier invocations, which say what those runs ran with."""
    launcher = {k: redact_argv(v) if k == "command" and isinstance(v, list) else v
                for k, v in spec.launcher.items() if k != "env"}
    runs = []
    for r in spec.runs:
        d = (kept or {}).get(r.run_id) or asdict(r)
        d["env"] = public_env(d.get("env") or {})
        runs.append(d)
    manifest = scrub_secrets({
        "name": spec.name, "sweep_file": str(spec.path), "base": str(spec.base), "launcher": launcher,
        "overrides": spec.overrides, "per_optimizer": spec.per_optimizer, "per_model_size": spec.per_model_size,
        "report": spec.report.as_dict(), "runs": runs})
    manifest["launcher"]["env"] = public_env(dict(spec.launcher.get("env") or {}))
    if spec.tune is not None and spec.tuning is not None:
        manifest["tune"] = {**asdict(spec.tune), "tuning_dir": str(spec.tuning.output_dir),
                            "tuned_file": str(spec.tuned_file) if spec.budget is None or len(spec.budget.ratios) < 2
                            else [str(spec.tuned_file_for(k)) for k in spec.budget.keys]}
    return manifest


def _write_manifest(spec: SweepSpec, sweep_copy: bool = True, relaunch: set[str] | None = None) -> None:
    """The matrix point and arguments of every run (the report and `tune` read it: a run kept from an earlier
    invocation keeps its entry, a run in ``relaunch`` gets the file's current one) and a copy of the sweep file;
    no secret value in either."""
    spec.runs_dir.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(spec, kept_entries(spec, relaunch or set()))
    # the sweep's identity, kept across restarts: start rows carry it, so only this sweep's processes are stopped
    manifest["sweep_id"] = sweep_identity(spec.output_dir)["sweep_id"] or uuid.uuid4().hex
    write_json_atomic(spec.output_dir / MANIFEST_FILE, manifest)
    if sweep_copy:
        secrets = secret_values(dict(spec.launcher.get("env") or {})) \
            + argv_secret_values(list(spec.launcher.get("command") or []))
        write_text_atomic(spec.output_dir / SWEEP_COPY_FILE, _redacted_copy(spec, secrets))


def _refresh_summary(spec: SweepSpec) -> None:
    """summary.csv of the sweep directory, rewritten after every run so that a killed sweep still has one."""
    from hf_optbench.study.records import load_runs, write_summary_csv

    write_summary_csv(load_runs(spec.output_dir), spec.output_dir / "summary.csv")


def _counts(spec: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in spec.runs:
        status = finished_status(spec.run_dir(run), rows, run.run_id) or "pending"
        counts[status] = counts.get(status, 0) + 1
    return counts


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(set(a) | set(b))}


def _phases(spec: SweepSpec) -> list[SweepSpec]:
    return ([spec.tuning] if spec.tuning is not None else []) + [spec]


def _draw_phases(spec: SweepSpec) -> list[SweepSpec]:
    """The second tuning draw's initial grid, where the file asks for one (its later runs follow from results)."""
    from hf_optbench.study.second_draw_phase import draw_spec

    draw = draw_spec(spec) if spec.second_draw is not None else None
    return [draw.tuning] if draw is not None and draw.tuning is not None else []


def _dry_run(spec: SweepSpec, out_stream: Any, power: tuple[float | None, str | None] = (None, None)) -> dict[str, int]:
    """Print each run's status and command (the tuning phase first), then the predicted wall time on this machine
    (study.eta: the sweep's structure, a short measurement of each compared optimizer's step); launch nothing,
    write nothing."""
    from hf_optbench.study.eta import predictor_for

    if spec.tune is not None:
        attach_tuned_file(spec)
    counts: dict[str, int] = {}
    for phase in _phases(spec) + _draw_phases(spec):
        rows = read_state(phase.output_dir / STATE_FILE)
        changed = changed_runs(phase, phase.runs)  # a run would refuse (or, with --rerun-changed, rerun) these
        for run in phase.runs:
            status = "changed" if run.run_id in changed else \
                finished_status(phase.run_dir(run), rows, run.run_id) or "pending"
            cmd = shlex.join(redact_argv(build_command(phase, run, phase.run_dir(run), False)))  # pastable
            print(f"{run.run_id:<40} {status:<10} {cmd}", file=out_stream)
        counts = _add(counts, _counts(phase, rows))
    predictor = predictor_for(spec)
    for phase in _phases(spec):
        rows = read_state(phase.output_dir / STATE_FILE)
        predictor.begin_phase(phase.runs, [r for r in phase.runs if finished_status(phase.run_dir(r), rows, r.run_id)])
    print(f"[sweep] {predictor.describe()}", file=out_stream)
    target, source = power
    if source is not None:
        from hf_optbench.study.power_plan import plan_power

        ratios = tuple(spec.budget.ratios) if spec.budget is not None else ()
        optimizers = len({r.optimizer for r in spec.runs} - {BASELINE})
        sizes = len({r.model_size for r in spec.runs})
        seeds = len({r.seed for r in spec.runs if r.budget_multiple in (None, 1, 1.0)})
        print(f"[sweep] {plan_power(ratios, optimizers, sizes, seeds, source, target).describe()}", file=out_stream)
    return counts


def _todo(spec: SweepSpec, retry_failed: bool, retry_once: bool, rerun_changed: bool,
          out_stream: Any) -> list[RunSpec]:
    """The runs of a phase to launch: unfinished, failed ones asked to retry, and the finished runs whose settings
    the file changed (refused without ``rerun_changed``: study.kept_runs). Checked before anything is written."""
    check_summaries(spec)
    rows = read_state(spec.output_dir / STATE_FILE)
    todo, interrupted = [], []
    for run in spec.runs:
        status = finished_status(spec.run_dir(run), rows, run.run_id)
        failed = status in ("failed", "oom")
        if status is None or (failed and (retry_failed or (retry_once and attempt_number(rows, run.run_id) <= 2))):
            todo.append(run)
        if status is None and read_identity(spec.run_dir(run)) is not None:  # started, stopped before its end
            interrupted.append(run)
    return keep_current(spec, todo, rerun_changed, lambda text: print(f"[sweep] {text}", file=out_stream, flush=True),
                        interrupted)


def _run_phase(spec: SweepSpec, max_runs: int | None, retry_failed: bool, out_stream: Any,
               sweep_copy: bool, retry_once: bool = False, rerun_changed: bool = False,
               progress: Progress | None = None, pool: WorkerPool | None = None, before: int = 0,
               later: list[RunSpec] | None = None) -> tuple[dict[str, int], int]:
    """Run (or continue) one phase's runs; (counts by status, runs launched). ``retry_once``: a run that failed on
    its only attempt runs once more (the tuning phase: a grid point lost to a crash must not silently move the
    tuned value). ``progress`` and ``pool``: the whole sweep's (one count and ETA, warm workers kept), with
    ``before`` runs of earlier phases and ``later`` runs of later ones to count."""
    todo = _todo(spec, retry_failed, retry_once, rerun_changed, out_stream)
    _write_manifest(spec, sweep_copy, relaunch={r.run_id for r in todo})
    state = spec.output_dir / STATE_FILE
    rows = read_state(state)
    done = len(spec.runs) - len(todo)
    progress = progress or Progress(len(spec.runs), done, out_stream)
    queued = {r.run_id for r in todo}
    progress.begin_phase(before, done, len(spec.runs), later or [], phase=spec,
                         finished=[r for r in spec.runs if r.run_id not in queued])
    progress.say(f"{spec.name}: {len(spec.runs)} runs, {done} already finished, {len(todo)} to run "
                 f"-> {spec.output_dir}")
    if max_runs is not None:
        todo = todo[:max_runs]
    if todo and spec.launcher["executor"] == "slurm":
        run_slurm(spec, todo, state, rows, progress)
    elif todo:
        run_local(spec, todo, state, rows, progress, after_each=lambda: _refresh_summary(spec), pool=pool)
    rows = read_state(state)
    _refresh_summary(spec)
    counts = _counts(spec, rows)
    progress.say("finished: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return counts, len(todo)


def _tune_until_bracketed(spec: SweepSpec, max_runs: int | None, retry_failed: bool, out_stream: Any,
                          rerun_changed: bool = False, progress: Progress | None = None,
                          pool: WorkerPool | None = None) -> tuple[dict[str, int], int | None, bool]:
    """The tuning phase as a loop: run its pending runs, let the tuner add the runs its finished results call for
    (a step beyond an edge holding the best, the weight-decay grid: study.tuning_phase.extend_tuning), repeat until
    it adds none. (counts, max_runs left, finished). A tuning run that failed (a crash, a killed worker) runs once
    more before its point counts; ``--retry_failed`` also applies to the first pass. A run that fails twice is
    final, its point counts as a rise of the loss, and the tuned file and the report say so
    (study.tuning.tune_phase)."""
    from hf_optbench.study.tuning_phase import extend_tuning

    assert spec.tuning is not None

    def say(text: str) -> None:
        print(f"[sweep] tuning: {text}", file=out_stream, flush=True)

    while True:
        counts, launched = _run_phase(spec.tuning, max_runs, retry_failed, out_stream, sweep_copy=False,
                                      retry_once=True, rerun_changed=rerun_changed, progress=progress, pool=pool,
                                      later=_unfinished(spec))
        max_runs = None if max_runs is None else max_runs - launched
        if set(counts) - {"completed", "diverged", "failed", "oom"}:  # stopped early: tune and compare later
            return counts, max_runs, False
        if _failed_once(spec.tuning) and (max_runs is None or max_runs > 0):
            say("retrying the run(s) that failed on their first attempt, once")
            continue
        if not extend_tuning(spec, say):
            return counts, max_runs, True
        retry_failed = False


def _unfinished(spec: SweepSpec) -> list[RunSpec]:
    """The phase's runs still to run (for the sweep's ETA while an earlier phase runs)."""
    rows = read_state(spec.output_dir / STATE_FILE)
    return [run for run in spec.runs if finished_status(spec.run_dir(run), rows, run.run_id) is None]


def _failed_once(spec: SweepSpec) -> list[str]:
    """The runs of a phase that failed (or ran out of memory) on their only attempt."""
    rows = read_state(spec.output_dir / STATE_FILE)
    return [run.run_id for run in spec.runs if finished_status(spec.run_dir(run), rows, run.run_id) in ("failed", "oom")
            and attempt_number(rows, run.run_id) <= 2]


def _tune_then_attach(spec: SweepSpec, out_stream: Any) -> None:
    """Select the tuned values, write them (tune_phase checks that every compared optimizer x size has one), and
    point the comparison runs at them."""
    from hf_optbench.study.tuning_phase import tune_phase

    paths, warnings = tune_phase(spec)
    for w in warnings:
        print(f"[sweep] tuning warning: {w}", file=out_stream, flush=True)
    print(f"[sweep] tuned learning rates -> {', '.join(map(str, paths))}", file=out_stream, flush=True)
    attach_tuned_file(spec)


def run_sweep(path: str | os.PathLike[str], *, output_dir: str | None = None, dry_run: bool = False,
              max_runs: int | None = None, retry_failed: bool = False, stream: Any = None,
              rerun_changed: bool = False, target_trend: float | None = None,
              power_from: str | None = None) -> dict[str, int]:
    """Run (or continue) a sweep: with ``tune:``, the tuning phase, the tuned-values file, then the comparison.
    Returns counts by status of every run of both phases ("pending" for those not run). Bad sweep files raise
    OptBenchError before anything is launched; an optimizer x size the tuning could not tune, before the
    comparison starts. A finished run whose settings the file changed is refused, or with ``rerun_changed``
    moved aside and run again (study.kept_runs). ``target_trend`` / ``power_from`` (dry run only): the seeds a trend
    along data needs, from an earlier sweep's spread (study.power_plan)."""
    out_stream = stream or sys.stdout
    spec = load_sweep(path, output_dir)
    check_job_script_values(spec)  # a line break the SLURM job script would run as a command: refused now
    if spec.launcher.get("validate", True):
        validate_runs(spec)
    else:
        for phase in _phases(spec):
            resolve_grid(phase)
    if dry_run:
        return _dry_run(spec, out_stream, (target_trend, power_from))
    from hf_optbench.study.eta import predictor_for

    # one progress count and ETA, and one set of warm workers, for every phase of the sweep
    with sweep_lock(spec.output_dir), WorkerPool(str(spec.output_dir / WORKER_LOG)) as pool:
        progress = Progress(0, 0, out_stream, predictor=predictor_for(spec))
        progress.say(progress.predictor.describe())
        counts: dict[str, int] = {}
        if spec.tuning is not None:
            _todo(spec.tuning, retry_failed, True, rerun_changed, out_stream)  # a refusal before anything is written
            _write_manifest(spec)  # the whole sweep's file and matrix, before its first (tuning) run
            counts, max_runs, finished = _tune_until_bracketed(spec, max_runs, retry_failed, out_stream,
                                                               rerun_changed, progress, pool)
            if not finished:  # stopped early: compare later
                return _add(counts, {"pending": len(spec.runs)})
            progress.predictor.settle("tune")
            _tune_then_attach(spec, out_stream)
        before = len(spec.tuning.runs) if spec.tuning is not None else 0
        compared, tuned = _compare_until_uncensored(spec, max_runs, retry_failed, out_stream, rerun_changed, progress,
                                                    pool, before)
        counts = _add(tuned if tuned is not None else counts, compared)
        if spec.second_draw is not None and set(counts) <= {"completed", "diverged", "failed", "oom"}:
            counts = _add(counts, _second_draw(spec, max_runs, retry_failed, out_stream, rerun_changed, progress,
                                               pool))
        if not set(counts) - {"completed", "diverged", "failed", "oom"}:  # the whole sweep ran: measure its steps
            _calibrate(spec, progress)
        return counts


def _second_draw(spec: SweepSpec, max_runs: int | None, retry_failed: bool, out_stream: Any, rerun_changed: bool,
                 progress: Progress, pool: WorkerPool) -> dict[str, int]:
    """The second tuning draw (study.second_draw_phase), once the comparison has finished: the drawn cells' tuning
    at the draw's seed, its tuned file, then the comparison runs whose tuned values it changed."""
    from hf_optbench.study.eta import DRAW
    from hf_optbench.study.second_draw_phase import draw_comparison, draw_spec

    draw = draw_spec(spec)
    if progress.predictor is not None:
        progress.predictor.begin_draw()
    counts, max_runs, finished = _tune_until_bracketed(draw, max_runs, retry_failed, out_stream, rerun_changed,
                                                       progress, pool)
    if not finished:
        return counts
    if progress.predictor is not None:
        progress.predictor.settle(DRAW + "tune")
    _tune_then_attach(draw, out_stream)
    draw_comparison(spec, draw, lambda text: print(f"[sweep] second draw: {text}", file=out_stream, flush=True))
    if progress.predictor is not None:  # its reruns are known now
        progress.predictor.settle(DRAW + "compare")
    compared, _ = _run_phase(draw, max_runs, retry_failed, out_stream, sweep_copy=False, rerun_changed=rerun_changed,
                             progress=progress, pool=pool)
    return _add(counts, compared)


def _calibrate(spec: SweepSpec, progress: Progress) -> None:
    """The sweep-end step-time calibration (study.calibration), alone: every run has ended."""
    from hf_optbench.study.calibration import run_sweep_calibration

    run_sweep_calibration(spec, progress.say)
    if progress.predictor is not None:
        progress.predictor.settle("calibration")


def _compare_until_uncensored(spec: SweepSpec, max_runs: int | None, retry_failed: bool, out_stream: Any,
                              rerun_changed: bool = False, progress: Progress | None = None,
                              pool: WorkerPool | None = None,
                              before: int = 0) -> tuple[dict[str, int], dict[str, int] | None]:
    """The comparison phase as a loop (issue 29): the compared runs, the attribution runs (study.comparison_runs),
    then, while a compared run beats the ladder's top rung, that rung's tuning and a rung at twice its budget for
    every seed of the size, up to the ladder's cap. (counts of the comparison and attribution runs, counts of the
    tuning phase when it ran again)."""
    from hf_optbench.study.comparison_runs import attribution_phase, extend_ladder

    def say(text: str) -> None:
        print(f"[sweep] ladder: {text}", file=out_stream, flush=True)

    tuned = None
    while True:
        counts, launched = _run_phase(spec, max_runs, retry_failed, out_stream, sweep_copy=True,
                                      rerun_changed=rerun_changed, progress=progress, pool=pool, before=before)
        max_runs = None if max_runs is None else max_runs - launched
        attribution = attribution_phase(spec)
        if attribution is not None:
            extra, launched = _run_phase(attribution, max_runs, retry_failed, out_stream, sweep_copy=False,
                                         rerun_changed=rerun_changed, progress=progress, pool=pool,
                                         before=before + len(spec.runs))
            max_runs = None if max_runs is None else max_runs - launched
            counts = _add(counts, extra)
        if progress is not None and progress.predictor is not None:
            progress.predictor.settle("attribution")
        if set(counts) - {"completed", "diverged", "failed", "oom"} or not extend_ladder(spec, say):
            if progress is not None and progress.predictor is not None:
                progress.predictor.settle("compare")
            return counts, tuned
        if spec.tuning is not None:  # the new rung's own learning rate first, as every rung's
            tuned, max_runs, finished = _tune_until_bracketed(spec, max_runs, retry_failed, out_stream,
                                                              rerun_changed, progress, pool)
            if not finished:
                return counts, tuned
            _tune_then_attach(spec, out_stream)
