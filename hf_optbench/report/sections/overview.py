"""The opening of report.md and of evidence.md: the title, the question the benchmark asks (report.md only), what
the sweep ran (runs by status, optimizers, sizes and data ratios), the machine and the code it ran on, and the
analysis's notes."""

from __future__ import annotations

from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.rundir import BASELINE


def overview_section(doc: Any, an: Analysis, title: str, question: bool = False) -> None:
    """The title, the question (``question``: the short report's opening), the sweep and the machine, the notes
    (``doc``: report.build.Doc)."""
    ok = an.ok()
    env = next((r.summary.get("env") for r in ok if r.summary.get("env")), {}) or {}
    git = next((r.summary.get("git") for r in ok if r.summary.get("git")), {}) or {}
    statuses: dict[str, int] = {}
    for r in an.all_records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    doc.h(1, title)
    if question:
        data = " and as each parameter sees more data" if an.multi else ""
        ladder = f"; each speedup is read off {BASELINE}'s own budget ladder" if an.ladder else ""
        doc.p(f"**The question:** which optimizer trains a GPT-2-style model to a given loss on less data than tuned "
              f"{BASELINE}, and does its advantage hold as the model grows{data}? Every optimizer was tuned before "
              f"the comparison{ladder} (docs/METHOD.md).")
    grid = (f"sizes: {', '.join(an.model_sizes)}; tokens per parameter: {', '.join(f'{r:g}' for r in an.ratios)} "
            f"({len(an.sizes)} size x ratio cells)" if an.multi else f"sizes: {', '.join(an.sizes)}")
    doc.p(f"{len(an.all_records)} runs ({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}); "
          f"optimizers: {', '.join(an.optimizers)}; {grid}. "
          f"Device: {env.get('device', 'n/a')}; torch {((env.get('packages') or {}).get('torch')) or 'n/a'}, "
          f"transformers {((env.get('packages') or {}).get('transformers')) or 'n/a'}; "
          f"git {str(git.get('commit') or 'n/a')[:10]}{' (dirty)' if git.get('dirty') else ''}.")
    for note in an.notes:
        doc.p(f"Note: {note}.")
