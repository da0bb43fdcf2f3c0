"""The tuning grid that brackets the optimum: which runs a sweep's ``tune:`` phase needs next, decided from the runs
that have finished.

Why: a best value at the edge of a grid bounds the optimum, it does not find it, and a comparison at it measures the
grid (measured 2026-11-23: the demo's x1-4-16 grid left 3 of 9 optima at an edge). The rule, per optimizer x size and
hyperparameter (an :class:`Axis`):

1. run the initial grid (``tune.lr_multipliers`` or ``tune.lr_grid``) at every tuning seed;
2. score each point by its mean ``final_tuning_loss`` over the seeds, inf when a seed diverged or failed
   (:func:`score_runs`); the best is the lowest score, ties to the point closest to x1 (the cited value);
3. a best strictly inside the grid is bracketed: the loss rises, or a run diverges, on both sides. Otherwise one
   step is added beyond the edge it sits on (x2 for the learning rate, x3 for weight decay; below the lowest point
   when every point diverged) and the axis goes back to 1, at most ``tune.max_extensions`` times. Weight decay's
   domain ends at 0: below its lowest multiplier the grid tries 0 (no decay) next, and a best at 0 is bracketed
   by the domain (measured 2026-11-25: Lion's tuning loss at `tiny` kept falling as weight decay shrank, by
   0.0005-0.003 nats a step, so a grid in factor-3 steps could never bracket it). A best still at
   an edge then is kept, recorded ``bracketed: false`` and warned about.

Weight decay is tuned coordinate-wise after the learning rate, as Marin's phase I does (arXiv:2509.02046;
marin-community/marin experiments/optimizer_sweep: one hyperparameter at a time, the others at the current best):
for an optimizer whose spec sets ``tune_weight_decay`` (its cited value is not AdamW's: Lion, 8-bit Lion, Sophia,
SOAP), once its learning-rate axis is settled, the weight-decay grid runs at the tuned learning rate; its x1 point
is the learning-rate axis's best run itself. One pass: the learning rate is not tuned again at the new weight decay.

Restart: every decision is replayed from the initial grid and the finished runs (:func:`plan_tuning`), so a sweep
started again after a kill adds exactly the runs it would have added, and the sweep skips those that finished.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import FINAL_STATUSES, parse_run_id, run_id_for
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, _expand, resolve_grid, validate_runs
from hf_optbench.study.tracking_env import tracker_env

Point = tuple[str, str, float, float | None]  # optimizer, size, lr multiplier, wd multiplier (None: the cited one)


def canon(m: float) -> float:
    """A multiplier as a run id spells it (``:g``, 6 significant digits), so that a point read back from an id and
    one the tuner computes compare equal (x1/3 is 0.333333 in both)."""
    return float(f"{float(m):g}")


def metric_value(r: Mapping[str, Any], metric: str) -> Any:
    """``metric`` of a run record: a column of its own, else its summary.json (analysis.load_runs keeps it whole)."""
    value = r.get(metric)
    return value if value is not None else (r.get("_summary") or {}).get(metric)


def score_runs(runs: Sequence[Mapping[str, Any]], metric: str) -> float:
    """Mean ``metric`` over the seeds; inf when a seed did not complete or its value is not finite (a value that
    diverges for one seed is not a safe default)."""
    losses = []
    for r in runs:
        if r.get("status") != "completed":
            return math.inf
        loss = metric_value(r, metric)
        if loss is None:
            raise OptBenchError(
                f"tuning run '{r.get('run_id') or r.get('optimizer')}' has no {metric} in its summary.json: it ran "
                f"without a held-out tuning split. Set tuning_blocks (e.g. 16) in the tuning sweep's overrides and "
                "run it again; learning rates are never selected on the reported eval split.")
        if not math.isfinite(float(loss)):
            return math.inf
        losses.append(float(loss))
    return statistics.fmean(losses) if losses else math.inf


def choose(scores: Mapping[float, float]) -> float | None:
    """The best multiplier: the lowest score, ties to the one closest to x1; None when none has a finite score."""
    best = min(sorted(scores), key=lambda m: (scores[m], abs(math.log(m)) if m > 0 else math.inf))
    return best if math.isfinite(scores[best]) else None


def is_bracketed(grid: Sequence[float], best: float | None, floor: float | None = None) -> bool:
    """The bracketing rule (the module doc): the best point lies strictly inside its grid, or at ``floor``, the
    edge of the hyperparameter's domain (0 for weight decay), with a point above it."""
    return best is not None and (min(grid) < best < max(grid) or (best == floor and max(grid) > best))


