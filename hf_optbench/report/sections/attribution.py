"""The attribution section: how much of each optimizer's speedup comes from its non-matrix group's rate.

Fully tuned, an optimizer trains its embeddings, head, LayerNorm gains and biases at its own tuned rate for them.
The attribution runs (``<sweep>/attribution``, :mod:`hf_optbench.study.comparison_runs`) repeat its compared seeds
at the same tuned matrix rate with that group at the baseline's tuned rate for it. Their speedup, beside the fully
tuned one and as a paired ratio per seed, separates what the matrix optimizer gains from what the group's rate
gains. This module computes both speedups (each at the level of the fully tuned speedup's verdict cell), writes
the table and its legend for evidence.md, and the one line report.md gives it.

The intervals: the fully tuned speedup is the answer table's own verdict point, its interval widened where the
second tuning draw widened it (``report.draw_shift``). The attributed speedup gets the same draw shift (the draw
reran no attribution run, so the fully tuned speedup's shift at the cell is the tuning noise it is borrowed from)
under the same rule (``measure.tuning_noise.widen_point``: widened where the shift exceeds a third of its own
half-width). The paired ratio is not widened: a shift borrowed alike by both speedups leaves their ratio as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_optbench.report.legends import confidence_range
from hf_optbench.report.speedups import tuned_entry
from hf_optbench.rundir import BASELINE


@dataclass(frozen=True)
class Attribution:
    """One optimizer's attribution at one cell: its fully tuned speedup's verdict point beside the point with its
    non-matrix group at the baseline's tuned rate (None where either has none), and their paired ratio's text."""

    optimizer: str
    cell: str
    full: Any  # measure.verdict.SizeComparison of the fully tuned speedup, or None
    attributed: Any  # the same for the attribution runs (widened by the full one's draw shift), or None
    paired: str
    shift: float | None = None  # the tuning draw's shift the attributed point was given (None: no draw measured)


def attributions(an: Any, baseline: str) -> list[Attribution]:
    """Per optimizer and cell (size, or size at a data ratio) that has attribution runs, its fully tuned speedup
    beside its speedup with the non-matrix group at the baseline's tuned rate (same seeds, same matrix rate), each
    at the level of the fully tuned speedup's verdict cell, and their paired ratio."""
    from hf_optbench.measure.intervals import t_interval
    from hf_optbench.measure.verdict import METRICS, verdict

    spec = next(m for m in METRICS if m.key == "speedup")
    out = []
    for opt in sorted({r.optimizer for r in an.attribution}):
        for size in an.sizes:
            v_full, p_full = an.point(opt, "speedup", size)
            level = v_full.level if v_full is not None else 0.05
            mine = [dataclasses.replace(r, optimizer="attributed") for r in an.attribution
                    if r.optimizer == opt and r.cell.label == size]
            attributed = verdict(mine + [r for r in an.ok() if r.optimizer == baseline and r.cell.label == size],
                                 baseline=baseline, metrics=(spec,), alpha=level)
            p_attr, shift = _widened(an, opt, size, next((p for v in attributed for p in v.points), None))
            ratios = [math.log(a["speedup"]) - math.log(f["speedup"])
                      for a in mine for f in an.records if f.cell.label == size
                      and f.optimizer == opt and f.seed == a.seed and a.get("speedup")
                      and f.get("speedup") and not a.get("speedup_censored") and not f.get("speedup_censored")]
            paired = "–"
            if len(ratios) >= 2:
                mean, _, low, high = t_interval(ratios, level / 2)
                paired = f"{math.exp(mean):.3g} [{math.exp(low):.3g}, {math.exp(high):.3g}] ({len(ratios)} seeds)"
            out.append(Attribution(opt, size, p_full, p_attr, paired, shift))
    return out


def _widened(an: Any, optimizer: str, cell: str, p: Any) -> tuple[Any, float | None]:
    """(``p``, the attributed speedup's point, widened by the second tuning draw's shift that the fully tuned
    speedup got at ``cell`` under the same rule; that shift), or (``p``, None) where the draw measured none."""
    from hf_optbench.measure.tuning_noise import widen_point

    noise = an.tuning_noise
    shift = next((a.point.shift for a in (noise.applied if noise is not None else [])
                  if a.optimizer == optimizer and a.key == "speedup" and a.cell == cell), None)
    if p is None or shift is None:
        return p, shift
    return widen_point(p, shift)[0], shift


