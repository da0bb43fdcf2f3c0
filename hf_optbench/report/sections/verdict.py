"""The scaling verdict section: whether each optimizer's advantage over the baseline holds as the model grows (the
size axis) and as each parameter sees more data (the data axis), with the tables of both axes, their legends, the
Evidence table behind every cell and the data-axis speedup per ratio.

The verdict itself is computed once by :func:`hf_optbench.report.analysis.analyse` (``measure.verdict``); this module
lays it out: the verdict tables (:func:`verdict_columns`, one column per metric, a cell per optimizer), the Evidence
table (:data:`EVIDENCE`), the speedup per ratio (:func:`data_axis_table`) and the legend under each, written from the
levels and margins the cells were computed at (:mod:`hf_optbench.report.legends`), and the data-axis plot
(``data_axis.png``): each optimizer's speedup against tokens per parameter, one line per size (the line only joins a
size's points; the legend gives the verdict along data), ticked at the ratios run.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_optbench.measure.intervals import POWER
from hf_optbench.measure.verdict import ADVANTAGE_SIGN, DATA_QUESTIONS, METRICS, NOT_MEASURABLE, TREND_RULE
from hf_optbench.report.analysis import Analysis
from hf_optbench.report.legends import (
    confidence_range,
    control_text,
    judged_metrics,
    levels_sentence,
    margins_text,
    points_of,
)
from hf_optbench.report.plots import (
    MARKERS,
    TREND_KEY,
    colors,
    fill_key,
    plt_,
    point_style,
    ratio_axis,
    readable,
    save,
    verdict_label,
)
from hf_optbench.report.sections.hyperparameters import bracketing_note
from hf_optbench.report.tables import Cell, Column, fmt_num, ratio_cell, render, verdict_cell
from hf_optbench.rundir import BASELINE


# ------------------------------------------------------------------------------------------------ the section
def verdict_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's verdict section (``doc``: report.build.Doc): the size axis (per data ratio in a sweep over
    several), its legend, the bracketing of the tuned optima, the data axis, and the Evidence table."""
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
        doc.table(*render(verdict_columns(an), others))
    if sized:
        doc.p(verdict_legend(an))
    bracketing_note(doc, an)
    if sized:
        doc.table(["verdict", "meaning"], [[k, v] for k, v in meanings("size").items()])
    if an.multi:  # the evidence of both axes, after both
        _data_axis(doc, an, files, others)
    doc.h(3, "Evidence")
    shown = [v for v in an.verdicts if sized or v.axis != "size"]
    doc.table(*render(evidence_columns(an), shown))
    doc.p(evidence_legend(shown))
    if not an.multi:
        _data_axis(doc, an, files, others)


def _size_axis_per_ratio(doc: Any, an: Analysis, others: list[str]) -> None:
    """The size axis of a sweep over data ratios: one table per ratio every size ran, one line for the others."""
    from hf_optbench.measure.verdict import ratio_label

    ats = list(dict.fromkeys(v.at for v in an.verdicts_along("size")))
    if len(an.model_sizes) < 2:
        doc.p(f"This sweep ran one size ({an.model_sizes[0]}): the size axis needs two, so its verdict is along data "
              "per parameter only (below).")
        return
    for at in ats:
        doc.h(3, f"At {at}")
        doc.table(*render(verdict_columns(an, an.verdicts_along("size", at)), others))
    left = [ratio_label(r) for r in an.ratios if ratio_label(r) not in ats]
    if left:
        doc.p(f"No size-axis verdict at {', '.join(left)}: not every size ran there (the sweep left those cells out); "
              "those cells are judged along data per parameter below.")


def _data_axis(doc: Any, an: Analysis, files: dict[str, Path], others: list[str]) -> None:
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
        doc.table(*render(verdict_columns(an, an.verdicts_along("data", size)), others))
    doc.p(data_legend(an))
    doc.table(["verdict along data", "meaning"], [[k, v] for k, v in meanings("data").items()])
    header, rows = data_axis_table(an)
    if rows:
        doc.h(3, f"Speedup over {BASELINE} against tokens per parameter")
        doc.table(header, rows)
    if files.get("data_axis.png"):
        doc.img(files["data_axis.png"], "speedup against data per parameter")


