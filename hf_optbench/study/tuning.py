"""Tuning for a fair comparison, the rule: which hyperparameters a sweep's ``tune:`` phase tunes, on which grid, how
a choice is made and when it is settled, replayed from the runs that have finished.

Why: comparing optimizers at hand-picked values measures the pick, not the optimizer (Schmidt et al. 2021,
"Descending through a Crowded Valley"; Kaddour et al. 2023, "No Train No Gain"). The rule closes three ways the
tuning itself can decide the verdict: Muon's embeddings, head, gains and biases trained at Muon's own (8x AdamW's)
rate, which AdamW was never allowed; the baseline's ladder rungs reusing the rate tuned for the compared budget; and
neighbouring rates differing by less than the seed-to-seed noise, so that one tuning seed flips the choice.

The ``tune:`` section (:class:`TuneSpec`, :func:`parse_tune`) is documented with the sweep file's other keys
(:mod:`hf_optbench.study.sweep`).

The rule, per optimizer x size, one hyperparameter (an *axis*) at a time, the others at their current best
(coordinate-wise, as Marin's phase I: arXiv:2509.02046, marin-community/marin experiments/optimizer_sweep):

1. **learning rate** (every optimizer); then **weight decay** for optimizers whose spec sets ``tune_weight_decay``
   (their cited value is not AdamW's: Lion, 8-bit Lion, Sophia, SOAP), at the tuned rate; then the **non-matrix
   group's rate** (``nonmatrix_lr_ratio``: embeddings, head, LayerNorm gains, biases) for every family that takes
   it (AdamW and Muon: the baseline gets the freedom Muon's auxiliary AdamW has), at the tuned rate and decay;
2. then every **ladder rung** of the baseline (its runs at other budgets, ``ladder:``) tunes its own learning rate,
   starting from the compared budget's optimum x1/2, x1, x2 (:func:`rung_grid`), at the tuned decay and ratio;
3. on each axis, each point's score is its mean ``final_tuning_loss`` over the tuning seeds (a split held out from
   training and from the reported eval split), inf when a seed diverged or failed; the best is the lowest, ties to
   the point closest to x1. A best strictly inside the grid is bracketed; otherwise one step is added beyond the
   edge it sits on (x2 for rates, x3 for weight decay; below the lowest point when every point diverged; weight
   decay's domain ends at 0, which is tried next and brackets by the domain), at most ``max_extensions`` times;
4. **noise**: the best point's *margin* over a neighbour is how much worse that neighbour is (over the seeds both
   ran). With one tuning seed the seed-to-seed noise is unknown, so the learning-rate axis always runs its best
   point and its nearer neighbour at the ``confirm_seeds`` too and measures it (the pooled seed-to-seed sd of the
   final tuning loss); then, as on every later axis of the pair (which reuse that noise), each neighbour whose
   margin is within the noise is confirmed as well. Confirmed points are scored over all their seeds, the choice
   re-made among them (its new close neighbours confirmed in turn), and the tuned file records the margin, the
   noise and the seeds beside each choice (``within_noise``: the best still wins by less than the noise).

Restart: every decision is replayed from the initial grids and the finished runs (:func:`plan_tuning`), so a sweep
started again after a kill adds exactly the runs it would have added. The sweep side (the runs, the tuned file, the
ladder's extension and the attribution runs) is :mod:`hf_optbench.study.tuning_phase`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import FINAL_STATUSES, parse_run_id
from hf_optbench.study.sweep_values import seed_list

TUNE_KEYS = {"lr_multipliers", "lr_grid", "wd_multipliers", "nonmatrix_multipliers", "max_extensions", "seed",
             "confirm_seeds", "confirm_rungs", "second_draw"}  # second_draw: study.second_draw
# An extension adds one factor-2 step of the learning rate beyond the edge (the spacing of Marin's phase-I
# learning-rate grids, marin-community/marin experiments/optimizer_sweep, e.g. 8e-3, 1.6e-2, 3.2e-2).
LR_STEP = 2.0
# Weight decay moves in factor-3 steps: Chen et al. 2023 (arXiv:2302.06675, Sec. 5) give Lion a decoupled weight
# decay 3-10x AdamW's; the cited Lion value is already AdamW's x 3 (optim/lion.py), so x1/3, x1, x3 spans AdamW's
# own value to 9x it, the paper's band with a point on each side of it.
WD_STEP = 3.0
WD_MULTIPLIERS = (1 / 3, 1.0, 3.0)
# The non-matrix group's rate x learning_rate in factor-2 steps around 1 (one rate for all, the citation): Marin
# tunes Muon's AdamW part at 0.1-0.3x its matrix rate (muon_to_adam_lr, PhaseI); Muon's tuned rate here is 4-8x
# AdamW's (docs/notes/study_measurements.md), so its optimum ratio lies near 1/8 - 1/4, which the grid reaches in one
# or two extensions.
NONMATRIX_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0)
# A rung's grid: the compared budget's optimum x1/2, x1, x2, extended in factor-2 steps until bracketed. Centred on
# the x1 optimum, not on a guess: the optimal rate falls with a long token horizon (Bjorck et al. 2024,
# arXiv:2409.19913), but at these horizons it need not (docs/notes/study_measurements.md), so a grid shifted by a
# rule would only cost extensions.
RUNG_MULTIPLIERS = (0.5, 1.0, 2.0)


def rung_grid(best: float, budget_multiple: float) -> list[float]:
    """The initial learning-rate grid of the rung at ``budget_multiple`` x the budget (see RUNG_MULTIPLIERS)."""
    del budget_multiple  # every rung starts around the same optimum; its own extensions find its own
    return [best * m for m in RUNG_MULTIPLIERS]


# Three factor-2 steps reach 8x beyond the initial grid's edge, more than the 4x by which the demo's 3-point grid
# missed (docs/notes/study_measurements.md), for at most 3 more runs per tuning seed, optimizer x size and axis.
MAX_EXTENSIONS = 3
# Two more seeds where a choice is within the noise: with the tuning seed, 3 per contender, 2 degrees of freedom
# each for the pooled seed-to-seed sd (6 over a best and its two neighbours). Kept apart from the usual comparison
# seeds (1-5): a tuning run is never a comparison run.
CONFIRM_SEEDS = (1000, 1001)
TUNING_METRIC = "final_tuning_loss"  # summary.json: loss on the held-out tuning split (DataArguments.tuning_blocks)
LR, WD, NM, RUNG = "learning rate", "weight decay", "non-matrix lr ratio", "learning rate at budget x"


@dataclass
class TuneSpec:
    """The ``tune:`` section (see the module doc)."""

    multipliers: list[float]
    seeds: list[int]
    metric: str = TUNING_METRIC
    max_extensions: int = MAX_EXTENSIONS
    wd_multipliers: list[float] = field(default_factory=lambda: list(WD_MULTIPLIERS))
    lr_step: float = LR_STEP
    wd_step: float = WD_STEP
    nonmatrix_multipliers: list[float] = field(default_factory=lambda: list(NONMATRIX_MULTIPLIERS))
    confirm_seeds: list[int] = field(default_factory=lambda: list(CONFIRM_SEEDS))
    confirm_rungs: bool = True


def _numbers(value: Any, where: str, example: str) -> list[float]:
    values = value if isinstance(value, list) else [value]
    for m in values:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or not m > 0:
            raise OptBenchError(f"{where} must be positive numbers, got {m!r}. E.g. {example}.")
    if len({float(m) for m in values}) != len(values):
        raise OptBenchError(f"{where} lists a value twice: {values}. Remove the duplicate.")
    return sorted(float(m) for m in values)


def _around_one(grid: list[float], where: str, example: str) -> list[float]:
    """A grid must hold x1 (the cited value: the tuned one is then never worse on the tuning split) and at least
    3 points."""
    if len(grid) < 3 or 1.0 not in grid:
        raise OptBenchError(f"{where} {grid} is not a grid around the cited default: give at least 3 multipliers, "
                            f"1 (the cited default) among them, e.g. {example}.")
    return grid


def _factor2(value: Any) -> list[float]:
    """``lr_grid: {low, high}``: the powers of 2 from low to high."""
    if not isinstance(value, dict) or set(value) != {"low", "high"}:
        raise OptBenchError(f"tune.lr_grid must be a mapping {{low: ..., high: ...}} (factor-2 steps between them), "
                            f"got {value!r}. E.g. lr_grid: {{low: 0.25, high: 4}}.")
    low, high = (_numbers(value[k], f"tune.lr_grid.{k}", "0.25")[0] for k in ("low", "high"))
    exps = [math.log2(low), math.log2(high)]
    if any(abs(e - round(e)) > 1e-9 for e in exps) or not low <= 1.0 <= high:
        raise OptBenchError(f"tune.lr_grid {{low: {low:g}, high: {high:g}}} must be powers of 2 with low <= 1 <= "
                            "high (the cited default on the grid), e.g. {low: 0.25, high: 4}.")
    return [2.0 ** k for k in range(round(exps[0]), round(exps[1]) + 1)]


def parse_tune(tune: dict[str, Any], seeds: list[int], metric: str = TUNING_METRIC) -> TuneSpec:
    """The checked ``tune:`` mapping (its keys already checked against :data:`TUNE_KEYS`) as a TuneSpec."""
    if ("lr_multipliers" in tune) == ("lr_grid" in tune):
        raise OptBenchError("tune needs lr_multipliers or lr_grid (one of them): the grid around each cited "
                            "default, e.g. lr_multipliers: [0.5, 1, 2] or lr_grid: {low: 0.25, high: 4}.")
    if "lr_grid" in tune:
        grid = _factor2(tune["lr_grid"])
    else:
        grid = _numbers(tune["lr_multipliers"], "tune.lr_multipliers", "[0.25, 0.5, 1, 2, 4]")
    grid = _around_one(grid, "tune.lr_grid" if "lr_grid" in tune else "tune.lr_multipliers", "[0.5, 1, 2] or [1, 2, 4]")
    wd = _around_one(_numbers(tune.get("wd_multipliers", list(WD_MULTIPLIERS)), "tune.wd_multipliers",
                              "[0.333333, 1, 3]"), "tune.wd_multipliers", "[0.333333, 1, 3]")
    nm_raw = tune.get("nonmatrix_multipliers", list(NONMATRIX_MULTIPLIERS))
    nm = [] if nm_raw in ([], False, None) else _around_one(
        _numbers(nm_raw, "tune.nonmatrix_multipliers", "[0.25, 0.5, 1, 2]"), "tune.nonmatrix_multipliers",
        "[0.25, 0.5, 1, 2] (or [] to keep one rate for every group)")
    cap = tune.get("max_extensions", MAX_EXTENSIONS)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise OptBenchError(f"tune.max_extensions must be a whole number >= 0 (0: never extend), got {cap!r}.")
    confirm = seed_list(list(tune.get("confirm_seeds", list(CONFIRM_SEEDS)) or []), "tune.confirm_seeds")
    if set(confirm) & set(seeds) or len(set(confirm)) != len(confirm):
        raise OptBenchError(f"tune.confirm_seeds {confirm} must be distinct and differ from tune.seed {seeds}: they "
                            "are the extra seeds a close choice is decided with. E.g. confirm_seeds: [1000, 1001].")
    rungs = tune.get("confirm_rungs", True)
    if not isinstance(rungs, bool):
        raise OptBenchError(f"tune.confirm_rungs must be true or false, got {rungs!r}.")
    return TuneSpec(multipliers=grid, seeds=seeds, metric=metric, max_extensions=cap, wd_multipliers=wd,
                    nonmatrix_multipliers=nm, confirm_seeds=confirm, confirm_rungs=rungs)


# ----------------------------------------------------------------------------------------------- one axis
def canon(m: float) -> float:
    """A multiplier as a run id spells it (``:g``, 6 significant digits), so that a point read back from an id and
    one the tuner computes compare equal (x1/3 is 0.333333 in both)."""
    return float(f"{float(m):g}")


def metric_value(r: Mapping[str, Any], metric: str) -> Any:
    """``metric`` of a run record: a column of its own, else its summary.json (records.load_runs keeps it whole)."""
    value = r.get(metric)
    return value if value is not None else (r.get("_summary") or {}).get(metric)


def run_loss(r: Mapping[str, Any], metric: str) -> float:
    """One finished tuning run's loss: inf when it did not complete or its value is not finite (a value that
    diverges for one seed is not a safe default); a completed run without the metric is an error."""
    if r.get("status") != "completed":
        return math.inf
    loss = metric_value(r, metric)
    if loss is None:
        raise OptBenchError(
            f"tuning run '{r.get('run_id') or r.get('optimizer')}' has no {metric} in its summary.json: it ran "
            f"without a held-out tuning split. Set tuning_blocks (e.g. 16) in the tuning sweep's overrides and "
            "run it again; learning rates are never selected on the reported eval split.")
    return float(loss) if math.isfinite(float(loss)) else math.inf


def choose(scores: Mapping[float, float]) -> float | None:
    """The best multiplier: the lowest score, ties to the one closest to x1; None when none has a finite score."""
    if not scores:
        return None
    best = min(sorted(scores), key=lambda m: (scores[m], abs(math.log(m)) if m > 0 else math.inf))
    return best if math.isfinite(scores[best]) else None


def is_bracketed(grid: Sequence[float], best: float | None, floor: float | None = None) -> bool:
    """The bracketing rule (the module doc): the best point lies strictly inside its grid, or at ``floor``, the
    edge of the hyperparameter's domain (0 for weight decay), with a point above it."""
    return best is not None and (min(grid) < best < max(grid) or (best == floor and max(grid) > best))


