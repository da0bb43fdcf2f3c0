"""``hf-optbench sweep SWEEP.yaml``: run (or continue) a sweep; the sweep file format is the help text."""

from __future__ import annotations

import argparse
import sys

from hf_optbench.cli import ArgumentParser, wrap_help
from hf_optbench.errors import OptBenchError

# The help page: the sweep file's format and what a sweep does, in plain text at 100 columns (the module docstring
# of hf_optbench.study.sweep is the full account, for readers of the code).
DESCRIPTION = wrap_help("""\
Runs a sweep: a base recipe x a matrix of optimizers, model sizes and seeds, one process per run, tuning
first, restartable (stop it and run it again: finished runs are skipped).

Sweep file (YAML; recipes/sweeps/ holds examples):

  base: recipes/quickstart_cpu.yaml    # a run recipe (relative: current dir, then the sweep file's)
  output_dir: runs/cpu_demo            # the sweep directory, relative to the current directory
  overrides: {max_steps: 60}           # recipe keys for every run
  matrix:
    optimizer: [adamw, lion]
    model_size: [tiny, mini]
    seed: [0, 1]
    lr_multipliers: [0.5, 1, 2]        # optional: a learning-rate grid by hand (x the resolved lr)
  tune:                                # optional: tune every optimizer x size, then compare
    lr_multipliers: [0.5, 1, 2]        # the first grid (>= 3 points around x1, the cited default),
    lr_grid: {low: 0.25, high: 4}      #   or factor-2 steps from low to high
    max_extensions: 3                  # points the tuner may add beyond an edge holding the best
    wd_multipliers: [0.333333, 1, 3]   # weight decay x the cited value (optimizers that tune it)
    nonmatrix_multipliers: [0.25, 0.5, 1, 2]  # non-matrix group's rate x the tuned rate; [] off
    seed: [0]                          # seeds of the tuning runs
    confirm_seeds: [1000, 1001]        # more seeds where a choice is within the seed noise
    confirm_rungs: true                # the same for the ladder rungs' rates
  budget: {tokens_per_param: 0.5}      # optional: max_steps per size for this data per parameter;
                                       #   a list ([0.5, 2]) runs the protocol at each ratio
  # cells left out: budget: {..., exclude: [{model_size: mini, tokens_per_param: 2}]}
  ladder:                              # optional: the baseline at multiples of the budget
    multiples: [0.25, 0.5, 1, 2]       #   (each a full schedule at its own tuned rate: speedups
    optimizer: adamw                   #   are read off it), doubled while a run beats the top
    max_multiple: 16                   #   rung, up to this multiple
  per_optimizer: {lion: {weight_decay: 1.0}}                   # recipe keys for one optimizer
  per_model_size: {gpt2-xl: {per_device_train_batch_size: 4}}  # recipe keys for one size
  launcher:
    type: accelerate                   # accelerate (default), python or command
    accelerate_config: accelerate_configs/cpu.yaml
    command: [...]                     # type command: an argv prefix taking a run's arguments
    executor: local                    # local (default) or slurm (submitit, one job per run)
    slurm: {partition: gpu, gpus_per_node: 4, timeout_min: 120}
    timeout_s: null                    # a per-run wall-clock limit (local executor)
    env: {}                            # environment of every run (secret values never written)
    validate: true                     # parse every run's arguments before the first starts
    jobs: auto                         # runs at once: one per GPU, else as many as the cores fit

With tune:, the tuning grid runs first into <output_dir>/tuning/, the best value by mean
final_tuning_loss (a held-out split: set tuning_blocks in overrides) goes to tuned_hparams.yaml, and the
comparison runs read it (tuning runs are never reused as comparison runs). Runs at once are each pinned to
their own cores (and GPU); summary.json records concurrent_runs and pinning, and the report marks
wall-clock figures measured while runs shared the machine. Every run gets W&B's group, tags, name and job
type. A restart resumes an unfinished run from its last checkpoint or moves it aside (nothing is deleted),
and stops only what its own sweep started.""")


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every run finished (completed/diverged) or is still pending, 1 when one failed, 130 when the
    sweep was interrupted (Ctrl-C or SIGTERM: the runs in flight are stopped within seconds and one line names them;
    the same command reruns them; a second signal stops at once: study.stopping)."""
    from hf_optbench.study import sweep
    from hf_optbench.study.stopping import stop_on_signals

    parser = ArgumentParser(prog="hf-optbench sweep", description=DESCRIPTION,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="sweep YAML (see recipes/sweeps/)")
    parser.add_argument("--output_dir", default=None, help="sweep directory (default: the file's output_dir)")
    parser.add_argument("--dry_run", action="store_true", help="validate and print each run's status and command")
    parser.add_argument("--max_runs", type=int, default=None, help="start at most N runs, then stop")
    parser.add_argument("--retry_failed", action="store_true", help="run failed/oom runs again (old dir moved aside)")
    parser.add_argument("--rerun_changed", action="store_true",
                        help="run again the finished runs whose settings the edited sweep file changed (each old "
                             "dir moved aside to <run_id>.changed-N); without it such a sweep is refused")
    parser.add_argument("--target_trend", type=float, default=None,
                        help="with --dry_run: the seeds needed to detect this trend of ln(speedup) per decade of data")
    parser.add_argument("--power_from", default=None,
                        help="with --dry_run: an earlier sweep's report/summary.csv (or sweep dir) whose seed spread "
                             "the power statement uses")
    args = parser.parse_args(argv)
    if (args.target_trend is not None or args.power_from is not None) and not args.dry_run:
        raise OptBenchError("--target_trend and --power_from plan seeds before a sweep: add --dry_run.")
    if args.target_trend is not None and args.power_from is None:
        raise OptBenchError("--target_trend needs --power_from: an earlier sweep's report/summary.csv whose seeds' "
                            "spread the plan uses (e.g. docs/results/cpu_study/summary.csv).")
    if args.max_runs is not None and args.max_runs < 0:
        raise OptBenchError(f"--max_runs must be >= 0, got {args.max_runs}.")

    with stop_on_signals() as stop:  # SIGINT and SIGTERM alike: runs in flight stopped, a second signal at once
        try:
            counts = sweep.run_sweep(args.sweep_file, output_dir=args.output_dir, dry_run=args.dry_run,
                                     max_runs=args.max_runs, retry_failed=args.retry_failed,
                                     rerun_changed=args.rerun_changed, target_trend=args.target_trend,
                                     power_from=args.power_from)
        except KeyboardInterrupt:
            print(stop.line(), file=sys.stderr, flush=True)
            if stop.name is not None:  # a signal: exit now (stop.exit_now says why), never a traceback on a second
                stop.exit_now(130)
            return 130
    lost = {k: n for k, n in counts.items() if k in ("failed", "oom") and n}
    if lost and not args.dry_run:  # the way on, named: the same command alone keeps them as they ended
        print(f"[sweep] {', '.join(f'{n} {k}' for k, n in lost.items())}: each run's stdout.log says why; run the same "
              "command with --retry_failed to run them again (their directories moved aside, kept)", file=sys.stderr)
    return 0 if not set(counts) - {"completed", "diverged", "pending"} else 1
