"""The report of a sweep: tables, plots and the scaling verdict, as Markdown, HTML (plots embedded), CSV and PNG.
report.md opens with the answer (report/short_report.py, about a page); evidence.md holds every
table behind it; report.html holds both, the evidence's sections collapsed.

    hf-optbench report runs/cpu_demo [--output runs/cpu_demo/report] [--target-loss 5.0 | tiny=6.1,mini=5.4]

Three parts: :mod:`~hf_optbench.report.analysis` computes every number once (records, targets, derived columns,
verdicts); each section of the report is one module of :mod:`hf_optbench.report.sections` (its tables as column
specs, :mod:`~hf_optbench.report.tables`, its legend, text and plots; :mod:`~hf_optbench.report.figures` writes the
PNGs); this module orders the sections in one :class:`Doc`, rendered to both Markdown and HTML.
Means over seeds are arithmetic in the tables; the plots draw every seed. Besides report.md / report.html:
summary.csv (one row per run) and runs.parquet (every metrics row of every run, :mod:`~hf_optbench.report.export`).
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.report.analysis import DERIVED_COLUMNS, analyse
from hf_optbench.report.figures import write_plots
from hf_optbench.report.sections.attribution import attribution_line
from hf_optbench.report.sections.convergence import convergence_section
from hf_optbench.report.sections.hyperparameters import bracketing_note, hyperparameters_section
from hf_optbench.report.sections.memory import memory_section
from hf_optbench.report.sections.overview import overview_section
from hf_optbench.report.sections.ratios import ratios_section
from hf_optbench.report.sections.regime import reference_section
from hf_optbench.report.sections.runs import runs_section
from hf_optbench.report.sections.speedup import speedup_section
from hf_optbench.report.sections.throughput_stability import throughput_stability_section
from hf_optbench.report.sections.verdict import verdict_section
from hf_optbench.rundir import write_text_atomic
from hf_optbench.study.records import write_summary_csv

# A table a reader takes in at once. A wider one is split into tables of at most MAX_COLUMNS, each
# repeating its key columns; a Markdown cell longer than MAX_CELL characters continues on rows below it (split at
# "; ", then ", ", then a space), the other columns left empty there. The HTML keeps every cell whole.
MAX_COLUMNS = 9
MAX_CELL = 120


def split_wide(header: Sequence[str], rows: Sequence[Sequence[str]], keep: int = 1
               ) -> list[tuple[list[str], list[list[str]]]]:
    """A table as tables of at most :data:`MAX_COLUMNS` columns, each led by the first ``keep`` columns."""
    if len(header) <= MAX_COLUMNS:
        return [(list(header), [list(r) for r in rows])]
    step = MAX_COLUMNS - keep
    out = []
    for start in range(keep, len(header), step):
        cols = list(range(keep)) + list(range(start, min(start + step, len(header))))
        out.append(([header[i] for i in cols], [[r[i] for i in cols] for r in rows]))
    return out


SEPARATORS = ("; ", " -> ", ", ", " ")  # coarsest first: a clause, an arrow between two figures, a list item, a word


def wrap_cell(text: str, limit: int = MAX_CELL, seps: Sequence[str] = SEPARATORS) -> list[str]:
    """``text`` as pieces of at most ``limit`` characters, cut at the coarsest boundary that fits (each piece keeps
    the separator it was cut at, so the pieces read back as the text)."""
    if len(text) <= limit:
        return [text]
    if not seps:
        return [text[i:i + limit] for i in range(0, len(text), limit)]
    sep, rest = seps[0], seps[1:]
    parts = text.split(sep)
    if len(parts) == 1:
        return wrap_cell(text, limit, rest)
    units = [u for i, part in enumerate(parts)
             for u in wrap_cell(part + (sep.rstrip() if i < len(parts) - 1 else ""), limit, rest)]
    out = [units[0]]
    for unit in units[1:]:
        if len(out[-1]) + 1 + len(unit) <= limit and sep.endswith(" "):
            out[-1] += " " + unit
        else:
            out.append(unit)
    return out


class Doc:
    """Blocks rendered to both Markdown and HTML, so the two reports never disagree."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]], keep: int = 1) -> None:
        """A table (split by :func:`split_wide` where it is wider than :data:`MAX_COLUMNS`)."""
        for part in split_wide([str(h) for h in header], [[str(c) for c in r] for r in rows], keep):
            self.blocks.append(("table", part))

    def img(self, path: Path, alt: str) -> None:
        self.blocks.append(("img", (path, alt)))

    def markdown(self, base: Path) -> str:
        out = []
        for kind, val in self.blocks:
            if kind == "h":
                out.append("#" * val[0] + " " + val[1])
            elif kind == "p":
                out.append(val)
            elif kind == "table":
                header, rows = val
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "|".join("---" for _ in header) + "|")
                for r in rows:
                    pieces = [wrap_cell(c.replace("|", "\\|").replace("\n", " ")) for c in r]
                    out += ["| " + " | ".join(p[i] if i < len(p) else "" for p in pieces) + " |"
                            for i in range(max(map(len, pieces), default=1))]
            elif kind == "img":
                out.append(f"![{val[1]}]({os.path.relpath(val[0], base)})")
            out.append("")
        return "\n".join(out)

    def html_body(self, collapse: bool = False) -> list[str]:
        """The blocks as HTML; with ``collapse`` each level-2 section is a closed ``<details>`` (the evidence)."""
        out: list[str] = []
        is_open = False
        for kind, val in self.blocks:
            if kind == "h" and collapse and val[0] == 2:
                out += (["</details>"] if is_open else []) + [f"<details><summary><b>{html.escape(val[1])}</b>"
                                                               "</summary>"]
                is_open = True
            elif kind == "h":
                out.append(f"<h{val[0]}>{html.escape(val[1])}</h{val[0]}>")
            elif kind == "p":
                out.append("<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(val)) + "</p>")
            elif kind == "table":
                header, rows = val
                out.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in header) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows]
                out.append("</table>")
            elif kind == "img":
                data = base64.b64encode(Path(val[0]).read_bytes()).decode("ascii")
                out.append(f"<p><img alt='{html.escape(val[1])}' src='data:image/png;base64,{data}'></p>")
        return out + (["</details>"] if is_open else [])

    def html(self, title: str, evidence: Doc | None = None) -> str:
        """One page: these blocks, then ``evidence``'s with each of its sections collapsed."""
        out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
               "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
               "img{max-width:100%}code{background:#f6f6f6}summary{margin:0.6em 0;cursor:pointer}</style>"
               "</head><body>"]
        out += self.html_body()
        if evidence is not None:
            out += evidence.html_body(collapse=True)
        out.append("</body></html>")
        return "\n".join(out)