# ------------------------------------------------------------------------------------------------- tables
def _slope(v: Any) -> str:
    """The trend as a reader reads it (``Verdict.trend_text``: + is the optimizer's advantage growing)."""
    return v.trend_text() or "–"


def along(v: Any) -> str:
    """Which axis a verdict runs along and where on the other: "size, at 0.5 tok/param" or "data, at tiny"."""
    return v.axis + (f", at {v.at}" if v.at else "")


EVIDENCE = [  # one row per verdict (optimizer x metric)
    Column("optimizer", lambda v: v.optimizer),
    Column("metric", lambda v: v.metric.label),
    Column("verdict", lambda v: v.word),
    Column("paired seeds per size", lambda v: ", ".join(f"{p.model_size} {p.n_pairs}" for p in v.points) or "–"),
    Column("censored pairs", lambda v: sum(p.censored_pairs for p in v.points)),
    Column("advantage trend / decade [CI] (+: grows)", _slope),
    Column("tier", lambda v: v.tier or "–"),
    Column("trend threshold / decade", lambda v: fmt_num(v.threshold, "{:.3f}")),
    Column("evidence", lambda v: v.evidence),
]


def evidence_columns(an: Analysis) -> list[Column]:
    """:data:`EVIDENCE`, with the axis each verdict runs along in a sweep over data ratios."""
    return EVIDENCE[:2] + [Column("along", along)] + EVIDENCE[2:] if an.multi else EVIDENCE


def data_axis_table(an: Analysis, key: str = "speedup") -> tuple[list[str], list[list[str]]]:
    """(header, rows): per optimizer and size, the data-axis verdict's paired ratio at each data ratio (its
    interval and stance) and the verdict along data."""
    from hf_optbench.measure.verdict import ratio_label

    labels = [ratio_label(r) for r in an.ratios]
    rows = []
    for v in an.verdicts_along("data"):
        if v.metric.key != key or not v.points:
            continue
        points = {p.model_size: p for p in v.points}
        rows.append([v.optimizer, v.at, *[ratio_cell(points.get(label)) for label in labels], v.word])
    return ["optimizer", "size", *labels, "verdict along data"], rows


def verdict_columns(an: Analysis, verdicts: Sequence[Any] | None = None) -> list[Column]:
    """One row per non-baseline optimizer, one column per metric that has a verdict (among ``verdicts``: one family's,
    along one axis at one place; all of the analysis's by default)."""
    chosen = an.verdicts if verdicts is None else list(verdicts)

    def cell(spec: Any) -> Cell:
        return lambda opt: next((verdict_cell(v) for v in chosen if v.optimizer == opt and v.metric == spec), "–")

    specs = list(dict.fromkeys(v.metric for v in chosen))
    return [Column("optimizer", lambda opt: opt)] + [Column(f"{s.question}: {s.label}", cell(s)) for s in specs]


