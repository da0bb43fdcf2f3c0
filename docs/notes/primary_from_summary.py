"""The primary family of a committed study, recomputed from its summary.csv with the rules of today's report.

A committed study keeps its report and its summary.csv (one row per run, every figure the verdict reads), not its
run directories; this recomputes the primary questions (each optimizer's speedup along data at each size, along size
at each ratio) from those rows through ``measure.verdict``'s own code, as ``hf-optbench report`` would: the advantage
trend printed as the slope of ln(speedup) per decade (+: the advantage grows), Holm's procedure over the primary cells
alone, the transient cells (named on the command line, as the study's regime line named them) shown and left out of
the trends. What it cannot redo from the rows: the second tuning draw's widening (the study's report widened 23 of
84 intervals by it), so its intervals are the compared seeds' alone, and it says so.

    .venv/bin/python docs/notes/primary_from_summary.py docs/results/cpu_study_v1/summary.csv \
        --transient nano@0.15 nano@0.5 tiny@0.15 --output docs/results/cpu_study_v1/primary_family.md
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from hf_optbench.measure.primary import ReportSpec
from hf_optbench.measure.verdict import METRICS, Verdict, confidence_text, grid_families, verdict_table
from hf_optbench.study.records import compared_rows

SPEEDUP = next(m for m in METRICS if m.key == "speedup")


def _row(v: Verdict) -> list[str]:
    trend = v.trend_text(sign=False) or "–"
    mde = f"±{v.trend_mde:.2g}" if v.trend_mde is not None and math.isfinite(v.trend_mde) else "–"
    points = ", ".join(f"{p.model_size}{' (transient)' if p.transient else ''} {p.ratio():.3g} "
                       f"[{p.interval()[0]:.3g}, {p.interval()[1]:.3g}]" for p in v.points)
    return [v.optimizer, f"{v.axis}, at {v.at}", points, trend, mde, v.word,
            f"{v.level:.2g}" if v.p_value is not None else "not tested"]


def render(verdicts: list[Verdict], source: Path, transient: list[str]) -> str:
    primary = [v for v in verdicts if v.tier == "primary" and v.metric.key == "speedup"]
    tested = [v for v in primary if v.p_value is not None]
    levels = sorted({v.interval_level for v in tested})
    lines = [f"# The primary family of {source.parent.name}, recomputed from its summary.csv", "",
             f"Written by docs/notes/primary_from_summary.py from `{source.name}`: each optimizer's speedup over tuned "
             "adamw along data (at each size) and along size (at each ratio every size ran), the primary questions, "
             f"under one Holm procedure over their {len(tested)} testable cells at 5 %. Trend: the mean of per-seed "
             "slopes of ln(speedup) per decade [its interval], + = the advantage grows. Transient cells (adamw at or "
             f"above the bigram reference, as the study's regime line named them: {', '.join(transient) or 'none'}) "
             "are shown and left out of every trend and test. Intervals: the compared seeds' alone, at half each "
             f"cell's Holm level ({', '.join(confidence_text(lv) for lv in levels) or 'n/a'}); the second tuning "
             "draw's widening is not redone here.", "",
             "| optimizer | along | speedup at each point [interval] | advantage trend, ln/decade [interval] | "
             "smallest detectable trend | verdict | tested at |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(_row(v)) + " |" for v in primary]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path)
    parser.add_argument("--transient", nargs="*", default=[], help="cells as SIZE@RATIO, e.g. nano@0.15")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    rows = compared_rows(args.summary)
    cells = frozenset((c.split("@")[0], float(c.split("@")[1])) for c in args.transient)
    verdicts = verdict_table(grid_families(rows, metrics=(SPEEDUP,), transient=cells), report=ReportSpec())
    text = render(verdicts, args.summary, args.transient)
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