def attribution_table(an: Any, baseline: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of :func:`attributions`, with each optimizer's and the baseline's tuned rate for the
    non-matrix group."""
    if not an.attribution:
        return [], []
    header = ["optimizer", "size", "non-matrix group's rate (tuned)", "speedup, fully tuned",
              f"non-matrix group at {baseline}'s rate", "speedup", "attributed / fully tuned (paired)"]
    rows = [[a.optimizer, a.cell, _group_rate(tuned_entry(an, a.optimizer, a.cell)), _speedup_cell(a.full),
             _group_rate(tuned_entry(an, baseline, a.cell)), _speedup_cell(a.attributed), a.paired]
            for a in attributions(an, baseline)]
    return header, rows


def _group_rate(entry: Mapping[str, Any]) -> str:
    if not entry.get("learning_rate"):
        return "–"
    rate = float(entry["learning_rate"]) * float(entry.get("nonmatrix_lr_ratio", 1.0))
    return f"{rate:.3g} (x{float(entry.get('nonmatrix_lr_ratio', 1.0)):g} of {float(entry['learning_rate']):.3g})"


def _speedup_cell(p: Any) -> str:
    return "–" if p is None else p.ratio_text()


def speedup_estimate(p: Any) -> str:
    """A verdict point's speedup alone, without its interval ("1.5", "≥ 4"); "–" without a point."""
    return "–" if p is None else f"{p.bound_sign()}{p.ratio():.3g}"


def attribution_levels(an: Any) -> str:
    """The attribution table's sentence on its intervals: at the confidence of the fully tuned speedup's intervals
    in its verdict cell (half that cell's Holm level), the fully tuned one the answer table's, both widened alike
    by the tuning draw (module doc)."""
    optimizers = sorted({str(r.optimizer) for r in an.attribution})
    conf = confidence_range(an.point(o, "speedup", c)[1] for o in optimizers for c in an.sizes)
    text = ("Intervals at the confidence of the fully tuned speedup's intervals in its verdict cell (two-sided, at half "
            f"the cell's Holm level{f': {conf} here' if conf else ''}); the paired ratio is attributed / fully tuned "
            "per seed.")
    if an.tuning_noise is None:
        return text
    return text + (" The fully tuned speedup is the answer table's, with its interval; the attributed one is widened "
                   "by the same tuning draw's shift under the same rule (where the shift exceeds a third of its "
                   "half-width), the draw having rerun no attribution run; the paired ratio, which a shift shared by "
                   "both leaves as it is, is not.")


def attribution_section(doc: Any, an: Any, baseline: str) -> None:
    """The section in evidence.md, under the ladder (``doc``: report.build.Doc); nothing without attribution runs."""
    header, rows = attribution_table(an, baseline)
    if not rows:
        return
    doc.h(3, "Attribution: the speedup with the non-matrix group at the baseline's rate")
    doc.p(f"Fully tuned, an optimizer trains its embeddings, head, LayerNorm gains and biases at its own tuned "
          f"rate for them; beside it, the same seeds at the same tuned matrix rate with that group at {baseline}'s "
          "tuned rate for it (attribution runs, <sweep>/attribution). The difference is the part of the speedup "
          "that comes from the group's rate, not from the matrix optimizer. " + attribution_levels(an))
    doc.table(header, rows)


def attribution_line(an: Any) -> str | None:
    """report.md's line: each optimizer's speedup with its non-matrix group at the baseline's tuned rate, beside the
    fully tuned one; None without attribution runs."""
    found = attributions(an, BASELINE) if an.attribution else []
    if not found:
        return None
    by_opt: dict[str, list[str]] = {}
    for a in found:
        by_opt.setdefault(a.optimizer, []).append(
            f"{speedup_estimate(a.attributed)} (fully tuned {speedup_estimate(a.full)}) at {a.cell}")
    return (f"Attribution (the same seeds with the non-matrix group at {BASELINE}'s tuned rate for it): "
            + "; ".join(f"{opt} {', '.join(cells)}" for opt, cells in by_opt.items()) + ".")
