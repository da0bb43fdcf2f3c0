"""When a wall-clock figure cannot be read: the seed-to-seed spread of a timing ratio against its effect.

Wall-clock figures (step time, tokens/s, seconds to target) move with the machine's other load: on the shared
2-core machine identical configurations ran 10-15x apart, and the same seconds-to-target ratio read 2.23 in one
demo and 13.2 in the next. Token and step counts do not move that way. So beside every wall-clock comparison the
report checks the per-seed paired ratios (optimizer over baseline, same seed): when their range (max / min) is
wider than the effect (the mean ratio's distance from 1, both on the log scale), the figure is marked as not
interpretable on this machine instead of being shown as a result.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

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


def wallclock_note(optimizer: Mapping[Any, float | None], baseline: Mapping[Any, float | None]) -> str:
    """"" when the paired ratios are readable (or there are fewer than two seeds to judge), else the warning to
    print beside the figure, e.g. "(spread 0.8-9.7x > effect 1.4x: not interpretable on this machine)"."""
    ratios = paired_ratios(optimizer, baseline)
    if not spread_exceeds_effect(ratios):
        return ""
    effect = math.exp(statistics.fmean(math.log(r) for r in ratios))
    return (f"(spread {min(ratios):.2g}-{max(ratios):.2g}x > effect {effect:.2g}x: not interpretable on this "
            "machine)")


def by_seed(records: Sequence[Mapping[str, Any]], key: str, optimizer: str, size: str) -> dict[Any, float | None]:
    """{seed: value of ``key``} of one optimizer at one size."""
    return {r.get("seed"): (None if r.get(key) is None else float(r[key])) for r in records
            if r.get("optimizer") == optimizer and r.get("model_size") == size}
