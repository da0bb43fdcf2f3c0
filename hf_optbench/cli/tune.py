"""``hf-optbench tune SWEEP_DIR``: the best learning-rate multiplier per optimizer and size of a tuning sweep (by mean
``final_tuning_loss``, the held-out tuning split), written where recipes read it (``--tuned_hparams_file``). A sweep
with a ``tune:`` section does this itself; this command is for a tuning grid run by hand, or to write again (by the
same function, :func:`hf_optbench.study.tuning_phase.write_tuned`) what such a sweep's ``tuning/`` directory holds."""

from __future__ import annotations

import sys

from hf_optbench.cli import ArgumentParser
from hf_optbench.cli.report import TUNING_SUMMARY_KEYS, check_sweep_dir
from hf_optbench.rundir import TUNED_FILE

DESCRIPTION = ("Writes the best learning-rate multiplier per optimizer and size of a tuning sweep (by mean "
               "final_tuning_loss, the held-out tuning split) where recipes read it (--tuned_hparams_file). A sweep "
               "with a tune: section does this itself; this command is for a tuning grid run by hand, or to write "
               "again what such a sweep's tuning/ directory holds.")


def main(argv: list[str] | None = None) -> int:
    """Write (merge into) the tuned-values YAML and say where, one line per file; warnings (a best value at the grid's edge, a size where
    every multiplier diverged) go to stderr."""
    from hf_optbench.study import tuning_phase

    parser = ArgumentParser(prog="hf-optbench tune", description=DESCRIPTION)
    parser.add_argument("sweep_dir", help="output directory of a sweep with matrix.lr_multipliers (or the tuning/ "
                                          "folder of a sweep with a tune: section)")
    parser.add_argument("--output", default=TUNED_FILE, help="YAML to write (merged into a tuned file hf-optbench "
                                                             "wrote; any other existing file is refused)")
    args = parser.parse_args(argv)
    check_sweep_dir(args.sweep_dir, TUNING_SUMMARY_KEYS)  # a missing folder, a corrupt manifest or summary.json: exit 2, one line
    paths, warnings = tuning_phase.tune(args.sweep_dir, args.output)  # one file per data ratio of the sweep
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for path in paths:  # the file itself is the record; its path is what a user needs next (--tuned_hparams_file)
        print(f"wrote {path}")
    return 0
