"""Convergence targets fixed in advance, and each run's time to them, censored at the budget when never reached.

Why not "the worst loss any run reached" (the old rule): that level sits at the end of the cosine schedule, where
every optimizer arrives at the same step because the schedule ends, not because of the optimizer; it moves when an
optimizer is added or dropped; and a diverged run has to be dropped to keep it reachable. Here the targets of a
size come from the **baseline's reference runs only** (AdamW by default): the baseline's smoothed train loss at
25 / 50 / 75 / 100 % of its step budget, averaged over its seeds (or one value given with ``--target_loss``). Adding
or dropping any other optimizer cannot move them.

Why the smoothed *train* loss and not the eval loss: it is measured at every step, so a time to target is resolved
to one step; eval runs every ``eval_steps`` (every 50 of 300 steps in the CPU demo), which would quantise a time to
target to a sixth of the run. The held-out figure is reported beside it: every run's eval loss at the token counts
of the same 25 / 50 / 75 / 100 % points (linear interpolation between the two evaluations around each point).
"Smoothed" is the recorder's rule (hf_optbench.measure.metrics.TargetTracker): the trailing mean of the last
``target_smoothing_steps`` train losses, so the report and a run's own summary agree.

A run that never reaches a target, or diverges first, is **censored**: its time is its budget (planned steps,
their tokens, and its seconds projected to the planned steps) and ``<key>_censored`` is True, the form the
verdict (hf_optbench.measure.verdict) reads as a bound. It is never dropped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_optbench.study.records import RunRecord

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
# The target the verdict uses: mid-run, where the optimizer (not the end of the schedule) decides when it is hit.
VERDICT_TARGET = "50%"
GIVEN = "given"
TIME_KEYS = ("steps", "tokens", "seconds")


@dataclass(frozen=True)
class Target:
    """One target loss of one size, and how it was derived (shown in the report)."""

    size: str
    name: str  # "25%", "50%", "75%", "100%" or "given"
    loss: float
    derivation: str
    fraction: float | None = None
    step: int | None = None
    tokens: int | None = None


def target_name(fraction: float) -> str:
    return f"{fraction:.0%}"


def finite_losses(train: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(step, loss) of the train rows with a finite loss."""
    return [(int(r["step"]), float(r["loss"])) for r in train
            if r.get("loss") is not None and math.isfinite(float(r["loss"]))]


def smoothed_at(train: Sequence[Mapping[str, Any]], step: int, window: int) -> float | None:
    """Trailing mean of the last ``window`` finite train losses at or before ``step`` (None before the window is
    full, or if the run never got to ``step``: a diverged run has no loss there)."""
    pts = finite_losses(train)
    if not pts or pts[-1][0] < step:
        return None
    upto = [loss for s, loss in pts if s <= step]
    return statistics.fmean(upto[-window:]) if len(upto) >= window else None