def grid_text(grid: Sequence[float]) -> str:
    return "[" + ", ".join(f"x{m:g}" for m in grid) + "]"


def _mean(losses: Mapping[int, float], seeds: Sequence[int]) -> float:
    return statistics.fmean(losses[s] for s in seeds) if seeds else math.inf


def pooled_sd(samples: Sequence[Sequence[float]]) -> float | None:
    """The pooled within-point standard deviation of finite losses (points with two or more seeds); None without."""
    ss, df = 0.0, 0
    for xs in samples:
        xs = [x for x in xs if math.isfinite(x)]
        if len(xs) >= 2:
            m = statistics.fmean(xs)
            ss, df = ss + sum((x - m) ** 2 for x in xs), df + len(xs) - 1
    return math.sqrt(ss / df) if df else None


@dataclass
class Axis:
    """One hyperparameter of one optimizer x size, replayed from the finished runs: the multipliers run so far
    (initial grid + extensions), their scores (over the seeds each was decided on), the best, whether it is
    bracketed, its margin and the noise it was judged against, and the (point, seeds) still to run."""

    name: str
    grid: list[float]
    scores: dict[float, float] = field(default_factory=dict)
    extensions: list[float] = field(default_factory=list)
    pending: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    required: dict[float, tuple[int, ...]] = field(default_factory=dict)  # the seeds each point runs at
    confirmed: list[float] = field(default_factory=list)  # points run at the confirm seeds too
    best: float | None = None
    bracketed: bool = False
    margin: float | None = None  # loss gap from the best to its nearest neighbour (inf: the neighbours diverged)
    noise: float | None = None  # seed-to-seed sd of the final tuning loss the margin was judged against
    noise_measured: bool = False  # this axis measured the noise itself (else: the pair's learning-rate axis did)
    seeds: tuple[int, ...] = ()  # the seeds the choice was made on
    note: str = ""  # the last decision, in words

    @property
    def done(self) -> bool:
        return not self.pending

    @property
    def within_noise(self) -> bool | None:
        if self.margin is None or self.noise is None:
            return None
        return self.margin <= self.noise