def wd_multiplier_of(r: Mapping[str, Any]) -> float | None:
    """A tuning run's weight-decay multiplier: its record's column, else its run id (None: a learning-rate run)."""
    wd = r.get("wd_multiplier")
    return float(wd) if wd is not None else parse_run_id(str(r.get("run_id") or "")).get("wd_multiplier")


def grid_text(grid: Sequence[float]) -> str:
    return "[" + ", ".join(f"x{m:g}" for m in grid) + "]"


@dataclass
class Axis:
    """One hyperparameter of one optimizer x size, replayed from the finished runs: the multipliers run so far
    (initial grid + extensions), their scores, the best, whether it is bracketed, and the points still to run."""

    name: str  # "learning rate" | "weight decay"
    grid: list[float]
    scores: dict[float, float] = field(default_factory=dict)
    extensions: list[float] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)
    best: float | None = None
    bracketed: bool = False
    note: str = ""  # the last decision, in words

    @property
    def done(self) -> bool:
        return not self.pending


def replay_axis(name: str, initial: Sequence[float], score: Callable[[float], float | None], step: float,
                cap: int, floor: float | None = None) -> Axis:
    """The rule of the module docstring, replayed: ``score(m)`` is None while a point has unfinished seeds.
    ``floor``: the edge of the hyperparameter's domain (0 for weight decay). Below the lowest point the grid then
    steps straight to it, and a best at it is bracketed by the domain: no smaller value exists to try."""
    axis = Axis(name, sorted({canon(m) for m in initial}))
    while True:
        found = {m: score(m) for m in axis.grid}
        axis.pending = [m for m, s in found.items() if s is None]
        if axis.pending:
            return axis
        axis.scores = {m: float(s) for m, s in found.items() if s is not None}
        axis.best = choose(axis.scores)
        low, high = axis.grid[0], axis.grid[-1]
        if is_bracketed(axis.grid, axis.best, floor):
            axis.bracketed = True
            if axis.best == floor:
                axis.note = f"best {name} is x{floor:g}, the edge of its domain: bracketed by the domain"
            return axis
        upper = axis.best is not None and axis.best == high
        where = (f"best {name} x{axis.best:g} is at the {'upper' if upper else 'lower'} edge of "
                 f"{grid_text(axis.grid)}" if axis.best is not None
                 else f"every {name} of {grid_text(axis.grid)} diverged or failed")
        if len(axis.extensions) >= cap:
            axis.note = f"{where} after {len(axis.extensions)} extension(s) (tune.max_extensions {cap}): not bracketed"
            return axis
        new = canon(high * step if upper else floor if floor is not None and low > floor else low / step)
        axis.note = f"{where}: adding x{new:g} (extension {len(axis.extensions) + 1} of at most {cap})"
        axis.extensions.append(new)
        axis.grid = sorted(axis.grid + [new])


@dataclass
class PairPlan:
    """The tuning of one optimizer x size: its learning-rate axis, and its weight-decay axis once that has started
    (``wd_note`` says why an optimizer marked ``tune_weight_decay`` does not tune it)."""

    optimizer: str
    size: str
    lr: Axis
    wd: Axis | None = None
    wd_note: str = ""

    def points(self, pending: bool = False) -> list[tuple[float, float | None]]:
        """(lr multiplier, wd multiplier or None) of every point of both axes (only those still to run)."""
        out: list[tuple[float, float | None]] = [(m, None) for m in (self.lr.pending if pending else self.lr.grid)]
        if self.wd is not None and self.lr.best is not None:
            out += [(self.lr.best, None if w == 1.0 else w) for w in (self.wd.pending if pending else self.wd.grid)]
        return list(dict.fromkeys(out))

    @property
    def done(self) -> bool:
        return self.lr.done and (self.wd is None or self.wd.done)

    @property
    def bracketed(self) -> bool:
        return self.lr.bracketed and (self.wd is None or self.wd.bracketed)


