"""publish/card.py's rerun command: every path in it a single shell word, so a pasted line never runs what a
directory's name holds (``$(touch x)``, spaces)."""

from __future__ import annotations

import shlex

from hf_optbench.publish.card import rerun_command


def test_the_rerun_command_quotes_its_paths() -> None:
    config, out = "/runs/a $(touch PWNED)/config.yaml", "/runs/b c_rerun"
    line = rerun_command(None, config, out)
    assert shlex.split(line) == ["hf-optbench", "run", config, "--output_dir", out]
    assert rerun_command(None, "/runs/x/config.yaml", "NEW_DIR") == \
        "hf-optbench run /runs/x/config.yaml --output_dir NEW_DIR"  # plain paths stay as they are