@dataclass
class Replay:
    """The inputs of :func:`replay_axis` (see its doc)."""

    losses: Callable[[float], Mapping[int, float]]
    step: float
    cap: int
    seeds: tuple[int, ...]
    confirm: tuple[int, ...] = ()
    noise: float | None = None
    floor: float | None = None


def _neighbours(grid: Sequence[float], m: float) -> list[float]:
    i = list(grid).index(m)
    return [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid)]


def _extend(axis: Axis, best: float | None, r: Replay, what: str) -> bool:
    """One step beyond the edge holding ``best`` (the module doc's rule 3); False at the cap."""
    low, high = axis.grid[0], axis.grid[-1]
    upper = best is not None and best == high
    where = (f"best {what} x{best:g} is at the {'upper' if upper else 'lower'} edge of {grid_text(axis.grid)}"
             if best is not None else f"every {what} of {grid_text(axis.grid)} diverged or failed")
    if len(axis.extensions) >= r.cap:
        axis.note = f"{where} after {len(axis.extensions)} extension(s) (tune.max_extensions {r.cap}): not bracketed"
        return False
    new = canon(high * r.step if upper else r.floor if r.floor is not None and low > r.floor else low / r.step)
    axis.note = f"{where}: adding x{new:g} (extension {len(axis.extensions) + 1} of at most {r.cap})"
    axis.extensions.append(new)
    axis.grid = sorted(axis.grid + [new])
    return True


