"""Two probes shared by the overhead benchmarks, for costs too small to see as a difference between whole runs
on a shared CPU (where separate runs' medians move by several ms):

* ``EveryOtherStep``: hands a set of callbacks the events of even step intervals only, so steps with and without
  them are neighbours under the same machine load and their medians can be compared within one run;
* ``SelfTimer``: wraps a callback's event methods in a timer, so its own time per step is measured directly.

Written here because no library offers either: transformers' callbacks have no enable/disable switch and its
profiling (``torch.profiler``) does not attribute time to callbacks.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from transformers import TrainerCallback

EVENTS = ("on_train_begin", "on_step_begin", "on_optimizer_step", "on_step_end", "on_log", "on_evaluate",
          "on_save", "on_train_end")
ONE_OFF = ("on_train_begin", "on_train_end")


class EveryOtherStep(TrainerCallback):
    """Forwards train begin/end always, and every other event only in even intervals. Interval N runs from step
    N-1's end to step N's end: it holds step N-1's on_log, then step N's on_step_begin ... on_step_end."""

    def __init__(self, *callbacks: Any) -> None:
        self.inner = callbacks

    def __getattribute__(self, name: str) -> Any:
        if name not in EVENTS:
            return super().__getattribute__(name)
        inner = super().__getattribute__("inner")

        def forward(args, state, control, **kwargs):
            interval = state.global_step if name == "on_step_end" else state.global_step + 1
            if name in ONE_OFF or interval % 2 == 0:
                for cb in inner:
                    result = getattr(cb, name)(args, state, control, **kwargs)
                    control = result if result is not None else control
                return control
            return None

        return forward


def split_toggled(intervals: list[float], skip: int) -> dict[str, list[float]]:
    """Step intervals of an ``EveryOtherStep`` run split into on (even interval) and off; index i is the interval
    ending at step i + 2, and the first ``skip`` are dropped."""
    out: dict[str, list[float]] = {"on": [], "off": []}
    for i, dt in enumerate(intervals):
        if i >= skip:
            out["on" if i % 2 == 0 else "off"].append(dt)
    return out


class SelfTimer:
    """Wraps callbacks' event methods in a timer. Per-step events add to ``per_step[-1]`` (a new entry opens at the
    first wrapped callback's on_step_begin; a step's entry also holds the on_log that follows it), train
    begin/end to ``once``. Wrap several callbacks in the order the Trainer calls them."""

    def __init__(self) -> None:
        self.per_step: list[float] = []
        self.once: list[float] = []
        self._opener: Any = None

    def wrap(self, callback: Any) -> Any:
        if self._opener is None:
            self._opener = callback
        for name in EVENTS:
            method = getattr(callback, name)

            @functools.wraps(method)
            def timed(*a, _m=method, _name=name, _cb=callback, **kw):
                t = time.perf_counter()
                try:
                    return _m(*a, **kw)
                finally:
                    spent = time.perf_counter() - t
                    if _name in ONE_OFF:
                        self.once.append(spent)
                    else:
                        if _name == "on_step_begin" and _cb is self._opener:
                            self.per_step.append(0.0)
                        if self.per_step:
                            self.per_step[-1] += spent

            setattr(callback, name, timed)
        return callback
