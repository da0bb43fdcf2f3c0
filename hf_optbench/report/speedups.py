"""Each comparison run's speedup over the baseline's ladder, and each optimizer's tuned-file entry at a cell: what
several report sections read (the verdict, the ratios, the speedup and attribution sections, the tuning draw). The
budget, ladder and rung-rate tables are the speedup section's (:mod:`hf_optbench.report.sections.speedup`).

The rule is :mod:`hf_optbench.measure.speedup`'s; this module finds each run's ladder: the baseline's completed
runs at the same size and seed (its x1 comparison run and its runs at the other budget multiples), so every speedup
is paired by seed (same initial weights and data order) with the ladder it is read from, and read against the
baseline's own x1 run on that curve (:func:`hf_optbench.measure.speedup.speedup`). A diverged run never
reached any loss, so its speedup is censored below the ladder's smallest budget. Records get ``speedup`` (the
value, or its bound), ``speedup_censored`` (the form :func:`hf_optbench.measure.verdict.verdict` reads),
``speedup_bound`` ("above": at least, "below": at most), ``speedup_method`` and ``baseline_equivalent_tokens``.
"""

from __future__ import annotations

from typing import Any

from hf_optbench.study.budget import budget_tokens, ladder_points
from hf_optbench.study.records import RunRecord


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