def replay_axis(name: str, initial: Sequence[float], r: Replay) -> Axis:
    """The rule of the module doc, replayed on one axis: ``r.losses(m)`` is {seed: loss} of the finished runs at
    multiplier ``m``. Bracket on the tuning seeds first; then, with confirm seeds, run the best and each neighbour
    whose margin is within the noise at them (the nearer neighbour while the noise is unmeasured), re-choosing among
    the confirmed points until no unconfirmed neighbour of the best is within the noise."""
    axis = Axis(name, sorted({canon(m) for m in initial}))
    full: set[float] = set()
    all_seeds = tuple(r.seeds) + tuple(r.confirm)
    while True:
        need = {m: all_seeds if m in full else tuple(r.seeds) for m in axis.grid}
        axis.required = need
        axis.pending = [(m, tuple(s for s in need[m] if s not in r.losses(m))) for m in axis.grid]
        axis.pending = [(m, s) for m, s in axis.pending if s]
        if axis.pending:
            return axis
        base = {m: _mean(r.losses(m), r.seeds) for m in axis.grid}
        if not full:
            best = choose(base)
            if not is_bracketed(axis.grid, best, r.floor) and _extend(axis, best, r, name):
                continue
            noise = r.noise if r.noise is not None else pooled_sd(
                [[r.losses(m)[s] for s in r.seeds] for m in axis.grid])
            close = _close(r, axis.grid, best, noise, full)
            if r.confirm and close:
                full = {best, *close}
                axis.note = (f"{name} x{best:g}'s margin over {grid_text(sorted(close))} is within the noise "
                             f"{'(not measured yet)' if noise is None else f'{noise:.3g}'}: confirming "
                             f"{grid_text(sorted(full))} at seeds {list(r.confirm)}")
                continue
            return _settle(axis, r, base, best, noise, r.seeds, measured=r.noise is None and noise is not None)
        scores = {m: _mean(r.losses(m), all_seeds) for m in full}
        best = choose(scores)
        noise = pooled_sd([[r.losses(m)[s] for s in all_seeds] for m in sorted(full)])
        grow = _close(r, axis.grid, best, noise if noise is not None else r.noise, full)
        if grow:
            full |= grow
            continue
        if best is not None and not is_bracketed(axis.grid, best, r.floor) and _extend(axis, best, r, name):
            full.add(axis.extensions[-1])
            continue
        axis.confirmed = sorted(full)
        return _settle(axis, r, {**base, **scores}, best, noise if noise is not None else r.noise, all_seeds,
                       measured=noise is not None)


