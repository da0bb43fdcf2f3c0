"""The budget and speedup sections: the data budget per size (tokens per non-embedding parameter, warned where the
sizes differ in it), the baseline's budget ladder the speedups are read off (its final loss at each budget multiple
and how many seeds' curves are power laws), the learning rate each rung was tuned to, and the attribution of the
speedup (:mod:`hf_optbench.report.sections.attribution`). The speedups themselves are computed by
:mod:`hf_optbench.report.speedups` (the analysis sets them on every record; the verdict and ratio sections read them).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from hf_optbench.report.analysis import Analysis
from hf_optbench.report.sections.attribution import attribution_section
from hf_optbench.report.speedups import tokens_per_param, tuned_entry
from hf_optbench.rundir import BASELINE
from hf_optbench.study.budget import budget_tokens


def speedup_section(doc: Any, an: Analysis) -> None:
    """The evidence's budget and speedup sections (``doc``: report.build.Doc): the data budget per size, then, where
    the baseline ran a ladder, the ladder, each rung's tuned rate and the attribution."""
    from hf_optbench.measure.speedup import FIT_TOLERANCE

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


# Sizes whose tokens per parameter differ by more than this factor are not on one scaling axis.
RATIO_TOLERANCE = 1.1


def budget_table(an: Any) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, warnings): per size, the compared runs' budget and its tokens per non-embedding parameter."""
    header = ["size", "non-embedding parameters", "tokens / step", "steps", "tokens", "tokens / parameter"]
    rows, ratios = [], {}
    for size in an.sizes:
        runs = [r for r in an.records if r.cell.label == size and budget_tokens(r)]
        if not runs:
            continue
        r = runs[0]
        ratios[size] = tokens_per_param(r)
        rows.append([size, f"{r.get('num_params_non_embedding') or 0:,}",
                     str(r.summary.get("tokens_per_step") or "–"), str(r.recorded("max_steps") or "–"),
                     f"{budget_tokens(r):,.0f}",
                     "–" if ratios[size] is None else f"{ratios[size]:.3g}"])
    known = [v for v in ratios.values() if v]
    warnings = []
    if not an.multi and len(known) > 1 and max(known) / min(known) > RATIO_TOLERANCE:  # several ratios: by design
        warnings.append(f"the sizes differ in tokens per parameter ({min(known):.3g} to {max(known):.3g}): the scaling "
                        "axis mixes model size with data per parameter. State the budget as `budget: "
                        "{tokens_per_param: ...}` in the sweep file to hold it fixed")
    return header, rows, warnings


def ladder_table(an: Any, baseline: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per size, the baseline's final eval loss at each budget multiple (mean ± sd over seeds) and
    how many seeds' curves are power laws."""
    mults = sorted({float(r.budget_multiple or 1.0) for r in an.ladder})
    if not mults:
        return [], []
    mults = sorted(set(mults) | {1.0})
    rows = []
    for size in an.sizes:
        cells = []
        for m in mults:
            vals = [float(r["final_eval_loss"]) for r in an.ladder + an.records
                    if r.optimizer == baseline and r.cell.label == size and r.status == "completed"
                    and float(r.budget_multiple or 1.0) == m and r.get("final_eval_loss") is not None]
            sd = f" ± {statistics.stdev(vals):.2g}" if len(vals) > 1 else ""
            cells.append(f"{statistics.fmean(vals):.4f}{sd}" if vals else "–")
        fits = [f for (s, _), f in an.ladder_fits.items() if s == size and f is not None]
        power = sum(1 for f in fits if f.method == "power law")
        rows.append([size, *cells, f"power law {power}/{len(fits)}, interpolation {len(fits) - power}/{len(fits)}"])
    return ["size", *[f"x{m:g}" for m in mults], "curve per seed"], rows


def _rate_cell(entry: Mapping[str, Any], prefix: str = "") -> str:
    """"0.004 (x4)", with what the tuned file says against the choice: not bracketed, or a margin still within the
    seed noise."""
    text = f"{float(entry['learning_rate']):.3g} (x{float(entry['multiplier']):g})"
    if not entry.get(f"{prefix}bracketed", entry.get("bracketed", True)):
        text += ", not bracketed"
    if entry.get(f"{prefix}within_noise"):
        text += f", margin {float(entry[f'{prefix}margin']):.2g} ≤ noise {float(entry[f'{prefix}noise']):.2g}"
    return text


def rung_rates_table(an: Any, baseline: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per size, the learning rate each rung of the baseline's ladder ran at (tuned_hparams.yaml:
    every rung tuned on its own), x multiplier of the cited rate."""
    entries = {size: entry for size in an.sizes if (entry := tuned_entry(an, baseline, size))}
    mults = sorted({1.0} | {float(r["budget_multiple"]) for e in entries.values() for r in e.get("ladder") or []}
                   | {float(r.budget_multiple) for r in an.ladder if r.budget_multiple})
    if not any(e.get("ladder") for e in entries.values()):
        return [], []
    rows = []
    for size, entry in entries.items():
        rungs = {float(r["budget_multiple"]): r for r in entry.get("ladder") or [] if r.get("learning_rate")}
        cells = [_rate_cell(entry, "lr_") if m == 1.0 else _rate_cell(rungs[m]) if m in rungs else "–" for m in mults]
        rows.append([size, *cells])
    return ["size", *[f"x{m:g}" for m in mults]], rows


def rung_rates_section(doc: Any, an: Any, baseline: str) -> None:
    """Under the ladder: each rung's own tuned rate (``doc``: report.build.Doc)."""
    header, rows = rung_rates_table(an, baseline)
    if rows:
        doc.p(f"Each rung of {baseline}'s ladder ran at its own tuned learning rate (x the cited rate; tuned_hparams.yaml "
              "`ladder`), tuned from the compared budget's optimum x1/2, x1, x2 and extended until bracketed: a ladder "
              "at the x1 rate would handicap every rung but one and inflate every speedup read off it. Where a choice's "
              "margin is within the seed noise it is said.")
        doc.table(header, rows)
