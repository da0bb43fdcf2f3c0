"""The report of a sweep: tables, plots and the scaling verdict, as Markdown, HTML (plots embedded), CSV and PNG.
report.md opens with the answer (report/short_report.py, about a page); evidence.md holds every
table behind it; report.html holds both, the evidence's sections collapsed.

    hf-optbench report runs/cpu_demo [--output runs/cpu_demo/report] [--target-loss 5.0 | tiny=6.1,mini=5.4]

Three parts: :mod:`~hf_optbench.report.analysis` computes every number once (records, targets, derived columns,
verdicts), :mod:`~hf_optbench.report.plots` draws the PNGs, :mod:`~hf_optbench.report.tables` declares the tables
as column specs; this module lays them out in one :class:`Doc`, rendered to both Markdown and HTML.
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
from hf_optbench.report import legends as L
from hf_optbench.report import tables as T
from hf_optbench.report.analysis import DERIVED_COLUMNS, Analysis, analyse
from hf_optbench.report.plots import write_plots
from hf_optbench.report.reference import reference_section
from hf_optbench.report.sections import convergence as TT
from hf_optbench.report.sections.attribution import attribution_line, attribution_section
from hf_optbench.report.speedups import rung_rates_section
from hf_optbench.rundir import BASELINE, write_text_atomic
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


# ------------------------------------------------------------------------------------------------ sections
def _overview(doc: Doc, an: Analysis, title: str, question: bool = False) -> None:
    """The title, the question (``question``: the short report's opening), the sweep and the machine, the notes."""
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


def _verdict(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    from hf_optbench.measure.verdict import meanings

    doc.h(2, f"Scaling verdict (advantage over {BASELINE} as parameters grow)")
    if not an.verdicts:
        doc.p(f"No verdict: it needs completed {BASELINE} runs and at least one other optimizer.")
        return
    others = [o for o in an.optimizers if o != BASELINE]
    sized = not an.multi or len(an.model_sizes) > 1  # a sweep over ratios at one size has no size axis to show
    if an.multi:
        _size_axis_per_ratio(doc, an, others)
    else:
        doc.table(*T.render(T.verdict_columns(an), others))
    if sized:
        doc.p(L.verdict_legend(an))
    _bracketing(doc, an)
    if sized:
        doc.table(["verdict", "meaning"], [[k, v] for k, v in meanings("size").items()])
    if an.multi:  # the evidence of both axes, after both
        _data_axis(doc, an, files, others)
    doc.h(3, "Evidence")
    shown = [v for v in an.verdicts if sized or v.axis != "size"]
    doc.table(*T.render(T.evidence_columns(an), shown))
    doc.p(L.evidence_legend(shown))
    if not an.multi:
        _data_axis(doc, an, files, others)


def _size_axis_per_ratio(doc: Doc, an: Analysis, others: list[str]) -> None:
    """The size axis of a sweep over data ratios: one table per ratio every size ran, one line for the others."""
    from hf_optbench.measure.verdict import ratio_label

    ats = list(dict.fromkeys(v.at for v in an.verdicts_along("size")))
    if len(an.model_sizes) < 2:
        doc.p(f"This sweep ran one size ({an.model_sizes[0]}): the size axis needs two, so its verdict is along data "
              "per parameter only (below).")
        return
    for at in ats:
        doc.h(3, f"At {at}")
        doc.table(*T.render(T.verdict_columns(an, an.verdicts_along("size", at)), others))
    left = [ratio_label(r) for r in an.ratios if ratio_label(r) not in ats]
    if left:
        doc.p(f"No size-axis verdict at {', '.join(left)}: not every size ran there (the sweep left those cells out); "
              "those cells are judged along data per parameter below.")


def _data_axis(doc: Doc, an: Analysis, files: dict[str, Path], others: list[str]) -> None:
    """The verdict along data per parameter: per size a table, the legend, the speedup per ratio, the plot; one line
    for a sweep with one ratio."""
    from hf_optbench.measure.verdict import meanings

    doc.h(2, f"Data per parameter (advantage over {BASELINE} as each parameter sees more data)")
    if not an.multi:
        tpp = next((r.get("tokens_per_param") for r in an.ok() if r.get("tokens_per_param")), None)
        doc.p(f"This sweep ran one data budget{f' ({tpp:.3g} tokens per parameter)' if tpp else ''}, so nothing is "
              "measured along data: give budget.tokens_per_param a list (e.g. [0.5, 2]) to ask how the advantage "
              "changes with it.")
        return
    for size in dict.fromkeys(v.at for v in an.verdicts_along("data")):
        doc.h(3, f"At {size}")
        doc.table(*T.render(T.verdict_columns(an, an.verdicts_along("data", size)), others))
    doc.p(L.data_legend(an))
    doc.table(["verdict along data", "meaning"], [[k, v] for k, v in meanings("data").items()])
    header, rows = T.data_axis_table(an)
    if rows:
        doc.h(3, f"Speedup over {BASELINE} against tokens per parameter")
        doc.table(header, rows)
    if files.get("data_axis.png"):
        doc.img(files["data_axis.png"], "speedup against data per parameter")


def _bracketing(doc: Doc, an: Analysis) -> None:
    """Under the verdict table: whether every tuned optimum was bracketed (the loss rises on both sides of it)."""
    from hf_optbench.report.tuning_curves import bracketed_optima
    from hf_optbench.study.tuning_phase import lost_tuning_points

    lost = lost_tuning_points(an.sweep_dir) if an.sweep_dir else []
    if lost:
        doc.p(f"**Warning: tuning points lost to failed runs: {'; '.join(lost)}.** Each counted as a rise of the "
              "loss, so these tuned values were chosen without them (missing_points in tuned_hparams.yaml).")
    found = {k: v for k, v in bracketed_optima(an.sweep_dir).items() if k[0] in an.optimizers} if an.sweep_dir else {}
    if not found:
        return
    edge = sorted(f"{o}/{s}" for (o, s), ok in found.items() if not ok)
    if edge:
        doc.p(f"**Warning: {len(edge)} tuned optimum(s) not bracketed: {', '.join(edge)}.** The best tuning point is "
              "still at an edge of the grid after the tuner's extensions (tuned_hparams.yaml), so these "
              "comparisons start from a rate that may not be the optimizer's best, and their verdicts may understate "
              "it.")
    else:
        doc.p(f"Every tuned optimum compared here is bracketed ({len(found)} optimizer x size pairs): the tuning "
              "loss rises on both sides of the chosen learning rate (and weight decay, the non-matrix group's rate and "
              "each ladder rung's rate, where tuned).")


def _ratios(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    if not an.verdicts:
        return
    doc.h(2, f"Ratios to {BASELINE} per model size" + (" and data ratio" if an.multi else ""))
    doc.table(*T.render(T.ratio_columns(), T.ratio_rows(an)), keep=2)
    doc.p(L.ratio_legend(an))
    for name in (n for n in files if n.startswith("scaling")):
        doc.img(files[name], name.removesuffix(".png"))


def _speedup(doc: Doc, an: Analysis) -> None:
    from hf_optbench.measure.speedup import FIT_TOLERANCE
    from hf_optbench.report.speedups import budget_table, ladder_table

    header, rows, warnings = budget_table(an)
    if rows:
        doc.h(2, "Data budget per size")
        doc.table(header, rows)
        for w in warnings:
            doc.p(f"Warning: {w}.")
    header, rows = ladder_table(an, BASELINE)
    if not rows:
        return
    doc.h(2, f"Speedup over {BASELINE} (its budget ladder)")
    doc.p(f"{BASELINE} ran at each budget multiple below, each with its own full schedule (final eval loss, mean ± sd "
          "over seeds). Per seed, a curve L(D) through that seed's ladder (the power law a·D^-b + c where it fits every "
          f"point within {FIT_TOLERANCE:g} nats, else monotone interpolation in log D) is inverted at each other "
          "optimizer's final "
          f"eval loss: the tokens {BASELINE} would need for it, divided by the tokens the optimizer used, is its speedup "
          "(Marin's and Wen et al. 2025's measure). A loss beyond the ladder's range is censored (> or < the range), "
          "never extrapolated; a diverged run is censored below. The speedup's verdict and per-size intervals are in "
          "the tables above; per run: summary.csv's speedup columns.")
    doc.table(header, rows)
    rung_rates_section(doc, an, BASELINE)
    attribution_section(doc, an, BASELINE)


def _memory(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    doc.h(2, "Memory (MiB, mean over seeds)")
    doc.table(*T.render(T.MEMORY.columns, T.MEMORY.rows(an)))
    kinds = sorted({str(r.get("peak_memory_kind")) for r in an.ok() if r.get("peak_memory_kind")})
    doc.p(f"Peak memory kind: {', '.join(kinds) or 'n/a'} (cpu_peak_rss includes the Python/torch runtime, which "
          "dominates the smallest models).")
    if files.get("memory.png"):
        doc.img(files["memory.png"], "memory")


def _convergence(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    from hf_optbench.report.targets import VERDICT_TARGET

    doc.h(2, "Convergence")
    if an.given_targets:
        doc.p("Target loss per size: given with --target-loss (the verdict uses it).")
    else:
        doc.p(f"Targets, fixed before any other optimizer is looked at: {BASELINE}'s smoothed train loss at 25 / 50 / "
              f"75 / 100 % of its step budget, averaged over its seeds, so adding or dropping an optimizer cannot move "
              f"them. The verdict uses the {VERDICT_TARGET} target: mid-run, where the optimizer and not the end of the "
              "schedule decides when it is reached. Train loss, not eval loss: it is logged every step, so a time to "
              "target is resolved to one step (eval runs every eval_steps); the held-out comparison is the eval loss at "
              "matched token budgets below.")
    doc.table(*TT.targets_table(an))
    for note in an.target_notes:
        doc.p(f"Note: {note}.")
    doc.table(*T.render(T.CONVERGENCE.columns, T.CONVERGENCE.rows(an)))
    doc.p("Mean train loss over budget: the area under train loss vs tokens divided by the token budget (summary.json's "
          "loss_auc_tokens is not normalised, so a run that stopped early would look better); a run that logged fewer "
          "tokens than its budget is extended at its last loss, a diverged run has none (it counts under Stability). "
          "A diverged run's final eval loss is left out for the same reason.")
    doc.h(3, "Tokens to each target")
    doc.p("Mean ± sd over seeds; a run that never reached a target (or diverged first) counts at its token budget and "
          "is counted as censored: the mean is then a lower bound.")
    doc.table(*TT.per_target_table(an, "tokens"))
    doc.h(3, "Eval loss at matched token budgets")
    doc.p("Every run's eval loss at the token counts of the target points (linear interpolation between the two "
          "evaluations around each point; – where the run has no evaluation on both sides, e.g. before the first one "
          "or after a divergence).")
    doc.table(*TT.per_target_table(an, "eval"))
    for size in an.sizes:
        for key in (f"loss_{an.file_key(size)}.png", f"lr_gradnorm_{an.file_key(size)}.png"):
            if key in files:
                doc.img(files[key], key)


def _hyperparameters(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    from hf_optbench.report.sections.hyperparameters import sensitivity_section, tuned_values_section
    from hf_optbench.report.tuning_curves import sources_cell, tuned_bracketing

    doc.h(2, "Hyperparameters: where each came from, and the tuning curves")
    seen: dict[tuple[str, str], set[str]] = {}
    for r in an.records:
        seen.setdefault((r.optimizer, r.cell.label), set()).add(sources_cell(r.summary.get("hyperparameter_sources")))
    doc.table(["optimizer", "size", "learning rate, weight decay, clipping from"],
              [[o, s, " / ".join(sorted(seen[(o, s)]))] for o in an.optimizers for s in an.sizes if (o, s) in seen])
    doc.p("cited: the optimizer registry's default for the size, with its citation (`hf-optbench optimizers`); tuned: "
          "the tuned_hparams_file that gave it; user: set in the recipe or on the command line. Per run: the Runs table.")
    tuned_values_section(doc, an)
    header, rows, key = TT.tuning_table(an)
    if not rows:
        doc.p("No tuning runs (runs at learning-rate multipliers) in this sweep: pass a tuning sweep with "
              "`--tuning-dir` to show the tuning curves.")
        return
    doc.p(f"Tuning curves: {key.replace('_', ' ')} "
          + ("(the held-out tuning split, not the reported eval split)" if key == "final_tuning_loss" else
             "(the reported eval split: these runs have no final_tuning_loss, so selection and report share a split)")
          + " per learning rate, mean ± sd over seeds; best: the lowest mean among learning rates with no diverged or "
          "failed seed (the rule of `hf-optbench tune`).")
    doc.table(header, rows)
    for name in sorted(k for k in files if k.startswith("tuning_")):
        doc.img(files[name], name)
    doc.h(3, "Sensitivity: the learning-rate range within 1 % of the best tuning loss, and bracketing")
    sensitivity_section(doc, an.tuning, tuned_bracketing(an.sweep_dir))
    from hf_optbench.report.sections.hyperparameters import tuned_ratio_table

    header, rows = tuned_ratio_table(an.ok(), BASELINE)
    if rows:
        doc.h(3, f"Tuned values as ratios to {BASELINE}'s, beside the published bands")
        doc.table(header, rows)


def _throughput_and_stability(doc: Doc, an: Analysis, files: dict[str, Path]) -> None:
    doc.h(2, "Step time and throughput")
    doc.table(*T.render(T.THROUGHPUT.columns, T.THROUGHPUT.rows(an)))
    if files.get("throughput.png"):
        doc.img(files["throughput.png"], "throughput")
    doc.h(2, "Stability")
    doc.table(*T.render(T.STABILITY.columns, T.STABILITY.rows(an)))
    if files.get("stability.png"):
        doc.img(files["stability.png"], "stability")


def _runs(doc: Doc, an: Analysis) -> None:
    doc.h(2, "Runs")
    doc.table(*T.render(T.RUNS, an.all_records))
    doc.p("Machine-readable: summary.csv (one row per run, with the derived target columns) and runs.parquet (every "
          "metrics row of every run, tidy: `pandas.read_parquet(\"runs.parquet\")` or "
          "`datasets.load_dataset(\"parquet\", data_files=\"runs.parquet\")`).")


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
    from hf_optbench.report.sections.tuning_noise import noise_section, tuning_noise_line
    from hf_optbench.report.short_report import answer_tables, plot_and_link
    from hf_optbench.report.time_to_quality import time_line, time_section

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
    _overview(evidence, an, f"Evidence: {name}")
    evidence.p("The answer, in short: [report.md](report.md). Below, everything it rests on.")
    _verdict(evidence, an, files)
    noise_section(evidence, an)
    regime, reg = an.regime_text, an.regime
    reference_section(evidence, an, reg)
    _ratios(evidence, an, files)
    _speedup(evidence, an)
    time_section(evidence, an)
    transfer_section(evidence, transfers, files)
    _memory(evidence, an, files)
    _convergence(evidence, an, files)
    _hyperparameters(evidence, an, files)
    _throughput_and_stability(evidence, an, files)
    _runs(evidence, an)
    short = Doc()
    _overview(short, an, f"Optimizer benchmark report: {name}", question=True)
    answer_tables(short, an)
    _bracketing(short, an)
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
