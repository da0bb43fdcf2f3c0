"""One exception type for every user mistake, so the CLI can turn it into exit code 2.

Raise :class:`OptBenchError` for bad input (unknown key, missing file, impossible value). The message
must name the offending key/value *and* the fix. It is raised before any expensive work (model build,
tokenization, training), and never after a run directory holds finished results.
"""

from __future__ import annotations

from collections.abc import Iterable


class OptBenchError(ValueError):
    """A user-facing error: the message says what is wrong and how to fix it. CLI exit code 2."""

    exit_code = 2


def suggest(name: str, choices: Iterable[str], cutoff: float = 0.5) -> str:
    """" Did you mean 'x'?" for the closest of ``choices`` to a mistyped ``name``, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=cutoff)
    return f" Did you mean '{close[0]}'?" if close else ""