def _pair_margin(r: Replay, a: float, b: float) -> float:
    """How much worse ``b`` is than ``a``, over the seeds both ran (paired: a seed's own luck cancels)."""
    la, lb = r.losses(a), r.losses(b)
    shared = [s for s in la if s in lb]
    return _mean(lb, shared) - _mean(la, shared) if shared else math.inf


def _close(r: Replay, grid: Sequence[float], best: float | None, noise: float | None,
           confirmed: set[float]) -> set[float]:
    """The best's unconfirmed neighbours that more seeds must decide: those whose margin is within the noise, or,
    while the noise is unmeasured, the nearer one (a noise of 0, a run with no seed-to-seed variation, leaves
    nothing for more seeds to decide)."""
    if best is None or not r.confirm:
        return set()
    margins = {n: _pair_margin(r, best, n) for n in _neighbours(grid, best) if n not in confirmed}
    if not margins:
        return set()
    if noise is None:
        nearest = min(margins, key=lambda n: margins[n])
        return {nearest} if math.isfinite(margins[nearest]) else set()
    return {n for n, m in margins.items() if 0 < noise and m <= noise}


def _settle(axis: Axis, r: Replay, scores: Mapping[float, float], best: float | None, noise: float | None,
            seeds: Sequence[int], measured: bool) -> Axis:
    """The axis's choice and what it was decided on: its margin (paired, over the seeds the best and each neighbour
    share; inf when its neighbours diverged or it has none), the noise, the seeds."""
    axis.scores, axis.best, axis.seeds = dict(scores), best, tuple(seeds)
    axis.bracketed = is_bracketed(axis.grid, best, r.floor)
    axis.margin = min((_pair_margin(r, best, n) for n in _neighbours(axis.grid, best)), default=math.inf) \
        if best is not None else None
    axis.noise, axis.noise_measured = noise, measured
    if axis.bracketed and best == r.floor:
        axis.note = f"best {axis.name} is x{r.floor:g}, the edge of its domain: bracketed by the domain"
    elif best is None:
        axis.note = f"every {axis.name} of {grid_text(axis.grid)} diverged or failed"
    return axis


