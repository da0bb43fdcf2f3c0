"""Each comparison run's speedup over the baseline's ladder, and the report's budget and ladder tables.

The rule is :mod:`hf_optbench.measure.speedup`'s; this module finds each run's ladder: the baseline's completed
runs at the same size and seed (its x1 comparison run and its runs at the other budget multiples), so every speedup
is paired by seed (same initial weights and data order) with the ladder it is read from, and read against the
baseline's own x1 run on that curve (:func:`hf_optbench.measure.speedup.speedup`). A diverged run never
reached any loss, so its speedup is censored below the ladder's smallest budget. Records get ``speedup`` (the
value, or its bound), ``speedup_censored`` (the form :func:`hf_optbench.measure.verdict.verdict` reads),
``speedup_bound`` ("above": at least, "below": at most), ``speedup_method`` and ``baseline_equivalent_tokens``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from hf_optbench.study.budget import budget_tokens, ladder_points
from hf_optbench.study.records import RunRecord

# Sizes whose tokens per parameter differ by more than this factor are not on one scaling axis.
RATIO_TOLERANCE = 1.1


def tokens_per_param(rec: RunRecord) -> float | None:
    """Training tokens per non-embedding parameter: summary.json's figure, else budget / non-embedding count."""
    if rec.summary.get("tokens_per_param") is not None:
        return float(rec.summary["tokens_per_param"])
    tokens, params = budget_tokens(rec), rec.get("num_params_non_embedding")
    return tokens / float(params) if tokens and params else None


def derive_speedups(an: Any, baseline: str) -> None:
    """Fit every (cell, seed) ladder (a cell: a size, at a data ratio in a sweep with several) and set each
    comparison (and attribution) record's speedup fields (no ladder: None)."""
    an.set_columns(an.records + an.ladder + an.attribution, lambda r: {"tokens_per_param": tokens_per_param(r)})
    if not an.ladder:
        return
    references: dict[tuple[str, Any], float | None] = {}
    an.set_columns(an.records + an.attribution, lambda r: _speedup_columns(an, r, baseline, references))


def _speedup_columns(an: Any, r: RunRecord, baseline: str,
                     references: dict[tuple[str, Any], float | None]) -> dict[str, Any]:
    """One run's speedup fields off its (cell, seed) ladder, fitting that ladder the first time it is asked for
    (``an.ladder_fits``; ``references``: each ladder's own x1 loss)."""
    from hf_optbench.measure.speedup import Speedup, fit_ladder, speedup

    out: dict[str, Any] = {"speedup": None, "speedup_censored": False, "speedup_bound": "", "speedup_method": None,
                           "baseline_equivalent_tokens": None}
    key = (r.cell.label, r.seed)
    if key not in an.ladder_fits:
        pts, references[key] = ladder_points(an.ladder + an.records, baseline, r.model_size, r.seed, r.budget_tpp)
        an.ladder_fits[key] = fit_ladder([t for t, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None
    fit, tokens = an.ladder_fits[key], budget_tokens(r)
    if fit is None or not tokens:
        return out
    if r.optimizer == baseline:
        s = Speedup(1.0, None, "baseline (1 by definition)", tokens)
    elif r.status == "diverged":
        s = Speedup(fit.tokens[0] / tokens, "below", fit.method, None)
    elif r.status == "completed" and r.get("final_eval_loss") is not None:
        s = speedup(fit, float(r["final_eval_loss"]), tokens, references[key])
    else:
        return out
    return {"speedup": s.value, "speedup_censored": s.censored is not None, "speedup_bound": s.censored or "",
            "speedup_method": s.method, "baseline_equivalent_tokens": s.equivalent_tokens}


# ------------------------------------------------------------------------------------------------ tables
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


def tuned_entry(an: Any, optimizer: str, cell: str) -> dict[str, Any]:
    """The tuned-file entry of ``optimizer`` at ``cell``: its size's entry in its data ratio's tuned file (the one
    file of a single-ratio sweep); {} where there is none."""
    from hf_optbench.study.tuning_phase import tuned_files
    from hf_optbench.yaml_file import read_yaml_or_empty

    if an.sweep_dir is None:
        return {}
    path = tuned_files(an.sweep_dir).get(an.cell_tpp.get(cell))
    entry = ((read_yaml_or_empty(path) or {}).get(optimizer) or {}).get(an.cell_size.get(cell, cell)) if path else None
    return entry if isinstance(entry, dict) else {}


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