# ------------------------------------------------------------------------------------------------ legends
def verdict_legend(an: Any) -> str:
    """The paragraph under the verdict table (the size axis): how a cell is decided and what controls the table's
    error, with the levels, confidences and margins its cells were computed at."""
    both = " (both axes: the size tables and the data tables below)" if an.multi else ""
    along = [v for v in an.verdicts if v.axis == "size"]
    return (f"Cells: the verdict, then the ratio (or gap) to {BASELINE} at the smallest → largest size run and where "
            f"the optimizer stands at the largest size. Runs are paired with {BASELINE} by seed (same initial weights "
            "and data order); each size has a Student-t interval of the mean paired log-ratio (or difference), or, where "
            "some pairs are bounds (a speedup beyond the ladder, a run that never reached the target), a censored-normal "
            "likelihood interval (never a mean of bounds; ≥ / ≤ marks a figure that is itself a bound). The trend is the "
            f"mean of per-seed slopes over log10(parameters) with its own interval, printed as the advantage trend "
            f"({ADVANTAGE_SIGN}). {control_text(an, both)} {levels_sentence(along)} Margins (a difference within one "
            "is level): "
            f"{margins_text(judged_metrics(along) or METRICS)}. {TREND_RULE.format(points='sizes')} A \"no difference\" cell "
            f"states its MDE: the smallest true effect it would have called with {POWER:.0%} power at its level (exact, "
            "from the noncentral t). Wall-clock cells measured while runs shared the machine, or whose per-seed ratios "
            f"spread wider than their effect, say \"{NOT_MEASURABLE}\" and stay out of the family. Time to target uses "
            "the 50 % target (see Convergence); a run that never reached it, or diverged, counts at its budget as a "
            "bound. Full rule: hf_optbench/measure/verdict.py.")


def data_legend(an: Any) -> str:
    """The paragraph under the data-axis tables: what is judged along data, the error control they share, the levels,
    confidences and margins of their cells."""
    along = [v for v in an.verdicts if v.axis == "data"]
    return (f"Along data per parameter, at each size: the same rule as along size, with log10(tokens per parameter) in "
            f"place of log10(parameters). Each seed is paired with {BASELINE} at each ratio (the same initial weights "
            "and data order, at another budget; each ratio tuned and laddered on its own), the trend is the mean of "
            "per-seed slopes over log10(tokens per parameter), its threshold the margin over the decades of data "
            "spanned. Cells: the verdict, then the ratio (or gap) at the smallest → largest ratio and where the optimizer "
            "stands at the largest; a trend reads \"... with data\" (Marin, arXiv:2509.02046, found Muon's speedup "
            f"shrinking with data). Judged: the {' and '.join(DATA_QUESTIONS)} metrics (a model's memory does not depend "
            f"on its data budget). {control_text(an, ' (both axes together)')} "
            f"{levels_sentence(along)} Margins: {margins_text(judged_metrics(along) or METRICS)}. "
            f"{TREND_RULE.format(points='data ratios')}")


def evidence_legend(verdicts: Sequence[Any]) -> str:
    """The paragraph under the Evidence table of ``verdicts`` (its rows), printed in every report that has one: what
    each figure of a row is, and what its p is the p of."""
    shown = [v for v in verdicts if v.points]
    return ("Evidence: each row gives the paired comparison at the smallest and the largest point (size, or data ratio "
            "along data) with its interval and stance, then the advantage trend per decade [its interval] ("
            f"{ADVANTAGE_SIGN}: for a ratio metric the slope of ln(baseline / optimizer), of ln(speedup) for the "
            "speedup) against ± its threshold (the margin over the decades spanned), where it lies (beyond the margin, "
            "inside it, or neither) and the smallest trend its test could detect with 80 % power. "
            "Then the cell's p, and what it is the p of: \"cell p = 2 × min(p at <largest point>, trend p)\" "
            "(at most 1; Bonferroni over the cell's two tests), where \"p at <largest point>\" is the two-sided p of "
            "the largest point's paired difference lying beyond its margin (twice the smaller one-sided p of \"below "
            "−margin\" and \"above +margin\") and \"trend p\" the same for the trend against ± its threshold. "
            "\"tested at\": the level Holm's procedure gave the cell, which claims a difference when its p is at or "
            f"below it. \"intervals\": the confidence of every interval in the row, half that level"
            f"{f' ({confidence_range(points_of(shown))} here)' if shown else ''}.")


