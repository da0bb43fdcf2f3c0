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
import time
from typing import Any

from hf_optbench.publish.redact import redact_argv
from hf_optbench.rundir import BASELINE, FINAL_STATUSES, STATE_FILE, finished_status, read_state
from hf_optbench.study.kept_runs import changed_runs
from hf_optbench.study.launch import WORKER_LOG, build_command
from hf_optbench.study.slurm import check_job_script_values
from hf_optbench.study.sweep_plan import plan
from hf_optbench.study.sweep_session import SweepSession, add_counts, phase_counts
from hf_optbench.study.sweep_spec import SweepSpec, attach_tuned_file, load_sweep, resolve_grid, validate_runs
from hf_optbench.study.sweep_state import Progress, sweep_lock
from hf_optbench.study.worker_client import WorkerPool


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
        counts = add_counts(counts, phase_counts(phase, rows))
    predictor = predictor_for(spec)
    for phase in _phases(spec):
        rows = read_state(phase.output_dir / STATE_FILE)
        predictor.begin_phase(phase.runs, [r for r in phase.runs if finished_status(phase.run_dir(r), rows, r.run_id)])
    print(f"[sweep] {predictor.describe()}", file=out_stream)
    target, source = power
    if source is not None:
        from hf_optbench.study.power_plan import data_design, plan_power

        ratios, shared = data_design((r.model_size, r.budget_tpp) for r in spec.runs if r.budget_tpp is not None)
        optimizers = len({r.optimizer for r in spec.runs} - {BASELINE})
        sizes = len({r.model_size for r in spec.runs})
        size_cells = optimizers * shared if spec.report.is_primary("speedup", "size") else 0
        seeds = len({r.seed for r in spec.runs if r.budget_multiple in (None, 1, 1.0)})
        plan = plan_power(ratios, optimizers, sizes, seeds, source, target, size_cells)
        print(f"[sweep] {plan.describe()}", file=out_stream)
    return counts


def run_sweep(path: str | os.PathLike[str], *, output_dir: str | None = None, dry_run: bool = False,
              max_runs: int | None = None, retry_failed: bool = False, stream: Any = None,
              rerun_changed: bool = False, target_trend: float | None = None,
              power_from: str | None = None) -> dict[str, int]:
    """Run (or continue) a sweep: with ``tune:``, the tuning phase, the tuned-values file, then the comparison.
    Returns counts by status of every run of both phases ("pending" for those not run). Bad sweep files raise
    OptBenchError before anything is launched; an optimizer x size the tuning could not tune, before the
    comparison starts. A finished run whose settings the file changed is refused, or with ``rerun_changed``
    moved aside and run again (study.kept_runs). ``target_trend`` / ``power_from`` (dry run only): the seeds a trend
    along data needs, from an earlier sweep's spread (study.power_plan). Which runs come next is the planner's
    (study.sweep_plan); what one invocation threads through its phases, the session's (study.sweep_session)."""
    started = time.monotonic()  # the sweep's clock counts its start-up (validation, the step measurement)
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
        predictor = predictor_for(spec)
        progress = Progress(predictor.expected_runs()[0], 0, out_stream, predictor=predictor, t0=started)
        progress.say(progress.predictor.describe())
        session = SweepSession(out_stream, progress, pool, retry_failed=retry_failed, rerun_changed=rerun_changed,
                               max_runs=max_runs)
        planned = plan(spec, session)
        while todo := next(planned, None):
            session.run(todo)
        counts = session.totals()
        if not set(counts) - set(FINAL_STATUSES):  # the whole sweep ran: measure its steps
            _calibrate(spec, session)
        return counts


def _calibrate(spec: SweepSpec, session: SweepSession) -> None:
    """The sweep-end step-time calibration (study.calibration), alone: every run has ended."""
    from hf_optbench.study.calibration import run_sweep_calibration

    run_sweep_calibration(spec, session.progress.say)
    session.predictor.settle("calibration")
