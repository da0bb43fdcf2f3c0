"""report.md, the report that opens with the answer: the question, the speedup table with its verdicts
(the tuning draw's shift beside each interval), the regime, the attribution, the tuning noise, the time and the rate
transfer each in one line (written by the module of that section: ``report.sections.regime``,
``report.sections.attribution``, ``report.sections.tuning_noise``, ``report.sections.time_to_quality``,
``report.sections.rate_transfer``), and one plot. Everything else is evidence.md (``report.build``), and report.html
holds both.

Why: a report that holds every table puts its headline far down, after the wide verdict tables; a reader who wants
the answer reads this page, one who wants to check it opens the evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hf_optbench.measure.verdict import ADVANTAGE_SIGN
from hf_optbench.report.sections.tuning_noise import beside
from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import Cell

HEADLINE_KEYS = ("speedup", "final_eval_loss")  # the first with a verdict heads the report
CELLS = " (mean over the paired seeds [its interval at the level Holm's procedure gave the verdict cell], where it " \
    "stands against the margin{draw})"
DRAW = "; `draw`: the shift the second tuning draw made in that estimate"
WORDS = " (the verdict, the figure at the smallest → largest size, where it stands at the largest)"


def headline_key(an: Any) -> str | None:
    """The metric the headline table shows: the speedup where the sweep has a ladder, else the final loss."""
    return next((k for k in HEADLINE_KEYS if any(v.metric.key == k and v.points for v in an.verdicts)), None)


def point_text(p: Any, mode: str) -> str:
    """"2.22 [1.24, 3.99] ahead" (a ratio metric's figure) or "-0.17 [-0.2, -0.1] ahead" (nats), with the MDE where
    the stance is "no difference"."""
    if p is None:
        return "–"
    if mode == "ratio":
        low, high = p.interval()
        text = f"{p.bound_sign()}{p.ratio():.3g} [{low:.3g}, {high:.3g}] {p.stance}"
    else:
        text = f"{p.bound_sign()}{p.gap:+.2g} [{p.ci_low:+.2g}, {p.ci_high:+.2g}] {p.stance}"
    text += f" ({p.mde_text(mode, 'nats' if mode != 'ratio' else '')})" if p.stance == "no difference" else ""
    return text + ("; transient, out of the trend" if p.transient else "")


def _cell(an: Any, opt: str, key: str, cell: str) -> str:
    v, p = an.point(opt, key, cell)
    if p is None:
        return "–"
    draw = beside(an.tuning_noise, an, opt, key, cell)
    return point_text(p, v.metric.mode) + (f"; {draw}" if draw else "")


def _word(an: Any, v: Any) -> str:
    """The verdict word, with what it was before the tuning draw widened its intervals where that changed it."""
    noise = an.tuning_noise
    before = next((a.word_before for a in (noise.applied if noise else []) if a.optimizer == v.optimizer
                   and a.key == v.metric.key and a.along == v.axis + (f", at {v.at}" if v.at else "")
                   and a.word_before != v.word), None)
    return v.word + (f" (before the tuning draw: {before})" if before else "")


def headline_tables(an: Any, key: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(caption, header, rows) of the headline: per optimizer and size, the figure at each data ratio and the verdict
    along data (a sweep over ratios), then the verdict along size at each ratio every size ran; per optimizer the
    figure at each size and the verdict along size (one ratio)."""
    from hf_optbench.measure.verdict import ratio_label
    from hf_optbench.report.tables import verdict_cell

    others = [o for o in an.optimizers if o != BASELINE]
    out = []
    if an.multi:
        labels = [ratio_label(r) for r in an.ratios]
        rows = []
        for v in (v for v in an.verdicts_along("data") if v.metric.key == key and v.optimizer in others):
            cells = [Cell(v.at, ratio).label for ratio in an.ratios]
            rows.append([v.optimizer, v.at, *[_cell(an, v.optimizer, key, cell) if cell in an.sizes else "–"
                                              for cell in cells], _word(an, v)])
        out.append((f"along data per parameter{CELLS}", ["optimizer", "size", *labels, "verdict along data"], rows))
        ats = list(dict.fromkeys(v.at for v in an.verdicts_along("size") if v.metric.key == key))
        if ats and len(an.model_sizes) > 1:
            rows = [[opt, *[next((verdict_cell(v) for v in an.verdicts_along("size", at)
                                  if v.optimizer == opt and v.metric.key == key), "–") for at in ats]]
                    for opt in others]
            out.append((f"along model size{WORDS}", ["optimizer", *[f"along size at {at}" for at in ats]], rows))
        return out
    rows = []
    for opt in others:
        v = next((v for v in an.verdicts_along("size") if v.optimizer == opt and v.metric.key == key), None)
        rows.append([opt, *[_cell(an, opt, key, cell) for cell in an.sizes], _word(an, v) if v else "–"])
    out.append((f"along model size{CELLS}", ["optimizer", *an.sizes, "verdict along size"], rows))
    return out


# ------------------------------------------------------------------------------------------------- lines
def _trend_phrase(v: Any) -> str:
    """"+0.270 ln/decade [+0.153, +0.388] at nano (grows)", or why there is no trend."""
    where = f" at {v.at}" if v.at else ""
    if v.advantage_trend is None:
        left = [p.model_size for p in v.points if p.transient]
        why = f"{len(left)} transient cell(s) left out" if left else "needs two points with two seeds"
        return f"no trend{where} ({why}; {v.word})"
    mde = v.trend_mde
    detect = f", smallest detectable ±{mde:.2g}" if mde is not None and math.isfinite(mde) else ""
    return f"{v.trend_text(sign=False)}{where} ({v.word}{detect})"


def answer_sentences(an: Any, key: str) -> list[str]:
    """One sentence per optimizer: its trend of ``key`` along data (at each size) and along size (at each ratio),
    with the interval, oriented so that + is its advantage growing; the tier and family that controlled them."""
    from hf_optbench.measure.verdict import NOT_MEASURABLE

    out = []
    for opt in (o for o in an.optimizers if o != BASELINE):
        parts = []
        for axis in ("data", "size"):
            cells = [v for v in an.verdicts_along(axis) if v.optimizer == opt and v.metric.key == key
                     and v.verdict != NOT_MEASURABLE and len(v.points) >= 2]  # an axis of one point asks nothing
            if cells:
                parts.append(f"along {axis} {'; '.join(_trend_phrase(v) for v in cells)}")
        if parts:
            out.append(f"**{opt}**: {', and '.join(parts)}.")
    return out


def _tier_order(v: Any) -> int:
    """Primary questions first, then secondary, then a sweep's single family."""
    return {"primary": 0, "secondary": 1}.get(v.tier or "", 2)


def _family_phrase(tier: str | None, cells: list[Any]) -> str:
    """How one family of the opening sentences' cells was tested, naming the axes it holds: a sweep whose primary
    questions are the data axis alone tests its size-axis trends as secondary ones, in a family of their own."""
    family = max((v.family for v in cells), default=0)
    axes = " and ".join(a for a in ("data", "size") if any(v.axis == a for v in cells))
    holm = f"Holm's procedure over {family} cells at 5 %"
    return f"the sweep's {tier} questions (along {axes}: {holm})" if tier else holm


def _sentences_note(an: Any, key: str) -> str:
    """What the opening sentences' numbers are and which test they belong to."""
    cells = [v for v in an.verdicts if v.metric.key == key and v.p_value is not None]
    unit = "ln(speedup)" if key == "speedup" else "the gap in nats"
    control = " and ".join(_family_phrase(tier, [v for v in cells if v.tier == tier])
                           for tier in dict.fromkeys(v.tier for v in sorted(cells, key=_tier_order))) \
        or "Holm's procedure over 0 cells at 5 %"
    if an.report_spec is not None and an.report_spec.include_transient:
        transient = "; transient cells (at or above the bigram reference) included, as the sweep asked"
    elif an.regime is None:
        transient = "; the regime was not computed, so no cell was left out as transient"
    else:
        transient = "; cells at or above the bigram reference (transient) are shown in the table and left out of every trend"
    return (f"Trends per decade of {unit} ({ADVANTAGE_SIGN}, − shrinks), mean of per-seed slopes [its interval at the "
            f"level of its cell], then the verdict; tested as {control}{transient}.")


def answer_tables(doc: Any, an: Any) -> None:
    """The headline: one sentence per optimizer with its trends, then the speedup (or final-loss gap) tables with their
    verdicts (``doc``: report.build.Doc)."""
    key = headline_key(an)
    if key is None:
        doc.p(f"No verdict: it needs completed {BASELINE} runs and at least one other optimizer.")
        return
    label = "speedup over tuned " + BASELINE if key == "speedup" else "final eval loss gap to " + BASELINE
    doc.h(2, f"The answer: {label}")
    sentences = answer_sentences(an, key)
    if sentences:
        doc.p(_sentences_note(an, key))
        for sentence in sentences:
            doc.p(sentence)
    for caption, header, rows in headline_tables(an, key):
        caption = caption.format(draw=DRAW if an.tuning_noise is not None else "")
        doc.p(f"**{label[0].upper() + label[1:]}, {caption}**")
        doc.table(header, rows)


def plot_and_link(doc: Any, files: Mapping[str, Path]) -> None:
    """The one plot (speedup against data, else along size) and the way to everything else."""
    plot = next((files[n] for n in ("data_axis.png", "scaling.png") if n in files),
                next((files[n] for n in sorted(files) if n.startswith("scaling")), None))
    if plot is not None:
        doc.img(plot, plot.stem.replace("_", " "))
    doc.p("Everything else (every verdict and its evidence, the regime table, the ladder, the tuning and its noise, "
          "time, rate transfer, memory, stability, every run): [evidence.md](evidence.md); report.html holds both.")