# ------------------------------------------------------------------------------------------------ figures
def plot_data_axis(an: Analysis, path: Path, key: str = "speedup") -> Path | None:
    """Each optimizer's ratio to the baseline (its speedup, by default) against tokens per parameter, one panel per
    optimizer, one line per size joining its points (the size's verdict along data in the legend), bars the
    verdict's own intervals, filled where beyond the margin; None when no data-axis verdict has a point."""
    from matplotlib.ticker import FuncFormatter

    from hf_optbench.measure.verdict import METRICS

    spec = next(m for m in METRICS if m.key == key)
    opts = [o for o in an.optimizers if o != BASELINE]
    found = {o: [v for v in an.verdicts_along("data") if v.optimizer == o and v.metric.key == key and v.points]
             for o in opts}
    opts = [o for o in opts if found[o]]
    if not opts:
        return None
    plt = plt_()
    ncols = min(3, len(opts))
    nrows = math.ceil(len(opts) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows + 0.5), squeeze=False, sharey=True)
    for ax in axes.flat[len(opts):]:
        ax.set_visible(False)
    col = colors(an.model_sizes)
    values: list[float] = [1.0]  # the axis is set by the points and the baseline's 1, not by the widest interval
    for ax, opt in zip(axes.flat, opts, strict=False):
        for k, v in enumerate(found[opt]):
            n = len(found[opt])
            # Sizes side by side at one ratio, far enough apart on a log axis spanning a decade or more that their
            # markers and bars do not sit on each other (3 % did, in the CPU study's plot); each size's labels on its
            # own side: the first left, the last right, any between above.
            offset = 1.0 + 0.09 * (k - (n - 1) / 2)
            side = ((-6, -3), "right") if k == 0 and n > 1 else ((6, -3), "left") if k == n - 1 else ((0, 7), "center")
            c, marker = col.get(v.at, "black"), MARKERS[k % len(MARKERS)]
            xs = [p.num_params * offset for p in v.points]
            ys = [p.ratio() for p in v.points]
            ax.plot(xs, ys, color=c, lw=0.9, ls="--", alpha=0.7)
            for x, y, p in zip(xs, ys, v.points, strict=True):
                if math.isfinite(p.ci_low) and math.isfinite(p.ci_high):
                    lo, hi = p.interval()
                    ax.plot([x, x], [lo, hi], color=c, lw=1.2)
                ax.plot(x, y, marker, **point_style(p, c))
                ax.annotate(f"{p.bound_sign()}{y:.3g}", (x, y), textcoords="offset points", xytext=side[0], fontsize=7,
                            color=c, ha=side[1])
                values.append(y)
            ax.plot([], [], marker, color=c, mfc="none", mew=1.3, ls="--", label=verdict_label(v.at, v))
        ax.axhspan(math.exp(-spec.margin), math.exp(spec.margin), color="0.85", zorder=0)
        ax.axhline(1.0, color="grey", lw=0.8)
        ratio_axis(ax, [p.num_params for v in found[opt] for p in v.points])
        ax.set_title(opt, fontsize=10)
        ax.set_ylabel(f"{spec.label} / {BASELINE}" if spec.baseline_value is None else f"{opt}'s {spec.label}")
        ax.grid(alpha=0.3)
        fill_key(ax, any(p.transient for v in found[opt] for p in v.points))
        ax.legend(fontsize=6.5, title=TREND_KEY, title_fontsize=6.5)
    low, high = min(values), max(values)
    if high / low > 3:
        axes[0][0].set_yscale("log")  # shared: every panel
        axes[0][0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: readable(v)))
        axes[0][0].set_ylim(low / 1.6, high * 1.6)
    else:
        pad = 0.35 * (high - low) + 0.1
        axes[0][0].set_ylim(max(0.0, low - pad), high + pad)  # an interval wider than this runs off the axis
    drawn = confidence_range(p for o in opts for v in found[o] for p in v.points) or "n/a"
    title = (f"{spec.label} against data per parameter, per size: the mean paired value, bar = its interval at the "
             f"level Holm's procedure gave its verdict cell ({drawn} confidence, cut at the axis); filled = beyond the "
             "margin (grey band), hollow = not; the dashed line only joins one size's points; trend per decade, "
             "+: advantage grows")
    fig.suptitle(textwrap.fill(title, width=int(14 * 5.2 * ncols)), fontsize=9)
    return save(fig, path)
