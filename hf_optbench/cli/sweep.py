"""``hf-optbench sweep SWEEP.yaml``: run (or continue) a sweep; the sweep file format is the help text."""

from __future__ import annotations

import argparse
import sys

from hf_optbench.cli import ArgumentParser
from hf_optbench.errors import OptBenchError


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every run finished (completed/diverged) or is still pending, 1 when one failed, 130 when the
    sweep was interrupted (Ctrl-C or SIGTERM: the runs in flight are stopped within seconds and one line names them;
    the same command reruns them; a second signal stops at once: study.stopping)."""
    from hf_optbench.study import sweep
    from hf_optbench.study.stopping import stop_on_signals

    parser = ArgumentParser(prog="hf-optbench sweep", description=sweep.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="sweep YAML (see recipes/sweeps/)")
    parser.add_argument("--output_dir", default=None, help="sweep directory (default: the file's output_dir)")
    parser.add_argument("--dry_run", action="store_true", help="validate and print each run's status and command")
    parser.add_argument("--max_runs", type=int, default=None, help="start at most N runs, then stop")
    parser.add_argument("--retry_failed", action="store_true", help="run failed/oom runs again (old dir moved aside)")
    parser.add_argument("--rerun_changed", action="store_true",
                        help="run again the finished runs whose settings the edited sweep file changed (each old "
                             "dir moved aside to <run_id>.changed-N); without it such a sweep is refused")
    args = parser.parse_args(argv)
    if args.max_runs is not None and args.max_runs < 0:
        raise OptBenchError(f"--max_runs must be >= 0, got {args.max_runs}.")

    with stop_on_signals() as stop:  # SIGINT and SIGTERM alike: runs in flight stopped, a second signal at once
        try:
            counts = sweep.run_sweep(args.sweep_file, output_dir=args.output_dir, dry_run=args.dry_run,
                                     max_runs=args.max_runs, retry_failed=args.retry_failed,
                                     rerun_changed=args.rerun_changed)
        except KeyboardInterrupt:
            print(stop.line(), file=sys.stderr, flush=True)
            if stop.name is not None:  # a signal: exit now (stop.exit_now says why), never a traceback on a second
                stop.exit_now(130)
            return 130
    return 0 if not set(counts) - {"completed", "diverged", "pending"} else 1
