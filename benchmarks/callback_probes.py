"""Two probes shared by the overhead benchmarks, for costs too small to see as a difference between whole runs
on a shared CPU (where separate runs' medians move by several ms):

* ``EveryOtherStep``: hands a set of callbacks the events of even step intervals only, so steps with and without
  them are neighbours under the same machine load and their medians can be compared within one run;
* ``SelfTimer``: wraps a callback's event methods in a timer, so its own time per step is measured directly.

Written here because no library offers either: transformers' callbacks have no enable/disable switch and its
profiling (``torch.profiler``) does not attribute time to callbacks.
"""

from __future__ import annotations

import contextlib
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


class Sections:
    """Exclusive wall time per named part of each step interval, for a breakdown that adds up: a part's time
    leaves out the parts timed inside it (``compute_loss`` inside ``training_step``), and :meth:`cut` closes the
    interval at each step clock's stamp. ``wrap`` times a method of an object (set on the instance, so the
    Trainer's ``self.method(...)`` finds it); ``time(name)`` is a context manager for code of one's own."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.intervals: list[dict[str, float]] = [{}]
        self._stack: list[list[Any]] = []  # [name, start, time of the parts inside]

    def _enter(self, name: str) -> None:
        self._stack.append([name, self.clock(), 0.0])

    def _exit(self) -> None:
        name, start, inner = self._stack.pop()
        spent = self.clock() - start
        now = self.intervals[-1]
        now[name] = now.get(name, 0.0) + spent - inner
        if self._stack:
            self._stack[-1][2] += spent

    @contextlib.contextmanager
    def time(self, name: str):
        self._enter(name)
        try:
            yield
        finally:
            self._exit()

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        method = getattr(obj, attr)

        @functools.wraps(method)
        def timed(*args, **kwargs):
            self._enter(name)
            try:
                return method(*args, **kwargs)
            finally:
                self._exit()

        setattr(obj, attr, timed)

    def wrap_callback(self, callback: Any, name: str) -> None:
        """Every event method of a Trainer callback, as one part."""
        for event in (*EVENTS, "on_pre_optimizer_step", "on_substep_end", "on_epoch_begin", "on_epoch_end",
                      "on_init_end", "on_prediction_step"):
            if hasattr(callback, event):
                self.wrap(callback, event, name)

    def watch_gc(self, name: str = "Python's garbage collector") -> Any:
        """Time the garbage collector's runs as a part of their own (out of the part that allocated); returns the
        callback, for ``gc.callbacks.remove``."""
        import gc

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                self._enter(name)
            elif self._stack and self._stack[-1][0] == name:
                self._exit()

        gc.callbacks.append(on_gc)
        return on_gc

    def cut(self) -> None:
        """End the current interval (called at a step clock's stamp); parts still open count to the next one."""
        self.intervals.append({})