@dataclass
class TuningPlan:
    """Every optimizer x size's tuning, and the tuning runs by point (tuning seeds only)."""

    pairs: list[PairPlan]
    runs: dict[Point, list[dict[str, Any]]]
    metric: str

    def at(self, opt: str, size: str, lr: float, wd: float | None = None) -> list[dict[str, Any]]:
        return self.runs.get((opt, size, canon(lr), None if wd is None or wd == 1.0 else canon(wd)), [])


def index_records(records: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[Point, list[dict[str, Any]]]:
    """The tuning runs of ``seeds`` by point; the matrix point is read from the run id (as the sweep named it)."""
    out: dict[Point, list[dict[str, Any]]] = {}
    for r in records:
        point = parse_run_id(str(r.get("run_id") or ""))
        lr = r.get("lr_multiplier") if r.get("lr_multiplier") not in (None, "") else point.get("lr_multiplier")
        seed = r.get("seed") if r.get("seed") is not None else point.get("seed")
        wd = wd_multiplier_of(r)
        if lr is None or seed is None or int(seed) not in seeds or point.get("budget_multiple") is not None:
            continue
        key = (str(point.get("optimizer", r.get("optimizer"))), str(point.get("model_size", r.get("model_size"))),
               canon(lr), None if wd is None or canon(wd) == 1.0 else canon(wd))
        out.setdefault(key, []).append(dict(r))
    return out


def _point_score(runs: Sequence[Mapping[str, Any]], seeds: Sequence[int], metric: str) -> float | None:
    done = [r for r in runs if r.get("status") in FINAL_STATUSES]
    if not {int(r["seed"]) for r in done if r.get("seed") is not None} >= set(seeds):
        return None
    return score_runs(done, metric)


def cited_weight_decay(opt: str, size: str) -> float:
    from hf_optbench.optim.registry import optimizer_defaults

    return float(optimizer_defaults(opt, size)["weight_decay"])


def weight_decay_at(opt: str, size: str, multiplier: float) -> float:
    """The weight decay a run at ``multiplier`` x the cited value gets, to three significant digits as the cited
    defaults are (optim.spec.round3: x1/3 of 0.3 is 0.1, not 0.0999999 from the id's 0.333333)."""
    from hf_optbench.optim.spec import round3

    return round3(cited_weight_decay(opt, size) * multiplier)


def _wd_tunable(spec: SweepSpec, opt: str, size: str, recipe: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether ``opt`` tunes its weight decay (its spec's ``tune_weight_decay``), and why not when it is marked but
    the sweep or its base recipe sets weight_decay (an explicit value would replace the tuned one)."""
    from hf_optbench.optim.registry import OPTIMIZERS, resolve_optimizer_name

    try:
        name = resolve_optimizer_name(opt)
    except OptBenchError:
        return False, ""
    if name not in OPTIMIZERS or not OPTIMIZERS[name].tune_weight_decay:
        return False, ""
    assert spec.tuning is not None
    args = next((r.args for r in spec.tuning.runs if r.optimizer == opt and r.model_size == size), [])
    if "weight_decay" in recipe or any(a == "--weight_decay" or a.startswith("--weight_decay=") for a in args):
        return False, (f"{opt}/{size}: weight decay not tuned: the sweep or its base recipe sets weight_decay, "
                       "which would replace a tuned value; remove it to tune it")
    return True, ""


def plan_tuning(spec: SweepSpec, records: Sequence[Mapping[str, Any]]) -> TuningPlan:
    """Replay every optimizer x size's tuning from the initial grids and the finished runs (deterministic)."""
    from hf_optbench.config.parse import load_recipe

    assert spec.tune is not None and spec.tuning is not None
    tune, seeds = spec.tune, list(spec.tune.seeds)
    plan = TuningPlan([], index_records(records, seeds), tune.metric)
    recipe = load_recipe(spec.base)
    for opt, size in dict.fromkeys((r.optimizer, r.model_size) for r in spec.tuning.runs):
        def score(lr: float, wd: float | None = None, o: str = opt, s: str = size) -> float | None:
            return _point_score(plan.at(o, s, lr, wd), seeds, tune.metric)

        pair = PairPlan(opt, size, replay_axis("learning rate", tune.multipliers, score, tune.lr_step,
                                               tune.max_extensions))
        if pair.lr.done and pair.lr.best is not None:
            tunable, pair.wd_note = _wd_tunable(spec, opt, size, recipe)
            if tunable:
                best = pair.lr.best
                # weight decay's domain ends at 0: below the lowest multiplier the grid tries no decay at all
                pair.wd = replay_axis("weight decay", tune.wd_multipliers, lambda w, b=best, sc=score: sc(b, w),
                                      tune.wd_step, tune.max_extensions, floor=0.0)
                if not pair.wd.extensions and pair.wd.pending:
                    pair.wd.note = (f"tuning weight decay at the tuned learning rate x{best:g}: "
                                    f"{grid_text(pair.wd.grid)} of the cited {cited_weight_decay(opt, size):g}")
        plan.pairs.append(pair)
    return plan


def _point_runs(spec: SweepSpec, opt: str, size: str, lr: float, wd: float | None) -> list[RunSpec]:
    """The tuning runs of one point, one per tuning seed, made as the initial grid's are (``_expand``)."""
    assert spec.tuning is not None and spec.tune is not None
    scratch = dataclasses.replace(spec.tuning, runs=[])
    _expand(scratch, optimizers=[opt], sizes=[size], seeds=list(spec.tune.seeds), mults=[lr], phase="tune")
    if wd is None:
        return scratch.runs
    runs = []
    for run in scratch.runs:
        rid = run_id_for(opt, size, run.seed, run.lr_multiplier, wd_multiplier=wd)
        args = [rid if i and run.args[i - 1] == "--run_name" else a for i, a in enumerate(run.args)]
        new = dataclasses.replace(run, run_id=rid, args=args + ["--weight_decay", f"{weight_decay_at(opt, size, wd):g}"])
        new.env = tracker_env(spec.tuning, new)
        runs.append(new)
    return runs


def extend_tuning(spec: SweepSpec, say: Callable[[str], None]) -> list[RunSpec]:
    """Add to ``spec.tuning.runs`` every run the plan needs that it does not hold yet (extensions beyond an edge,
    the weight-decay grid, and on a restart the points an earlier sweep added), each resolved like the initial grid
    (validated when the launcher validates); say each decision. Returns the runs added (none: the tuning is done)."""
    from hf_optbench.study.records import load_runs

    assert spec.tuning is not None
    records = load_runs(spec.tuning.output_dir) if spec.tuning.output_dir.is_dir() else []
    plan = plan_tuning(spec, records)
    known = {r.run_id for r in spec.tuning.runs}
    added: list[RunSpec] = []
    for pair in plan.pairs:
        new = [run for lr, wd in pair.points() for run in _point_runs(spec, pair.optimizer, pair.size, lr, wd)
               if run.run_id not in known]
        if new and pair.points(pending=True):
            for axis in (pair.lr, pair.wd):
                if axis is not None and axis.pending and axis.note:
                    say(f"{pair.optimizer}/{pair.size}: {axis.note}")
        added += new
    if added:
        scratch = dataclasses.replace(spec.tuning, runs=added)
        (validate_runs if spec.tuning.launcher.get("validate", True) else resolve_grid)(scratch)
        spec.tuning.runs.extend(added)
    return added