# ------------------------------------------------------------------------------------- one optimizer x size
@dataclass(frozen=True)
class Coords:
    """One tuning point: learning-rate multiplier (of the cited rate), weight-decay multiplier (None: the cited
    value), the non-matrix group's ratio (None: 1) and the budget multiple (None: the compared budget)."""

    lr: float
    wd: float | None = None
    nm: float | None = None
    dx: float | None = None

    @staticmethod
    def of(lr: float, wd: float | None = None, nm: float | None = None, dx: float | None = None) -> Coords:
        """The canonical point: a multiplier of 1 is the cited value (None), so every axis's x1 is one run."""
        def c(v: float | None) -> float | None:
            return None if v is None or canon(v) == 1.0 else canon(v)

        return Coords(canon(lr), c(wd), c(nm), c(dx))


@dataclass(frozen=True)
class PairSetup:
    """What one optimizer x size tunes beyond its learning rate: weight decay (its spec's ``tune_weight_decay``,
    unless the sweep sets it: ``wd_note`` says so), the non-matrix group's ratio (families that take it) and the
    ladder's rungs (the baseline's budget multiples other than 1)."""

    optimizer: str
    size: str
    tune_wd: bool = False
    tune_nm: bool = False
    rungs: tuple[float, ...] = ()
    wd_note: str = ""
    nm_note: str = ""
    tpp: float | None = None  # the data ratio (tokens per parameter) of a sweep with several: tuned on its own

    @property
    def name(self) -> str:
        """"adamw/tiny", or "adamw/tiny at 0.5 tokens/param" in a sweep with several ratios."""
        return f"{self.optimizer}/{self.size}" + ("" if self.tpp is None else f" at {self.tpp:g} tokens/param")


