"""Pure measurement rules shared by the recorder (during a run) and the report (afterwards): the spike rule,
time-to-target, the area under the loss curve and step-time medians, written once so that live figures and the
report's agree on the same rows.

Pure Python (no torch). The storage-bytes and FLOPs functions live in :mod:`hf_optbench.measure.state_bytes` and
:mod:`hf_optbench.measure.flops`; they are re-exported here so ``from hf_optbench.measure import metrics as M;
M.flops_per_token(...)`` keeps working.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------------------
# Spikes
# --------------------------------------------------------------------------------------------------------------

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): makes the MAD a consistent estimator of a Gaussian's sigma
RELATIVE_SCALE_FLOOR = 1e-3  # robust deviation is at least 0.1% of |median|: a flat plateau has MAD 0


@dataclass(frozen=True)
class Spike:
    """A value flagged by the spike rule: its index/step, value, the window's median and its robust z."""

    index: int
    value: float
    baseline: float
    z: float


class SpikeDetector:
    """Streaming Hampel identifier on the upper side: the spike rule of the benchmark.

    A value x_t is a spike when ``x_t > median(W) + k * s`` with W the last ``window`` finite values *before* t,
    ``s = max(1.4826 * MAD(W), 1e-3 * |median(W)|)`` and at least ``min_history`` values in W. Its size is the
    robust z ``(x_t - median) / s``. Non-finite values are never spikes and do not enter W (divergence is
    reported separately). Spikes do enter W: a median is barely moved by one outlier, and a lasting jump stops
    being flagged once it is the new level.
    """

    def __init__(self, window: int = 50, threshold: float = 6.0, min_history: int = 10) -> None:
        if window < 3 or min_history < 2 or min_history > window or threshold <= 0:
            raise ValueError(f"bad spike rule: window={window}, threshold={threshold}, min_history={min_history}")
        self.window, self.threshold, self.min_history = window, threshold, min_history
        self._values: deque[float] = deque()  # arrival order
        self._sorted: list[float] = []  # the same values, sorted: the median is O(1) per step
        self.spikes: list[Spike] = []

    def update(self, value: float | None, index: int) -> Spike | None:
        """Feed the next value; returns the Spike if it is one."""
        if value is None or not math.isfinite(value):
            return None
        spike = None
        ordered = self._sorted
        if len(ordered) >= self.min_history:
            med = _sorted_median(ordered)
            floor = max(RELATIVE_SCALE_FLOOR * abs(med), 1e-12)
            # The scale is >= floor, so a value within threshold * floor of the median cannot be a spike: the MAD
            # (a sort of the window's deviations) is only computed for the values that might be one.
            if value - med > self.threshold * floor:
                mad = _sorted_median(sorted([abs(v - med) for v in ordered]))
                scale = max(MAD_TO_SIGMA * mad, floor)
                z = (value - med) / scale
                if z > self.threshold:
                    spike = Spike(index=index, value=value, baseline=med, z=z)
                    self.spikes.append(spike)
        if len(self._values) == self.window:
            old = self._values.popleft()
            del ordered[bisect.bisect_left(ordered, old)]
        self._values.append(value)
        bisect.insort(ordered, value)
        return spike

    @property
    def count(self) -> int:
        return len(self.spikes)

    @property
    def largest(self) -> Spike | None:
        return max(self.spikes, key=lambda s: s.z) if self.spikes else None


def _sorted_median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def detect_spikes(
    values: Sequence[float | None],
    window: int = 50,
    threshold: float = 6.0,
    min_history: int = 10,
    steps: Sequence[int] | None = None,
) -> list[Spike]:
    """The spike rule over a whole series (``Spike.index`` is ``steps[i]`` when given, else ``i``)."""
    det = SpikeDetector(window, threshold, min_history)
    for i, v in enumerate(values):
        det.update(v, steps[i] if steps is not None else i)
    return det.spikes


# --------------------------------------------------------------------------------------------------------------
# Convergence
# --------------------------------------------------------------------------------------------------------------


class TargetTracker:
    """First point at which a (trailing-mean smoothed) loss reaches each target; targets only ever get reached once.

    ``smoothing=1`` uses the raw loss (eval losses are already averages over the validation split).
    """

    def __init__(self, targets: Iterable[float], smoothing: int = 1) -> None:
        self.targets = sorted({float(t) for t in targets}, reverse=True)
        self.smoothing = max(1, int(smoothing))
        self._window: deque[float] = deque(maxlen=self.smoothing)
        self._sum = 0.0
        self.reached: dict[float, dict[str, float | int | None]] = {}

    def update(self, loss: float | None, step: int, tokens: int | None, seconds: float | None) -> list[float]:
        """Feed one point; returns the targets reached at it. Non-finite losses are skipped."""
        if loss is None or not math.isfinite(loss):
            return []
        if len(self._window) == self.smoothing:
            self._sum -= self._window[0]
        self._window.append(loss)
        self._sum += loss
        if len(self._window) < self.smoothing:
            return []
        level = self._sum / self.smoothing
        hit = [t for t in self.targets if t not in self.reached and level <= t]
        for t in hit:
            self.reached[t] = {"step": step, "tokens": tokens, "seconds": seconds}
        return hit

    def as_dict(self) -> dict[str, dict[str, float | int | None] | None]:
        """{"<target>": {"step", "tokens", "seconds"} or None if never reached}."""
        return {_target_key(t): self.reached.get(t) for t in self.targets}


def _target_key(t: float) -> str:
    return repr(float(t))


def time_to_targets(
    points: Iterable[tuple[int, int | None, float | None, float | None]], targets: Iterable[float], smoothing: int = 1
) -> dict[str, dict[str, float | int | None] | None]:
    """Targets reached over ``(step, tokens, seconds, loss)`` points, in the format of ``TargetTracker.as_dict``."""
    tracker = TargetTracker(targets, smoothing)
    for step, tokens, seconds, loss in points:
        tracker.update(loss, step, tokens, seconds)
    return tracker.as_dict()


def trapezoid_auc(x: Sequence[float], y: Sequence[float | None]) -> float | None:
    """Trapezoid area under y(x) over the finite points (x ascending); None with fewer than two.

    The area under loss-vs-tokens ranks optimizers by how low the loss was *throughout* a fixed budget, not only
    at the end; divide by the token span for the mean loss.
    """
    pts = [(float(a), float(b)) for a, b in zip(x, y, strict=True) if a is not None and b is not None and math.isfinite(b)]
    if len(pts) < 2:
        return None
    return sum(0.5 * (y0 + y1) * (x1 - x0) for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False))


def median_and_p90(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Median and 90th percentile (linear interpolation between order statistics, as numpy's default)."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None, None
    if len(vals) == 1:
        return vals[0], vals[0]
    return statistics.median(vals), statistics.quantiles(vals, n=10, method="inclusive")[8]