# ------------------------------------------------------------------------------------------------- report
# The manifest a report leaves in its folder: the folder is a report's, and these are the files it wrote.
REPORT_MARKER = ".hf_optbench_report"
# What a report writes besides its plots (*.png); a file of another name in its folder is never one of its own.
REPORT_FILES = ("report.md", "evidence.md", "report.html", "summary.csv", "runs.parquet")


def _report_manifest(out: Path) -> list[str] | None:
    """The names an earlier report recorded in ``out``, or None when no report left a readable manifest there."""
    import json

    try:
        files = json.loads((out / REPORT_MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(n) for n in files] if isinstance(files, list) else None


def _report_output(name: str) -> bool:
    """Whether ``name`` is one a report writes (or a report's temporary file of it, ``rundir.atomic_path``'s)."""
    base = name.split(".tmp-", 1)[0]
    return base in REPORT_FILES or base == REPORT_MARKER or base.endswith(".png")


def check_report_folder(out: Path) -> None:
    """Refuse (exit 2, nothing written) a report folder holding files no report wrote, naming them. A folder with a
    report's manifest may hold that report's outputs (replaced by the new ones) and any file of the names a report
    writes (another report of it may be writing at this moment); one without (the user's folder: their own
    report.md and summary.csv) may hold nothing, since a report would replace those files without a word."""
    if not out.is_dir():
        return
    recorded = _report_manifest(out)
    entries = sorted(p.name for p in out.iterdir())
    theirs = [n for n in entries if not n.startswith(REPORT_MARKER) and (
        recorded is None or not (n in recorded or _report_output(n)))]
    if theirs:
        shown = ", ".join(theirs[:8]) + (f" and {len(theirs) - 8} more" if len(theirs) > 8 else "")
        raise OptBenchError(
            f"report folder '{out}' holds files no hf-optbench report wrote ({shown}), which a report could replace. "
            "Choose another --output (or an empty folder), or move those files away.")


def _record_report(out: Path, names: Sequence[str]) -> None:
    """Add ``names`` to the report manifest of ``out`` (written first, so a folder being filled is a report's)."""
    from hf_optbench.rundir import write_json_atomic

    files = sorted(set(_report_manifest(out) or []) | set(names))
    write_json_atomic(out / REPORT_MARKER, {"made_by": "hf_optbench.report", "files": files})


def build_report(sweep_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None,
                 target_loss: float | dict[str, float] | None = None,
                 tuning_dir: str | os.PathLike[str] | None = None,
                 include_transient: bool | None = None) -> dict[str, Path]:
    """Write report.md (the answer, ``report.short_report``), evidence.md (everything behind it), report.html (both,
    the evidence collapsed), summary.csv, runs.parquet and the PNG plots; returns their paths by name.
    ``tuning_dir``: a tuning sweep whose runs give the tuning curves; ``include_transient``: transient cells back in
    the trends (:func:`report.analysis.analyse`)."""
    from hf_optbench.report.export import write_runs_parquet
    from hf_optbench.report.sections.rate_transfer import (
        plot_transfer,
        transfer_line,
        transfer_rows,
        transfer_section,
    )
    from hf_optbench.report.sections.time_to_quality import time_line, time_section
    from hf_optbench.report.sections.tuning_noise import noise_section, tuning_noise_line
    from hf_optbench.report.short_report import answer_tables, plot_and_link

    sweep = Path(sweep_dir)
    out = Path(output) if output else sweep / "report"
    check_report_folder(out)  # a folder of the user's is never written into
    an = analyse(sweep, target_loss, tuning_dir=tuning_dir, include_transient=include_transient)
    out.mkdir(parents=True, exist_ok=True)
    _record_report(out, [])
    files: dict[str, Path] = {"summary.csv": write_summary_csv(an.all_records, out / "summary.csv", DERIVED_COLUMNS)}
    files["runs.parquet"] = write_runs_parquet(an.all_records, an.metrics, out / "runs.parquet")
    files.update(write_plots(an, out))
    transfers = transfer_rows(an)
    if (plot := plot_transfer(transfers, out / "rate_transfer.png")) is not None:
        files["rate_transfer.png"] = plot
    name = sweep.resolve().name
    evidence = Doc()
    overview_section(evidence, an, f"Evidence: {name}")
    evidence.p("The answer, in short: [report.md](report.md). Below, everything it rests on.")
    verdict_section(evidence, an, files)
    noise_section(evidence, an)
    regime, reg = an.regime_text, an.regime
    reference_section(evidence, an, reg)
    ratios_section(evidence, an, files)
    speedup_section(evidence, an)
    time_section(evidence, an)
    transfer_section(evidence, transfers, files)
    memory_section(evidence, an, files)
    convergence_section(evidence, an, files)
    hyperparameters_section(evidence, an, files)
    throughput_stability_section(evidence, an, files)
    runs_section(evidence, an)
    short = Doc()
    overview_section(short, an, f"Optimizer benchmark report: {name}", question=True)
    answer_tables(short, an)
    bracketing_note(short, an)
    for line in (regime, attribution_line(an), tuning_noise_line(an), time_line(an),
                 transfer_line(transfers)):
        if line:
            short.p(line)
    plot_and_link(short, files)
    files["report.md"] = write_text_atomic(out / "report.md", short.markdown(out))
    files["evidence.md"] = write_text_atomic(out / "evidence.md", evidence.markdown(out))
    files["report.html"] = write_text_atomic(out / "report.html", short.html(f"hf_optbench report: {name}", evidence))
    _record_report(out, [p.name for p in files.values()])
    return files
