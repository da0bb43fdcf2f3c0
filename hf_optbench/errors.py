"""One exception type for every user mistake, so the CLI can turn it into exit code 2.

Raise :class:`OptBenchError` for bad input (unknown key, missing file, impossible value). The message
must name the offending key/value *and* the fix. It is raised before any expensive work (model build,
tokenization, training), and never after a run directory holds finished results.
"""

from __future__ import annotations


class OptBenchError(ValueError):
    """A user-facing error: the message says what is wrong and how to fix it. CLI exit code 2."""

    exit_code = 2
