"""The sweep's ETA, predicted from its structure: what it will run (known now or expected later) times what a step
and a run cost here, over the runs at once.

Why: an average of finished runs over the runs known so far misses what a sweep adds as results come in (the tuner's
extensions and later axes, each ladder rung's own tuning, the attribution runs) and that a 4x rung costs 4 budget
units (docs/notes/study_measurements.md). The sweep knows its structure before it starts:

* **tuning**, per optimizer x size (x data ratio), the axes the tuning rule will run (``study.tuning.outline``: the
  learning rate's grid, weight decay's and the non-matrix group's grids less their x1 point, each ladder rung's grid
  at its budget multiple), each :data:`EXPECTED_EXTENSIONS` steps beyond its edge on average, and
  :data:`EXPECTED_CONFIRMED` of its points again at each ``confirm_seeds`` seed;
* **comparison**: its runs (the baseline's ladder rungs at their multiples); the ladder's own extension (a run beating
  the top rung) is not predicted: it is counted once the sweep adds it;
* **attribution**: the comparison seeds again for each optimizer other than the baseline whose non-matrix group is
  tuned;
* **second tuning draw** (``tune.second_draw``): each drawn cell's tuning once more at the draw's seed, and
  :data:`EXPECTED_DRAW_RERUN` of its comparison runs (those whose tuned values the draw changes), in groups of their
  own (:data:`DRAW`): the draw runs after the main tuning has settled, and its comparison reruns runs whose ids the
  main comparison has finished;
* **calibration**: the sweep-end step-time measurement (study.calibration).

A run's cost is a fixed part (process, data, model, evaluation) plus its steps times the step time of its optimizer x
size. Both come from the runs that finished (``train_runtime_s`` / ``steps`` of their summary.json, and the rest of
their wall time); an optimizer x size no run has measured yet takes a short in-process measurement of its plain step
(``calibration.quick_step_times``) plus what the runs' steps measured beyond theirs; before any run, the priors
:data:`PRIOR_STEP_SCALE` and :data:`PRIOR_FIXED_S`. Known runs are counted as they are (a finished one not at all,
one in flight for what is left of it); each group of runs (a tuning axis, a phase's optimizer x size x budget) counts
at least its expected number until its phase is settled.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.rundir import BASELINE, parse_run_id
from hf_optbench.study import budget as budgets
from hf_optbench.study.calibration import (
    ROUNDS,
    STEPS_PER_ROUND,
    WARMUP_STEPS,
    compared_entries,
    quick_step_times,
    run_threads,
    settings,
    skip_reason,
)
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.sweep_state import hms, plan_slots
from hf_optbench.study.worker_client import unavailable_reason

# Extensions per tuning axis, expected: the committed demo (docs/results/cpu_demo) made 13 over its 22 axes, 0.59
# (docs/notes/study_measurements.md).
EXPECTED_EXTENSIONS = 0.6
# Points of a tuning axis run again at each confirm seed, expected, by the axis's kind (study.tuning.outline): the
# learning rate's best and nearer neighbour always (the rule measures the seed noise there), each rung's likewise;
# weight decay's and the non-matrix ratio's, decided against the noise the learning rate measured, none.
EXPECTED_CONFIRMED = {"lr": 2, "rung": 2}
# Share of a drawn cell's comparison runs the second tuning draw reruns (those whose optimizer's tuned values it
# changed): 90 of 120 in the CPU study (docs/notes/study_measurements.md).
EXPECTED_DRAW_RERUN = 0.75
# A run's cost beyond its steps (the warm worker's fork 0.79 s, benchmarks/RESULTS.md; the data, the model and the
# final evaluation of 384 blocks), before a run has measured it: recipes/sweeps/cpu_demo.yaml's 1.2 s.
PRIOR_FIXED_S = 1.2
# A run's step over the plain loop's step (quick_step_times), before a run has measured it: the Trainer's share of
# the step and the runs sharing the machine; 1.19-1.23 measured in the demo with two runs at once
# (docs/notes/study_measurements.md). Only the dry run and the lines before the first run ends use it: the runs' own steps
# replace it.
PRIOR_STEP_SCALE = 1.25
# The warm worker's start (its imports, once per sweep, before the first run): 4.09 s in
# benchmarks/results/run_overhead.md. Counted until the first run starts, for sweeps whose runs it serves.
PRIOR_WORKER_START_S = 4.09
# The calibration's child process: interpreter and imports (torch, transformers), and one entry's build per round.
CALIBRATION_START_S, CALIBRATION_BUILD_S = 4.0, 0.2
# A round of a phase ends when its last run does; with ``jobs`` slots, on average half a run of idle per other slot.
# Tuning runs in rounds (each axis's grid, its extensions, the next axis): about 1.5 per level of axes (demo: 5
# rounds for 3 levels).
ROUNDS_PER_LEVEL = 1.5
# The second tuning draw's groups: its phases' names with this prefix ("draw-tune", "draw-compare"). Groups of their
# own: the draw's tuning runs after the main tuning has settled, and its comparison reruns ids the main comparison
# has finished, so counted in the main groups the draw would drop out of the ETA.
DRAW = "draw-"


def group_of(run: RunSpec, draw: bool = False) -> tuple[Any, ...]:
    """The group a run counts in: (phase, optimizer, size, data ratio, axis, budget multiple); the axis of a tuning
    run from its id (``__wdx``: weight decay, ``__nmx``: the non-matrix ratio, ``__dx``: a rung's rate). ``draw``: a
    run of the second tuning draw, whose phase is prefixed with :data:`DRAW`."""
    phase = DRAW + run.phase if draw else run.phase
    if run.phase != "tune":
        return (phase, run.optimizer, run.model_size, run.budget_tpp, None, run.budget_multiple)
    point = parse_run_id(run.run_id)
    axis = "rung" if point.get("budget_multiple") is not None else "nm" if point.get("nonmatrix_multiplier") \
        is not None else "wd" if point.get("wd_multiplier") is not None else "lr"
    return (phase, run.optimizer, run.model_size, run.budget_tpp, axis, point.get("budget_multiple"))


@dataclass
class Structure:
    """What the sweep runs: each group's expected count and steps per run, from the file and the registry."""

    expected: dict[tuple[Any, ...], float] = field(default_factory=dict)
    steps: dict[tuple[Any, ...], int] = field(default_factory=dict)
    tuning_levels: int = 0  # axes that follow one another (learning rate; weight decay / ratio; rungs)


def _base_steps(spec: SweepSpec, opt: str, size: str, tpp: float | None) -> int:
    if (size, opt, tpp) in spec.steps:
        return int(spec.steps[(size, opt, tpp)])
    steps = [r.max_steps for r in spec.runs if r.optimizer == opt and r.model_size == size and r.max_steps
             and r.budget_multiple is None]
    return int(steps[0]) if steps else 0


def _add(s: Structure, key: tuple[Any, ...], count: float, steps: int) -> None:
    s.expected[key] = s.expected.get(key, 0.0) + count
    s.steps[key] = steps


def structure(spec: SweepSpec) -> Structure:
    """The sweep's expected runs by group (see the module doc)."""
    s = Structure()
    for run in spec.runs:
        _add(s, group_of(run), 1, budgets.ladder_steps(_base_steps(spec, run.optimizer, run.model_size,
                                                                   run.budget_tpp), run.budget_multiple))
    if spec.tune is None or spec.tuning is None:
        return s
    from hf_optbench.study.second_draw_phase import draw_tune
    from hf_optbench.study.tuning import outline
    from hf_optbench.study.tuning_phase import setups

    s.tuning_levels = 1
    compare_seeds = len({r.seed for r in spec.runs if r.phase == "compare"})
    baseline = spec.ladder.optimizer if spec.ladder is not None else BASELINE
    draw = spec.second_draw
    # the tuning rule's own axes (study.tuning.outline), at the main tuning's seeds and, for a cell of the second
    # tuning draw (study.second_draw), once more at the draw's
    tunes = [("tune", spec.tune)] + ([(DRAW + "tune", draw_tune(spec))] if draw is not None else [])
    for pair in setups(spec):
        o, z, t = pair.optimizer, pair.size, pair.tpp
        base = _base_steps(spec, o, z, t)
        for phase, tune in tunes:
            if phase != "tune" and (draw is None or not draw.includes(z, t)):
                continue
            for axis in outline(tune, pair):
                _add(s, (phase, o, z, t, axis.kind, axis.dx),
                     (axis.points + EXPECTED_EXTENSIONS) * axis.seeds
                     + EXPECTED_CONFIRMED.get(axis.kind, 0) * axis.confirm, budgets.ladder_steps(base, axis.dx))
                if phase == "tune":
                    s.tuning_levels = max(s.tuning_levels, axis.level)
        if pair.tune_nm and o != baseline:
            _add(s, ("attribution", o, z, t, None, None), compare_seeds, base)
    if draw is not None:  # the draw's comparison: the runs whose tuned values it changed
        for run in spec.runs:
            if run.phase == "compare" and draw.includes(run.model_size, run.budget_tpp):
                _add(s, group_of(run, draw=True), EXPECTED_DRAW_RERUN, s.steps[group_of(run)])
    return s


@dataclass
class CostModel:
    """Seconds per step of each optimizer x size and per run beyond its steps: measured by the finished runs where
    they have, else the plain step's measurement (``plain``) scaled by what the runs measured, else the priors."""

    plain: dict[tuple[str, str], float] = field(default_factory=dict)
    measured: dict[tuple[str, str], list[tuple[float, int]]] = field(default_factory=dict)  # (train s, steps)
    fixed: list[float] = field(default_factory=list)

    def observe(self, opt: str, size: str, duration: float, summary: Mapping[str, Any], steps: int = 0) -> None:
        """A finished run: its training seconds and steps, and the rest of its wall time less a data cache it built
        (the first runs of a fresh machine pay it once for all: ``data.build_seconds`` when not ``cache_hit``). A
        summary without them (a stand-in command's) counts the whole run over its planned ``steps``."""
        runtime, done = summary.get("train_runtime_s"), summary.get("steps")
        if not isinstance(runtime, (int, float)) or not isinstance(done, int) or done <= 0 or runtime <= 0:
            if steps > 0:
                self.measured.setdefault((opt, size), []).append((duration, steps))
                self.fixed.append(0.0)
            return
        self.measured.setdefault((opt, size), []).append((float(runtime), done))
        data = summary.get("data") if isinstance(summary.get("data"), Mapping) else {}
        built = float(data.get("build_seconds") or 0.0) if data.get("cache_hit") is False else 0.0
        self.fixed.append(max(0.0, duration - float(runtime) - built))

    def _measured_step(self, key: tuple[str, str]) -> float | None:
        runs = self.measured.get(key)
        return sum(r for r, _ in runs) / sum(n for _, n in runs) if runs else None

    def offset(self) -> float | None:
        """Seconds a run's step costs beyond the plain step (the Trainer's share, the sharing of the machine), mean
        over the optimizer x sizes both measured; None before any run."""
        pairs = [(self._measured_step(k), self.plain[k]) for k in self.measured if k in self.plain]
        diffs = [m - p for m, p in pairs if m is not None]
        return statistics.fmean(diffs) if diffs else None

    def _from_plain(self, plain: float) -> float:
        """A run's step from the plain one: plus the measured offset (the harness's share is per step, not in
        proportion: AdamW's and Muon's steps differ by the optimizer, not by the Trainer), else x the prior."""
        offset = self.offset()
        return plain * PRIOR_STEP_SCALE if offset is None else max(plain + offset, 0.5 * plain)

    def step(self, opt: str, size: str) -> float:
        """Seconds per step: measured, else the plain step's (:meth:`_from_plain`), else the mean of the size's
        other optimizers, else another size's in proportion to the non-embedding parameters (FLOPs per token, 6N)."""
        measured = self._measured_step((opt, size))
        if measured is not None:
            return measured
        if (opt, size) in self.plain:
            return self._from_plain(self.plain[(opt, size)])
        known = {k: self._measured_step(k) or self._from_plain(self.plain.get(k, 0.0))
                 for k in set(self.plain) | set(self.measured)}
        same = [v for k, v in known.items() if k[1] == size and v > 0]
        if same:
            return statistics.fmean(same)
        from hf_optbench.models import non_embedding_params

        other = [v * non_embedding_params(size) / non_embedding_params(k[1]) for k, v in known.items() if v > 0]
        return statistics.fmean(other) if other else 0.0

    def fixed_s(self) -> float:
        """A run's seconds beyond its steps: the median once five runs have ended, the least before (the first runs
        of a sweep share one-time costs: one waits while the other builds the data cache)."""
        if not self.fixed:
            return PRIOR_FIXED_S
        return statistics.median(self.fixed) if len(self.fixed) >= 5 else min(self.fixed)

    def run_s(self, opt: str, size: str, steps: int) -> float:
        return self.fixed_s() + steps * self.step(opt, size)


def calibration_s(entries: Iterable[tuple[str, str]], plain: Mapping[tuple[str, str], float],
                  rounds: int = ROUNDS, steps: int = STEPS_PER_ROUND) -> float:
    """The sweep-end calibration's wall time: the child's start, and each entry's build and steps in every round."""
    per_round = sum(CALIBRATION_BUILD_S + (steps + WARMUP_STEPS) * plain.get(e, 0.0) for e in entries)
    return CALIBRATION_START_S + rounds * per_round


class Predictor:
    """The sweep's remaining wall time (:meth:`remaining`), kept up to date by the sweep's progress: the runs that
    start and end, the phases that begin and settle. Thread-safe: slots report from threads of their own."""

    def __init__(self, spec: SweepSpec, plain: Mapping[tuple[str, str], float] | None = None,
                 calibration: Mapping[str, int] | None = None, jobs: int = 1, startup_s: float = 0.0) -> None:
        self.spec = spec
        self.startup_s = startup_s  # start-up still ahead of the first run (the warm worker's), then 0
        self.cost = CostModel(plain=dict(plain or {}))
        self.structure = structure(spec)
        self.calibration = calibration  # study.calibration.settings: None when the sweep has none
        self.jobs = jobs
        self.done: set[tuple[str, str]] = set()
        self.flying: dict[tuple[str, str], float] = {}
        self.settled: set[str] = set()
        self.extra: dict[str, list[RunSpec]] = {}  # runs of phases the spec does not hold (the attribution's)
        self.drawn: dict[str, list[RunSpec]] = {}  # the second draw's runs by phase, once the draw has begun
        self.in_draw = False  # begin_draw: the draw runs last (before the calibration), so all from then on is its
        self.rounds_done = 0  # tuning rounds begun
        self.draw_rounds_done = 0  # the draw's
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- what the sweep reports
    def known(self) -> list[tuple[bool, RunSpec]]:
        """(whether of the second draw, run) for every run known now."""
        tuning = self.spec.tuning.runs if self.spec.tuning is not None else []
        main = [*tuning, *self.spec.runs, *(r for runs in self.extra.values() for r in runs)]
        return [(False, r) for r in main] + [(True, r) for runs in self.drawn.values() for r in runs]

    def _key(self, run: RunSpec, draw: bool | None = None) -> tuple[str, str]:
        draw = self.in_draw if draw is None else draw
        return (DRAW + run.phase if draw else run.phase, run.run_id)

    def begin_draw(self) -> None:
        """The second tuning draw (study.second_draw_phase) begins: every phase and run from now on is the draw's,
        counted in groups of its own."""
        with self._lock:
            self.in_draw = True

    def begin_phase(self, runs: Sequence[RunSpec], finished: Iterable[RunSpec]) -> None:
        """A phase (or a tuning round) begins with these runs, ``finished`` of them already."""
        with self._lock:
            draw = self.in_draw
            if draw:
                if runs:
                    self.drawn[runs[0].phase] = list(runs)
                self.draw_rounds_done += any(r.phase == "tune" for r in runs)
            else:
                for run in runs:
                    if run.phase not in ("tune", "compare"):
                        self.extra[run.phase] = list(runs)
                        break
                self.rounds_done += any(r.phase == "tune" for r in runs)
            self.done |= {self._key(r, draw) for r in finished}

    def started(self, run: RunSpec) -> None:
        with self._lock:
            self.flying[self._key(run)] = time.monotonic()
            self.startup_s = 0.0  # the runs' launcher is up

    def ended(self, run: RunSpec, duration: float, summary: Mapping[str, Any] | None) -> None:
        with self._lock:
            self.flying.pop(self._key(run), None)
            self.done.add(self._key(run))
            if summary is not None:
                self.cost.observe(run.optimizer, run.model_size, duration, summary, self._steps(run, self.in_draw))

    def settle(self, phase: str) -> None:
        """``phase``'s runs are all known now: its groups count what they hold, no more."""
        with self._lock:
            self.settled.add(phase)

    # ---------------------------------------------------------------- the prediction
    def _steps(self, run: RunSpec, draw: bool = False) -> int:
        """The run's steps (max_steps, which validation sets, else its group's); 1 when neither is known (a sweep
        without validation or budget): a run is then its own unit of cost."""
        return int(run.max_steps or self.structure.steps.get(group_of(run, draw), 0) or 1)

    def work(self) -> tuple[float, int, float]:
        """(run-seconds left, runs left, the mean run's seconds) over the known and the expected runs."""
        now, seconds, left, counts = time.monotonic(), 0.0, 0, {}
        for draw, run in self.known():
            key = group_of(run, draw)
            counts[key] = counts.get(key, 0) + 1
            if self._key(run, draw) in self.done:
                continue
            cost = self.cost.run_s(run.optimizer, run.model_size, self._steps(run, draw))
            started = self.flying.get(self._key(run, draw))
            seconds += max(0.0, cost - (now - started)) if started is not None else cost
            left += started is None
        for key, expected in self.structure.expected.items():
            if key[0] in self.settled or key[0] == "compare":
                continue
            more = max(0.0, expected - counts.get(key, 0))
            seconds += more * self.cost.run_s(key[1], key[2], self.structure.steps[key] or 1)
            left += math.ceil(more)
        return seconds, left, seconds / left if left else 0.0

    def remaining(self) -> float | None:
        """Seconds of wall time left: the work over the runs at once, the idle slots at each round's end, and the
        calibration (alone); None while nothing has measured a step (no plain measurement, no finished run)."""
        with self._lock:
            if not self.cost.plain and not self.cost.measured:
                return None
            seconds, left, mean = self.work()
            rounds = 0.0
            if "tune" not in self.settled and self.spec.tuning is not None:
                rounds += max(1.0, ROUNDS_PER_LEVEL * self.structure.tuning_levels - self.rounds_done)
            if DRAW + "tune" not in self.settled and any(k[0] == DRAW + "tune" for k in self.structure.expected):
                rounds += max(1.0, ROUNDS_PER_LEVEL * self.structure.tuning_levels - self.draw_rounds_done)
                rounds += DRAW + "compare" not in self.settled
            rounds += ("compare" not in self.settled) + ("attribution" not in self.settled and any(
                k[0] == "attribution" for k in self.structure.expected))
            idle = rounds * mean * (self.jobs - 1) / (2 * self.jobs) if left else 0.0
            calibration = 0.0
            if self.calibration is not None and "calibration" not in self.settled:
                entries = {(r.optimizer, r.model_size) for r in self.spec.runs if r.phase == "compare"}
                calibration = calibration_s(entries, self.cost.plain, self.calibration["rounds"],
                                            self.calibration["steps"])
            return seconds / max(1, self.jobs) + idle + calibration + self.startup_s

    def expected_runs(self) -> tuple[int, int]:
        """(runs known now, runs expected in all)."""
        with self._lock:
            counts: dict[tuple[Any, ...], int] = {}
            for draw, run in self.known():
                counts[group_of(run, draw)] = counts.get(group_of(run, draw), 0) + 1
            extra = sum(max(0.0, e - counts.get(k, 0)) for k, e in self.structure.expected.items()
                        if k[0] != "compare" and k[0] not in self.settled)
            return sum(counts.values()), sum(counts.values()) + round(extra)

    def describe(self) -> str:
        """The prediction in words: what it rests on (for ``--dry_run``)."""
        eta = self.remaining()
        known, expected = self.expected_runs()
        steps = ", ".join(f"{o}/{z} {1e3 * self.cost.step(o, z):.1f} ms" for o, z in sorted(self.cost.plain))
        offset = self.cost.offset()
        how = f"x {PRIOR_STEP_SCALE} (prior)" if offset is None else f"+ {1e3 * offset:.1f} ms (measured by the runs)"
        basis = (f"step times: the plain step measured here {how}: {steps}"
                 if self.cost.plain else "no step measured yet (sizes too large to measure here, or a command "
                 "launcher): the ETA follows once a run has finished")
        fixed = f"{self.cost.fixed_s():.1f} s per run beyond its steps ({'measured' if self.cost.fixed else 'prior'})"
        fixed += f"; the warm worker's start ~{self.startup_s:.1f} s (prior, once)" if self.startup_s else ""
        calib = "" if self.calibration is None else "; the step-time calibration at the end (alone) ~{:.0f} s".format(
            calibration_s(self._compared(), self.cost.plain, self.calibration["rounds"], self.calibration["steps"]))
        when = "?" if eta is None else hms(eta)
        return (f"predicted wall time on this machine: {when} for ~{expected} runs ({known} known now, the rest "
                f"added as results come in), {self.jobs} at once; {basis}; {fixed}{calib}")

    def _compared(self) -> set[tuple[str, str]]:
        return {(r.optimizer, r.model_size) for r in self.spec.runs if r.phase == "compare"}


def measurable_here(spec: SweepSpec) -> bool:
    """Whether this process may measure the sweep's steps itself before the runs do: runs of this package on this
    machine (not a command, not SLURM), no GPU visible (a model built here would hold GPU memory beside the runs),
    and every compared size a CPU-class one (a step of a larger model takes seconds)."""
    from hf_optbench.machine import gpu_visible
    from hf_optbench.models import SIZE_CLASS

    sizes = {r.model_size for r in spec.runs}
    return spec.launcher.get("type") != "command" and spec.launcher.get("executor") != "slurm" \
        and not gpu_visible(dict(os.environ)) and all(SIZE_CLASS.get(z) == "cpu" for z in sizes)


def predictor_for(spec: SweepSpec) -> Predictor:
    """The sweep's predictor: its structure, a short in-process measurement of each compared optimizer x size's plain
    step where :func:`measurable_here` (~1 s at the demo's sizes) and the sweep measures steps at all (not with
    ``calibration: false``: test sweeps then have no ETA until their first run ends), its slots, its calibration."""
    measure = measurable_here(spec) and settings(spec) is not None
    plain = quick_step_times(compared_entries(spec), run_threads(spec)) if measure else {}
    calibration = settings(spec) if skip_reason(spec) is None else None
    jobs = len(plan_slots(spec.launcher, max(1, len(spec.runs)))) if spec.launcher.get("executor") != "slurm" else 1
    startup = PRIOR_WORKER_START_S if unavailable_reason(spec.launcher) is None else 0.0
    return Predictor(spec, plain, calibration, jobs, startup)