@dataclass
class PairPlan:
    """The tuning of one optimizer x size: its axes in the order they run."""

    setup: PairSetup
    lr: Axis
    wd: Axis | None = None
    nm: Axis | None = None
    rungs: dict[float, Axis] = field(default_factory=dict)

    @property
    def optimizer(self) -> str:
        return self.setup.optimizer

    @property
    def size(self) -> str:
        return self.setup.size

    @property
    def tpp(self) -> float | None:
        return self.setup.tpp

    @property
    def name(self) -> str:
        return self.setup.name

    def best(self) -> Coords | None:
        """The x1 budget's tuned point so far (the learning rate, then weight decay and ratio where tuned)."""
        if self.lr.best is None:
            return None
        wd = self.wd.best if self.wd is not None else None
        nm = self.nm.best if self.nm is not None else None
        return Coords.of(self.lr.best, wd, nm)

    def axes(self) -> list[tuple[Axis, Callable[[float], Coords]]]:
        """Every axis started so far, with the point each of its multipliers stands for."""
        lr_best = self.lr.best or 1.0
        wd_best = self.wd.best if self.wd is not None else None
        out: list[tuple[Axis, Callable[[float], Coords]]] = [(self.lr, lambda m: Coords.of(m))]
        if self.wd is not None:
            out.append((self.wd, lambda w: Coords.of(lr_best, w)))
        if self.nm is not None:
            out.append((self.nm, lambda n: Coords.of(lr_best, wd_best, n)))
        best = self.best()
        for dx, axis in self.rungs.items():
            out.append((axis, lambda m, d=dx: Coords.of(m, best.wd if best else None, best.nm if best else None, d)))
        return out

    def points(self, pending: bool = False) -> list[tuple[Coords, tuple[int, ...]]]:
        """(point, seeds) of every point of every axis (only those with seeds still to run)."""
        out: dict[Coords, set[int]] = {}
        for axis, at in self.axes():
            for m, seeds in (axis.pending if pending else axis.required.items()):
                out.setdefault(at(m), set()).update(seeds)
        return [(c, tuple(sorted(s))) for c, s in out.items()]

    @property
    def done(self) -> bool:
        x1_done = self.lr.done and (self.wd is None or self.wd.done) and (self.nm is None or self.nm.done)
        return x1_done and len(self.rungs) == len(self.setup.rungs) and all(a.done for a in self.rungs.values())

    @property
    def bracketed(self) -> bool:
        return all(axis.bracketed for axis, _ in self.axes())


Runs = dict[tuple[str, str, float | None, Coords], dict[int, dict[str, Any]]]


@dataclass
class TuningPlan:
    """Every optimizer x size (x data ratio)'s tuning, and the finished tuning runs by point and seed."""

    pairs: list[PairPlan]
    runs: Runs
    metric: str

    def at(self, opt: str, size: str, point: Coords, tpp: float | None = None) -> list[dict[str, Any]]:
        return list(self.runs.get((opt, size, tpp, point), {}).values())


def index_records(records: Sequence[Mapping[str, Any]]) -> Runs:
    """The finished tuning runs by (optimizer, size, data ratio, point) and seed; the point and the ratio are read
    from the run id (as the sweep named it)."""
    out: Runs = {}
    for r in records:
        if r.get("status") not in FINAL_STATUSES:
            continue
        p = parse_run_id(str(r.get("run_id") or ""))
        lr = r.get("lr_multiplier") if r.get("lr_multiplier") not in (None, "") else p.get("lr_multiplier")
        seed = r.get("seed") if r.get("seed") is not None else p.get("seed")
        if lr is None or seed is None:
            continue
        wd = r.get("wd_multiplier") if r.get("wd_multiplier") is not None else p.get("wd_multiplier")
        point = Coords.of(float(lr), wd, p.get("nonmatrix_multiplier"), p.get("budget_multiple"))
        key = (str(p.get("optimizer", r.get("optimizer"))), str(p.get("model_size", r.get("model_size"))),
               p.get("budget_tpp"), point)
        out.setdefault(key, {})[int(seed)] = dict(r)
    return out


def plan_tuning(tune: TuneSpec, setups: Sequence[PairSetup], records: Sequence[Mapping[str, Any]]) -> TuningPlan:
    """Replay every optimizer x size's tuning from the initial grids and the finished runs (deterministic)."""
    plan = TuningPlan([], index_records(records), tune.metric)
    plan.pairs = [_plan_pair(tune, setup, plan.runs) for setup in setups]
    return plan


