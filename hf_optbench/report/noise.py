"""When a wall-clock figure cannot be read: the seed-to-seed spread of a timing ratio against its effect.

Wall-clock figures (step time, tokens/s, seconds to target) move with the machine's other load: on a shared machine
identical configurations can run an order of magnitude apart, and one seconds-to-target ratio can change several
fold between two runs of the same sweep. Token and step counts do not move that way. So beside every wall-clock
comparison the report checks the per-seed paired ratios (optimizer over baseline, same seed): when their range
(max / min) is wider than the effect (the mean ratio's distance from 1, both on the log scale), the figure is marked
as not interpretable on this machine instead of being shown as a result.

Runs a sweep ran side by side (``launcher.jobs``) share memory bandwidth and caches even on cores of their own, so
a wall-clock comparison measured that way is marked too, with how many runs shared the machine (summary.json
``concurrent_runs``): its figures are not those of the same runs on an idle machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hf_optbench.study.records import RunRecord

WALL_CLOCK_KEYS = ("step_time_median_s", "step_time_p90_s", "tokens_per_s", "seconds_to_target")


def paired_ratios(optimizer: Mapping[Any, float | None], baseline: Mapping[Any, float | None]) -> list[float]:
    """optimizer / baseline per seed present (and positive) in both."""
    out = []
    for seed, o in optimizer.items():
        b = baseline.get(seed)
        if o is not None and b is not None and o > 0 and b > 0 and math.isfinite(o) and math.isfinite(b):
            out.append(float(o) / float(b))
    return out


def spread_exceeds_effect(ratios: Sequence[float]) -> bool:
    """True when the per-seed ratios span more (log max/min) than their mean effect (|mean log ratio|) and more
    than the verdict's equivalence margin (seeds that agree within 2 % are readable even with no effect)."""
    from hf_optbench.measure.verdict import RATIO_MARGIN

    if len(ratios) < 2:
        return False
    logs = [math.log(r) for r in ratios]
    return max(logs) - min(logs) > max(abs(statistics.fmean(logs)), RATIO_MARGIN)


def shared_note(*sides: Mapping[Any, float | None]) -> str:
    """"" unless some figure of ``sides`` (from :func:`by_seed`) was measured while its sweep ran several runs at
    once; then e.g. "(measured with 2 runs at once sharing the machine)"."""
    shared = max((int(getattr(side, "concurrent_runs", 1) or 1) for side in sides), default=1)
    return f"(measured with {shared} runs at once sharing the machine)" if shared > 1 else ""


def wallclock_note(optimizer: Mapping[Any, float | None], baseline: Mapping[Any, float | None]) -> str:
    """"" when the paired ratios are readable (or there are fewer than two seeds to judge) and no figure was
    measured under sharing, else the warning(s) to print beside the figure, e.g. "(spread 0.8-9.7x > effect 1.4x:
    not interpretable on this machine)" and "(measured with 2 runs at once sharing the machine)"."""
    ratios = paired_ratios(optimizer, baseline)
    notes = [shared_note(optimizer, baseline)] if ratios else []  # no pair: no comparison to mark
    if spread_exceeds_effect(ratios):
        effect = math.exp(statistics.fmean(math.log(r) for r in ratios))
        notes.insert(0, f"(spread {min(ratios):.2g}-{max(ratios):.2g}x > effect {effect:.2g}x: not interpretable "
                        "on this machine)")
    return " ".join(n for n in notes if n)


class SeedValues(dict):  # type: ignore[type-arg]
    """{seed: value} that also carries ``concurrent_runs``: the most runs that shared the machine while these
    values were measured (1: each alone, or not recorded)."""

    concurrent_runs: int = 1


def _concurrent_runs(record: RunRecord) -> int:
    """summary.json's ``concurrent_runs`` of a record (a column of its own, else its summary's)."""
    value = record.get("concurrent_runs", record.summary.get("concurrent_runs"))
    return int(value) if isinstance(value, int | float) and value >= 1 else 1


def by_seed(records: Sequence[Mapping[str, Any]], key: str, optimizer: str, size: str) -> SeedValues:
    """{seed: value of ``key``} of one optimizer at one size (a report cell, ``study.records.Cell``: the size itself
    in a single-ratio sweep), with how many runs shared the machine meanwhile. ``records``: run records, or rows
    in their dict form."""
    runs = [RunRecord.from_row(r) for r in records]
    chosen = [r for r in runs if r.optimizer == optimizer and size in (r.cell.label, r.model_size)]
    out = SeedValues({r.seed: (None if r.get(key) is None else float(r[key])) for r in chosen})
    out.concurrent_runs = max((_concurrent_runs(r) for r in chosen if r.get(key) is not None), default=1)
    return out


def unmeasurable(records: Sequence[Mapping[str, Any]], optimizers: Sequence[str], sizes: Sequence[str],
                 baseline: str) -> dict[tuple[str, str], str]:
    """{(optimizer, wall-clock metric): reason} for the verdict cells no word may be drawn from (on a loaded machine
    identical reruns can flip a seconds-to-target verdict between "no difference" and "deficit vanishes"): figures
    measured while runs shared the machine, or whose per-seed ratios spread wider than their effect at some size.
    ``measure.verdict.verdict`` gives them "not measurable here" with the reason and leaves them out of the
    family it controls."""
    from hf_optbench.measure.verdict import METRICS

    out: dict[tuple[str, str], str] = {}
    for key in (m.key for m in METRICS if m.key in WALL_CLOCK_KEYS):
        for opt in (o for o in optimizers if o != baseline):
            reasons = []
            for size in sizes:
                mine, base = by_seed(records, key, opt, size), by_seed(records, key, baseline, size)
                ratios = paired_ratios(mine, base)
                if not ratios:
                    continue
                shared = max(mine.concurrent_runs, base.concurrent_runs)
                if shared > 1:
                    reasons.append(f"{size}: measured with {shared} runs at once sharing the machine (a sweep with "
                                   "launcher.jobs: 1 measures each run alone)")
                elif spread_exceeds_effect(ratios):
                    effect = math.exp(statistics.fmean(math.log(r) for r in ratios))
                    reasons.append(f"{size}: per-seed ratios spread {min(ratios):.2g}-{max(ratios):.2g}x, wider than "
                                   f"the effect {effect:.2g}x (this machine's load moves it)")
            if reasons:
                out[(opt, key)] = "; ".join(reasons)
    return out
