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

import math
import statistics
from collections.abc import Mapping
from typing import Any

# Sizes whose tokens per parameter differ by more than this factor are not on one scaling axis.
RATIO_TOLERANCE = 1.1


def budget_tokens(rec: Mapping[str, Any]) -> float | None:
    """A run's planned data budget in tokens (planned steps x tokens per step)."""
    summary = rec.get("_summary") or {}
    steps = summary.get("max_steps") or rec.get("max_steps")
    per_step = summary.get("tokens_per_step") or rec.get("tokens_per_step")
    return float(steps) * float(per_step) if steps and per_step else None


def tokens_per_param(rec: Mapping[str, Any]) -> float | None:
    """Training tokens per non-embedding parameter: summary.json's figure, else budget / non-embedding count."""
    summary = rec.get("_summary") or {}
    if summary.get("tokens_per_param") is not None:
        return float(summary["tokens_per_param"])
    tokens, params = budget_tokens(rec), rec.get("num_params_non_embedding")
    return tokens / float(params) if tokens and params else None


def _ladder(an: Any, baseline: str, size: str, seed: Any) -> tuple[list[tuple[float, float]], float | None]:
    """(the ladder's (tokens, final eval loss) points, the baseline's own loss at the budget: its x1 run) of one size
    and seed, from the baseline's completed runs."""
    points, reference = [], None
    for at_budget, runs in ((False, an.ladder), (True, an.records)):  # the x1 run is a comparison record
        for r in runs:
            if r.get("optimizer") != baseline or r.get("model_size") != size or r.get("seed") != seed \
                    or r["status"] != "completed" or r.get("final_eval_loss") is None:
                continue
            tokens, loss = budget_tokens(r), float(r["final_eval_loss"])
            if tokens and math.isfinite(loss):
                points.append((tokens, loss))
                reference = loss if at_budget else reference
    return points, reference


def derive_speedups(an: Any, baseline: str) -> None:
    """Fit every (size, seed) ladder and set each comparison record's speedup fields, in place (no ladder: None)."""
    from hf_optbench.measure.speedup import Speedup, fit_ladder, speedup

    for r in an.records + an.ladder:
        r["tokens_per_param"] = tokens_per_param(r)
    if not an.ladder:
        return
    references: dict[tuple[str, Any], float | None] = {}
    for r in an.records:
        r.update(speedup=None, speedup_censored=False, speedup_bound="", speedup_method=None,
                 baseline_equivalent_tokens=None)
        key = (r.get("model_size"), r.get("seed"))
        if key not in an.ladder_fits:
            pts, references[key] = _ladder(an, baseline, *key)
            an.ladder_fits[key] = fit_ladder([t for t, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None
        fit, tokens = an.ladder_fits[key], budget_tokens(r)
        if fit is None or not tokens:
            continue
        if r.get("optimizer") == baseline:
            s = Speedup(1.0, None, "baseline (1 by definition)", tokens)
        elif r["status"] == "diverged":
            s = Speedup(fit.tokens[0] / tokens, "below", fit.method, None)
        elif r["status"] == "completed" and r.get("final_eval_loss") is not None:
            s = speedup(fit, float(r["final_eval_loss"]), tokens, references[key])
        else:
            continue
        r.update(speedup=s.value, speedup_censored=s.censored is not None, speedup_bound=s.censored or "",
                 speedup_method=s.method, baseline_equivalent_tokens=s.equivalent_tokens)


# ------------------------------------------------------------------------------------------------ tables
def budget_table(an: Any) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, warnings): per size, the compared runs' budget and its tokens per non-embedding parameter."""
    header = ["size", "non-embedding parameters", "tokens / step", "steps", "tokens", "tokens / parameter"]
    rows, ratios = [], {}
    for size in an.sizes:
        runs = [r for r in an.records if r.get("model_size") == size and budget_tokens(r)]
        if not runs:
            continue
        r = runs[0]
        ratios[size] = tokens_per_param(r)
        summary = r.get("_summary") or {}
        rows.append([size, f"{r.get('num_params_non_embedding') or 0:,}", str(summary.get("tokens_per_step") or "–"),
                     str(summary.get("max_steps") or r.get("max_steps") or "–"), f"{budget_tokens(r):,.0f}",
                     "–" if ratios[size] is None else f"{ratios[size]:.3g}"])
    known = [v for v in ratios.values() if v]
    warnings = []
    if len(known) > 1 and max(known) / min(known) > RATIO_TOLERANCE:
        warnings.append(f"the sizes differ in tokens per parameter ({min(known):.3g} to {max(known):.3g}): the scaling "
                        "axis mixes model size with data per parameter. State the budget as `budget: "
                        "{tokens_per_param: ...}` in the sweep file to hold it fixed")
    return header, rows, warnings


def ladder_table(an: Any, baseline: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per size, the baseline's final eval loss at each budget multiple (mean ± sd over seeds) and
    how many seeds' curves are power laws."""
    mults = sorted({float(r.get("budget_multiple") or 1.0) for r in an.ladder})
    if not mults:
        return [], []
    mults = sorted(set(mults) | {1.0})
    rows = []
    for size in an.sizes:
        cells = []
        for m in mults:
            vals = [float(r["final_eval_loss"]) for r in an.ladder + an.records
                    if r.get("optimizer") == baseline and r.get("model_size") == size and r["status"] == "completed"
                    and float(r.get("budget_multiple") or 1.0) == m and r.get("final_eval_loss") is not None]
            sd = f" ± {statistics.stdev(vals):.2g}" if len(vals) > 1 else ""
            cells.append(f"{statistics.fmean(vals):.4f}{sd}" if vals else "–")
        fits = [f for (s, _), f in an.ladder_fits.items() if s == size and f is not None]
        power = sum(1 for f in fits if f.method == "power law")
        rows.append([size, *cells, f"power law {power}/{len(fits)}, interpolation {len(fits) - power}/{len(fits)}"])
    return ["size", *[f"x{m:g}" for m in mults], "curve per seed"], rows