def budget(rec: RunRecord, train: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """The run's budget in steps (its planned max_steps), tokens (steps x tokens_per_step) and seconds (its train
    seconds projected to the planned steps: a diverged run stopped early). None without a step count."""
    steps = rec.recorded("max_steps") or rec.recorded("steps")
    if not steps or int(steps) <= 0:
        return None
    steps = int(steps)
    per_step = rec.recorded("tokens_per_step")
    timed = [r for r in train if r.get("elapsed_s") is not None and r.get("step")]
    seconds = float(timed[-1]["elapsed_s"]) * steps / int(timed[-1]["step"]) if timed else None
    return {"steps": steps, "tokens": steps * int(per_step) if per_step else None, "seconds": seconds}


def baseline_targets(size: str, runs: Sequence[tuple[RunRecord, Sequence[Mapping[str, Any]], int]],
                     baseline: str, fractions: Sequence[float] = FRACTIONS) -> tuple[list[Target], list[str]]:
    """Targets of one size from the baseline's completed runs ``(record, train rows, smoothing window)``: the mean
    over seeds of the smoothed train loss at each fraction of the step budget. Returns (targets, notes): one note
    for the fractions that come before the smoothing window is full (a question these runs cannot answer, and
    the setting that would), one per run that has no loss at a fraction's step for another reason."""
    notes: list[str] = []
    out = []
    early: dict[str, tuple[int, int, int]] = {}  # fraction name -> (step, steps, window): window not yet full
    for f in fractions:
        values, seeds, where = [], [], None
        for rec, train, window in runs:
            b = budget(rec, train)
            if b is None:
                continue
            step = max(1, round(f * b["steps"]))
            v = smoothed_at(train, step, window)
            if v is None and step < window:
                early[target_name(f)] = (step, b["steps"], window)
                continue
            if v is None:
                notes.append(f"{size}: {rec.run_id} has no smoothed loss at step {step}; not used for the "
                             f"{target_name(f)} target")
                continue
            values.append(v)
            seeds.append(rec.seed)
            where = (step, b["steps"], b["tokens"] and round(f * b["tokens"]), window)
        if not values or where is None:
            continue
        step, total, tokens, window = where
        derivation = (f"{baseline}'s train loss (trailing mean of {window} steps) at step {step} of {total}, mean "
                      f"of {len(values)} seed(s) ({', '.join(f'{v:.4f}' for v in values)})")
        out.append(Target(size, target_name(f), statistics.fmean(values), derivation, f, step, tokens))
    if early:
        notes.append(f"{size}: {early_note(early)}")
    return in_order(out, size, baseline, notes), notes


def in_order(targets: Sequence[Target], size: str, baseline: str, notes: list[str]) -> list[Target]:
    """The targets whose loss lies below every earlier one's: a target the baseline reaches at or before an earlier
    one (its loss at 100 % of the budget not below its loss at 75 %) measures the end of the schedule, not a time to
    quality, and every optimizer's ratio to it reads 1 [1, 1]; it is refused as a target, and said in ``notes``."""
    kept: list[Target] = []
    for t in targets:
        if kept and not t.loss < kept[-1].loss:
            notes.append(f"{size}: the {t.name} target ({t.loss:.4f}) is not below the {kept[-1].name} one "
                         f"({kept[-1].loss:.4f}): {baseline} reaches it out of order, so it is no target (left out)")
            continue
        kept.append(t)
    return kept


def early_note(early: Mapping[str, tuple[int, int, int]]) -> str:
    """Why targets are missing when the runs are short next to their smoothing window, and the setting that fits."""
    names = list(early)
    steps = sorted({s for s, _, _ in early.values()})
    total = max(t for _, t, _ in early.values())
    window = max(w for _, _, w in early.values())
    verdict = (f", so time to target is not answered (the verdict uses the {VERDICT_TARGET} one)"
               if VERDICT_TARGET in names else "")
    return (f"no {' / '.join(names)} target{verdict}: these runs are {total} steps, and at step"
            f"{'s' if len(steps) > 1 else ''} {' / '.join(map(str, steps))} the {window}-step smoothing window is not "
            f"yet full (target_smoothing_steps <= {max(1, min(steps))} would fit)")


def merge_size_notes(notes: Sequence[str]) -> list[str]:
    """``"tiny: X"`` and ``"mini: X"`` as one ``"tiny, mini: X"``, in first-seen order: one line per reason, not
    one per size."""
    merged: dict[str, list[str]] = {}
    for note in notes:
        size, sep, text = note.partition(": ")
        key = text if sep and " " not in size else note
        merged.setdefault(key, []).append(size if sep and " " not in size else "")
    return [f"{', '.join(sizes)}: {text}" if all(sizes) else text for text, sizes in merged.items()]


def given_target(size: str, loss: float) -> Target:
    return Target(size, GIVEN, float(loss), "given with --target_loss")


def time_to_each(train: Sequence[Mapping[str, Any]], targets: Sequence[Target], window: int,
                 limit: Mapping[str, float] | None) -> dict[str, dict[str, Any]]:
    """{target name: {steps, tokens, seconds, censored}} for one finished run: the first point its smoothed train
    loss is at or below the target (the recorder's rule), else its budget ``limit`` with censored True."""
    from hf_optbench.measure.metrics import time_to_targets

    points = ((r.get("step"), r.get("tokens"), r.get("elapsed_s"), r.get("loss")) for r in train)
    hits = time_to_targets(points, [t.loss for t in targets], smoothing=window)
    out = {}
    for t in targets:
        hit = hits.get(repr(float(t.loss)))
        if hit:
            out[t.name] = {"steps": hit["step"], "tokens": hit["tokens"], "seconds": hit["seconds"],
                           "censored": False}
        else:
            out[t.name] = {k: (limit or {}).get(k) for k in TIME_KEYS} | {"censored": True}
    return out


def eval_at_tokens(evals: Sequence[Mapping[str, Any]], tokens: float | None) -> float | None:
    """The run's eval loss at ``tokens``, interpolated linearly between the evaluations around it; None outside
    the evaluated range (no extrapolation) or after a divergence (non-finite loss)."""
    pts = [(float(r["tokens"]), float(r["eval_loss"])) for r in evals
           if r.get("tokens") is not None and r.get("eval_loss") is not None]
    if tokens is None or not pts or not (pts[0][0] <= tokens <= pts[-1][0]):
        return None
    xs, ys = zip(*sorted(pts), strict=True)
    value = float(np.interp(tokens, xs, ys))
    return value if math.isfinite(value) else None


def mean_loss_over_budget(train: Sequence[Mapping[str, Any]], budget_tokens: float | None,
                          diverged: bool) -> float | None:
    """The train loss averaged over the token budget (area under loss-vs-tokens / tokens spanned). The raw
    ``loss_auc_tokens`` of summary.json is not normalised, so a run that stopped early gets a smaller ("better")
    area. Here a completed run that logged fewer tokens than its budget is extended at its last loss; a diverged
    run has no mean (None: its divergence is reported under stability)."""
    from hf_optbench.measure.metrics import trapezoid_auc

    if diverged or not budget_tokens:
        return None
    pts = [(float(r["tokens"]), float(r["loss"])) for r in train if r.get("tokens") is not None
           and r.get("loss") is not None and math.isfinite(float(r["loss"]))]
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    area = trapezoid_auc(xs, ys) or 0.0
    end = max(float(budget_tokens), xs[-1])
    area += ys[-1] * (end - xs[-1])
    return area / (end - xs[0]) if end > xs[0] else None