def _plan_pair(tune: TuneSpec, setup: PairSetup, runs: Runs) -> PairPlan:
    """One optimizer x size's axes, in order, each started once the one before it is settled."""
    seeds, confirm, cap = tuple(tune.seeds), tuple(tune.confirm_seeds), tune.max_extensions
    o, s = setup.optimizer, setup.size

    def losses(at: Callable[[float], Coords]) -> Callable[[float], dict[int, float]]:
        return lambda m: {seed: run_loss(r, tune.metric) for seed, r in runs.get((o, s, setup.tpp, at(m)),
                                                                                   {}).items()}

    pair = PairPlan(setup, replay_axis(LR, tune.multipliers, Replay(
        losses(lambda m: Coords.of(m)), tune.lr_step, cap, seeds, confirm)))
    noise, lr_best = pair.lr.noise, pair.lr.best
    if not pair.lr.done or lr_best is None:
        return pair
    if setup.tune_wd:
        pair.wd = replay_axis(WD, tune.wd_multipliers, Replay(
            losses(lambda w: Coords.of(lr_best, w)), tune.wd_step, cap, seeds, confirm, noise, floor=0.0))
        if not pair.wd.done:
            return pair
    wd_best = pair.wd.best if pair.wd is not None else None
    if setup.tune_nm and tune.nonmatrix_multipliers:
        pair.nm = replay_axis(NM, tune.nonmatrix_multipliers, Replay(
            losses(lambda n: Coords.of(lr_best, wd_best, n)), LR_STEP, cap, seeds, confirm, noise))
        if not pair.nm.done:
            return pair
    best = pair.best()
    assert best is not None
    for dx in setup.rungs:
        pair.rungs[dx] = replay_axis(f"{RUNG}{dx:g}", rung_grid(lr_best, dx), Replay(
            losses(_rung_point(best, dx)), LR_STEP, cap, seeds, confirm if tune.confirm_rungs else (), noise))
    return pair


@dataclass(frozen=True)
class AxisOutline:
    """One axis :func:`_plan_pair` runs for a pair, known before any result (the sweep's ETA counts by it): its kind
    ("lr", "wd", "nm", "rung"), budget multiple, the new points of its initial grid (an axis's x1 is the point before
    it, run already), its numbers of tuning and confirm seeds, its level (each starts once the one before has
    settled; the rungs share one)."""

    kind: str
    dx: float | None
    points: int
    seeds: int
    confirm: int
    level: int


def outline(tune: TuneSpec, setup: PairSetup) -> list[AxisOutline]:
    """The axes of :func:`_plan_pair` for ``setup``, in its order, before any result."""
    seeds, confirm = len(tune.seeds), len(tune.confirm_seeds)
    out = [AxisOutline("lr", None, len(tune.multipliers), seeds, confirm, 1)]
    for kind, on, grid in (("wd", setup.tune_wd, tune.wd_multipliers), ("nm", setup.tune_nm, tune.nonmatrix_multipliers)):
        if on and grid:
            out.append(AxisOutline(kind, None, sum(canon(m) != 1.0 for m in grid), seeds, confirm, len(out) + 1))
    level = len(out) + 1
    out += [AxisOutline("rung", dx, len(rung_grid(1.0, dx)), seeds, confirm if tune.confirm_rungs else 0, level)
            for dx in setup.rungs]
    return out


def _rung_point(best: Coords, dx: float) -> Callable[[float], Coords]:
    """A rung's point at learning-rate multiplier m: the compared budget's tuned decay and ratio, budget ``dx``."""
    return lambda m: Coords.of(m, best.wd, best.nm, dx)


def weight_decay_at(opt: str, size: str, multiplier: float) -> float:
    """The weight decay a run at ``multiplier`` x the cited value gets, to three significant digits as the cited
    defaults are (optim.spec.round3: x1/3 of 0.3 is 0.1, not 0.0999999 from the id's 0.333333)."""
    from hf_optbench.optim.registry import optimizer_defaults
    from hf_optbench.optim.spec import round3

    return round3(float(optimizer_defaults(opt, size)["weight_decay"]) * multiplier)
