"""A sweep's data budget per model size, stated as tokens per parameter, and the baseline's budget ladder.

Why tokens per parameter: a sweep that trains every size for the same number of steps lets the data per parameter
fall as the model grows (25x from ``tiny`` to ``midi`` at a fixed step count), so "does the advantage survive as
models grow" becomes "as the data per parameter shrinks". Scaling studies hold it fixed: Chinchilla (Hoffmann et al.
2022) and Marin (marin-community/marin, experiments/optimizer_sweep: 1x = 20 tokens per non-embedding parameter)
state budgets as multiples of it. The parameter count is the non-embedding one (Kaplan et al. 2020), as those
studies use: the embedding's size follows the tokenizer, not the model.

Sweep file::

    budget:
      tokens_per_param: 0.5        # max_steps per size = round(0.5 x non-embedding parameters / tokens per step)
      # or a list, a second axis: the whole protocol (tuning, ladder, comparison) at each ratio
      # tokens_per_param: [0.15, 0.5, 2]
      # exclude: [{model_size: mini, tokens_per_param: 2}]   # cells of the size x ratio grid left out
    ladder:
      multiples: [0.5, 1, 2, 4]    # the baseline also runs at these multiples of the budget, each a full schedule
      optimizer: adamw             # the baseline (default adamw; must be in the matrix)
      max_multiple: 32             # the cap of the ladder's automatic extension (default 8 x the largest multiple)

The ladder is extended, not extrapolated: when a compared run ends below the curve of its seed's ladder at the top
rung (its speedup would only be a bound, "> 4x"), every seed of that size gets a rung at twice the top budget
(tuned like the others), until no compared run beats the top or the next rung would pass ``max_multiple``
(:func:`ladder_multiples`, replayed from the finished runs). A speedup still beyond the cap stays a bound.

Data per parameter as an axis: with a list of ratios every (size, ratio) cell is a sweep of its own
inside the sweep: its own tuning (every group's rate, every rung's), its own ladder and comparison, its own tuned
file. Run ids carry the ratio (``adamw__tiny__s1__tpp0.5``) only when there are several, so the ids, and the
directories, of a single-ratio sweep stay what they were. Why the cells are not shared: a rung of one ratio can
have the step count of another ratio's compared budget (tiny at 1 token/param x2 is tiny at 2 tokens/param x1),
but each is tuned around its own ratio's optimum, so the two runs differ in their tuned rates; and each ratio's
speedups are then read off a ladder of their own, as a single-ratio sweep's are. ``exclude`` leaves out cells
(the costliest corner of a grid, say), each named by size and ratio; every size keeps at least one ratio.

Without ``budget``, the steps of the recipe (or ``overrides.max_steps``) are the budget, and a ladder multiplies
them. Tokens per step = per_device_train_batch_size x gradient_accumulation_steps x processes x block_size, read
from each run's parsed arguments (processes: the launcher's accelerate config ``num_processes``, else 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import BASELINE, FINAL_STATUSES

if TYPE_CHECKING:
    from hf_optbench.config.parse import RunConfig

BUDGET_KEYS = {"tokens_per_param", "exclude"}
EXCLUDE_KEYS = {"model_size", "tokens_per_param"}
LADDER_KEYS = {"multiples", "optimizer", "max_multiple"}
# Without max_multiple: three doublings beyond the file's top rung (4x -> 32x), the reach Muon's speedup on real text
# needed (it beat a 4x ladder in every seed; two seeds were still beyond it at 32x).
DEFAULT_CAP_FACTOR = 8.0
# Marin's ladder (experiments/optimizer_sweep) spans 1-8x Chinchilla; four points (0.5-4x) are the fewest that
# leave the three-parameter fit of hf_optbench.measure.speedup a degree of freedom to be judged by.
MIN_LADDER_POINTS = 3


@dataclass(frozen=True)
class Budget:
    """``ratios``: training tokens per non-embedding parameter, each the same at every size (one, or several: the
    data axis); ``exclude``: the (size, ratio) cells left out."""

    ratios: tuple[float, ...]
    exclude: frozenset[tuple[str, float]] = frozenset()

    @property
    def keys(self) -> tuple[float | None, ...]:
        """The ratios runs are told apart by: ``(None,)`` for one ratio (run ids without a ratio, as before)."""
        return tuple(self.ratios) if len(self.ratios) > 1 else (None,)

    def ratio(self, key: float | None) -> float:
        """The ratio of a key of :attr:`keys` (None: the one ratio)."""
        return self.ratios[0] if key is None else key

    def includes(self, size: str, key: float | None) -> bool:
        """Whether the cell (size, ratio) runs (not excluded)."""
        return key is None or (size, key) not in self.exclude


def ratio_keys(budget: Budget | None) -> tuple[float | None, ...]:
    """:attr:`Budget.keys`, and ``(None,)`` for a sweep without a budget."""
    return budget.keys if budget is not None else (None,)


@dataclass(frozen=True)
class Ladder:
    """The baseline's extra budgets: ``multiples`` of the sweep's budget (1 among them: the compared run)."""

    multiples: tuple[float, ...]
    optimizer: str = BASELINE
    max_multiple: float = 0.0  # the extension's cap (0: DEFAULT_CAP_FACTOR x the largest multiple)

    @property
    def cap(self) -> float:
        return self.max_multiple or DEFAULT_CAP_FACTOR * max(self.multiples)

    @property
    def extra(self) -> tuple[float, ...]:
        """The multiples other than 1 (the x1 run is the baseline's ordinary comparison run)."""
        return tuple(m for m in self.multiples if m != 1.0)


def _positive(value: Any, where: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise OptBenchError(f"{where} must be a positive number, got {value!r}. E.g. {example}.")
    return float(value)


def _keys(value: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OptBenchError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise OptBenchError(f"unknown key '{unknown[0]}' in {where}. Allowed: {', '.join(sorted(allowed))}.")
    return value


def parse_budget(raw: dict[str, Any], tables: Iterable[tuple[str, dict[str, Any]]],
                 sizes: Sequence[str] = ()) -> Budget | None:
    """The ``budget:`` section, checked (``sizes``: the matrix's, which ``exclude`` must name); nothing else in the
    file may set max_steps (it would silently win)."""
    if raw.get("budget") is None:
        return None
    section = _keys(raw["budget"], BUDGET_KEYS, "budget")
    if "tokens_per_param" not in section:
        raise OptBenchError("budget needs tokens_per_param: training tokens per non-embedding parameter, e.g. 20 "
                            "(Chinchilla), or 0.5 for a CPU sweep.")
    for where, table in tables:
        if "max_steps" in table:
            raise OptBenchError(f"'max_steps' in {where} conflicts with budget.tokens_per_param, which sets every "
                                "run's max_steps per size: remove one of them.")
    ratios = _ratios(section["tokens_per_param"])
    return Budget(ratios, _exclude(section.get("exclude"), ratios, sizes))


def _ratios(value: Any) -> tuple[float, ...]:
    """One ratio or a list of them: positive, finite, each once (to the 6 digits a run id shows), ascending."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise OptBenchError("budget.tokens_per_param is an empty list: give one ratio (e.g. 0.5) or several (e.g. "
                            "[0.15, 0.5, 2]).")
    ratios = [_positive(v, "budget.tokens_per_param", "20, 0.5 or [0.15, 0.5, 2]") for v in values]
    seen: dict[str, float] = {}
    for r in ratios:
        if f"{r:g}" in seen:
            raise OptBenchError(f"budget.tokens_per_param lists {r:g} twice ({values}; ids show 6 significant "
                                "digits): remove the duplicate.")
        seen[f"{r:g}"] = r
    return tuple(sorted(ratios))


def _exclude(value: Any, ratios: tuple[float, ...], sizes: Sequence[str]) -> frozenset[tuple[str, float]]:
    """``budget.exclude``: cells {model_size, tokens_per_param} of the grid, each a size of the matrix and a ratio of
    the list; every size keeps at least one ratio."""
    if value is None:
        return frozenset()
    example = "e.g. exclude: [{model_size: mini, tokens_per_param: 2}]"
    if not isinstance(value, list) or not value:
        raise OptBenchError(f"budget.exclude must be a non-empty list of cells {{model_size, tokens_per_param}}, "
                            f"{example}; got {value!r}.")
    if len(ratios) < 2:
        raise OptBenchError("budget.exclude leaves out cells of a size x ratio grid, but budget.tokens_per_param has "
                            "one ratio: remove the size from the matrix instead.")
    from hf_optbench.models import resolve_size

    by_name = {resolve_size(s): s for s in sizes}
    cells: set[tuple[str, float]] = set()
    for cell in value:
        cell = _keys(cell, EXCLUDE_KEYS, "budget.exclude")
        if set(cell) != EXCLUDE_KEYS:
            raise OptBenchError(f"budget.exclude cell {cell} needs model_size and tokens_per_param, {example}.")
        try:
            size = by_name.get(resolve_size(str(cell["model_size"])))
        except OptBenchError:
            size = None
        ratio = _positive(cell["tokens_per_param"], "budget.exclude tokens_per_param", "2")
        match = next((r for r in ratios if f"{r:g}" == f"{ratio:g}"), None)
        if size is None or match is None:
            raise OptBenchError(f"budget.exclude cell {cell} is not in the grid: model_size must be one of {list(sizes)} "
                                f"and tokens_per_param one of {[float(f'{r:g}') for r in ratios]}.")
        if (size, match) in cells:
            raise OptBenchError(f"budget.exclude lists {size} at {match:g} tokens/param twice: remove the duplicate.")
        cells.add((size, match))
    for size in sizes:
        if all((size, r) in cells for r in ratios):
            raise OptBenchError(f"budget.exclude leaves {size} no ratio: remove {size} from matrix.model_size instead.")
    return frozenset(cells)


def parse_ladder(raw: dict[str, Any], optimizers: list[str]) -> Ladder | None:
    """The ``ladder:`` section, checked: >= 3 distinct multiples with 1 among them, and the baseline in the matrix."""
    if raw.get("ladder") is None:
        return None
    section = _keys(raw["ladder"], LADDER_KEYS, "ladder")
    values = section.get("multiples")
    if not isinstance(values, list) or not values:
        raise OptBenchError("ladder needs multiples: the baseline's budgets as multiples of the sweep's budget, "
                            "e.g. [0.5, 1, 2, 4].")
    mults = sorted({_positive(v, "ladder.multiples", "[0.5, 1, 2, 4]") for v in values})
    if len(mults) < MIN_LADDER_POINTS or 1.0 not in mults:
        raise OptBenchError(f"ladder.multiples {mults} must hold 1 (the compared budget) and at least "
                            f"{MIN_LADDER_POINTS} distinct values, e.g. [0.5, 1, 2, 4].")
    baseline = str(section.get("optimizer", BASELINE))
    if baseline not in optimizers:
        raise OptBenchError(f"ladder.optimizer '{baseline}' is not in matrix.optimizer {optimizers}: the ladder is "
                            "the baseline's, so add it to the matrix (or name the baseline there).")
    cap = section.get("max_multiple")
    if cap is not None and _positive(cap, "ladder.max_multiple", "32") < max(mults):
        raise OptBenchError(f"ladder.max_multiple {cap} is below the ladder's largest multiple {max(mults):g}: it caps "
                            "the automatic extension beyond it, so give at least that (or as many doublings as the "
                            "extension may add, e.g. 32).")
    return Ladder(tuple(mults), baseline, float(cap or 0.0))


def world_size(launcher: dict[str, Any]) -> int:
    """Processes per run: the accelerate config's ``num_processes`` for an accelerate launcher (1 where it cannot be
    read), else 1. The one reader of that value: the sweep's slots use it too (study.sweep_state.plan_slots)."""
    if launcher.get("type") != "accelerate" or not launcher.get("accelerate_config"):
        return 1
    from hf_optbench.yaml_file import read_yaml_or_empty

    try:
        return max(1, int(read_yaml_or_empty(launcher["accelerate_config"]).get("num_processes") or 1))
    except (TypeError, ValueError):
        return 1


def tokens_per_step(cfg: RunConfig, processes: int) -> int:
    """Tokens one optimizer step consumes, from a parsed RunConfig."""
    from hf_optbench.models import tokens_per_step as tokens

    return tokens(cfg.training, cfg.data.block_size, processes)


Steps = dict[tuple[str, str, float | None], int]


def steps_table(budget: Budget | None, sizes: list[str], optimizers: list[str], processes: int,
                probe: Callable[[str, str], Any]) -> Steps:
    """{(size, optimizer, ratio key): max_steps at budget x1}: from tokens per parameter when ``budget`` is set (one
    entry per ratio of :attr:`Budget.keys` the cell runs at), else the run's own max_steps (key None).
    ``probe(optimizer, size)`` parses that point's arguments (a RunConfig)."""
    from hf_optbench.models import non_embedding_params

    table: Steps = {}
    for size in sizes:
        for opt in optimizers:
            cfg = probe(opt, size)
            if budget is None:
                table[(size, opt, None)] = int(cfg.training.max_steps)
                continue
            per_step = tokens_per_step(cfg, processes)
            for key in budget.keys:
                if budget.includes(size, key):
                    table[(size, opt, key)] = max(1, round(budget.ratio(key) * non_embedding_params(size) / per_step))
    return table


def ladder_steps(steps: int, multiple: float | None) -> int:
    """max_steps of a ladder run: its multiple of the budget's steps (at least 1)."""
    return steps if multiple is None else max(1, round(multiple * steps))


def budget_tokens(rec: Mapping[str, Any]) -> float | None:
    """A run's planned data budget in tokens (planned steps x tokens per step)."""
    summary = rec.get("_summary") or {}
    steps = summary.get("max_steps") or rec.get("max_steps")
    per_step = summary.get("tokens_per_step") or rec.get("tokens_per_step")
    return float(steps) * float(per_step) if steps and per_step else None


def ladder_points(records: Sequence[Mapping[str, Any]], baseline: str, size: str, seed: Any,
                  tpp: float | None = None) -> tuple[list[tuple[float, float]], float | None]:
    """(the ladder's (tokens, final eval loss) points, the baseline's own loss at the budget: its x1 run) of one size,
    ratio (``tpp``: the record's ``budget_tpp``, None in a single-ratio sweep) and seed, from the baseline's completed
    runs among ``records`` (its ladder and compared runs alike)."""
    points, reference = [], None
    for r in records:
        if r.get("optimizer") != baseline or r.get("model_size") != size or r.get("seed") != seed \
                or r.get("budget_tpp") != tpp \
                or r.get("status") != "completed" or r.get("final_eval_loss") is None \
                or r.get("lr_multiplier") is not None:
            continue
        tokens, loss = budget_tokens(r), float(r["final_eval_loss"])
        if tokens and math.isfinite(loss):
            points.append((tokens, loss))
            reference = loss if r.get("budget_multiple") in (None, 1.0) else reference
    return points, reference


def beats_top(records: Sequence[Mapping[str, Any]], baseline: str, size: str, top_tokens: float,
              tpp: float | None = None) -> list[str]:
    """The compared runs of ``size`` (at ratio ``tpp``) whose final eval loss lies below their seed's ladder curve
    at its top budget (``top_tokens``): their speedup would only be a bound."""
    from hf_optbench.measure.speedup import fit_ladder, speedup

    out = []
    for r in records:
        if r.get("model_size") != size or r.get("optimizer") == baseline or r.get("status") != "completed" \
                or r.get("final_eval_loss") is None or r.get("lr_multiplier") is not None \
                or r.get("budget_tpp") != tpp:
            continue
        pts, _ = ladder_points(records, baseline, size, r.get("seed"), tpp)
        pts = [(t, v) for t, v in pts if t <= top_tokens * (1 + 1e-6)]  # the ladder as it stood at this top
        fit = fit_ladder([t for t, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None
        # a curve that reaches this top (exp/log round-trips of the budgets leave it a hair under the top's tokens),
        # and a speedup off it censored above: the run beat the top rung
        if fit is not None and fit.tokens[-1] >= top_tokens * (1 - 1e-6) \
                and speedup(fit, float(r["final_eval_loss"]), fit.tokens[-1]).censored == "above":
            out.append(str(r.get("run_id")))
    return out


def ladder_multiples(ladder: Ladder, size: str, records: Sequence[Mapping[str, Any]],
                     tpp: float | None = None) -> tuple[float, ...]:
    """The ladder's multiples at ``size`` (and ratio ``tpp``): the file's, then twice the top while a compared run
    beats the top rung (:func:`beats_top`) and every baseline run at the top has finished, up to
    :attr:`Ladder.cap`. Replayed from the finished runs, so a restarted sweep decides the same."""
    mults = sorted(ladder.multiples)
    while mults[-1] * 2 <= ladder.cap:
        top = [r for r in records if r.get("optimizer") == ladder.optimizer and r.get("model_size") == size
               and r.get("budget_tpp") == tpp
               and r.get("lr_multiplier") is None and float(r.get("budget_multiple") or 1.0) == mults[-1]]
        if not top or any(r.get("status") not in FINAL_STATUSES for r in top):
            break
        tokens = [budget_tokens(r) for r in top if budget_tokens(r)]
        if not tokens or not beats_top(records, ladder.optimizer, size, max(tokens), tpp):
            break
        mults.append(mults[-1] * 2)
    return tuple(mults)


def check_ladder(ladder: Ladder, table: Steps) -> None:
    """Every size's ladder budgets must differ in steps, or the curve has repeated points."""
    for (size, opt, tpp), steps in table.items():
        if opt != ladder.optimizer:
            continue
        counts = [ladder_steps(steps, m) for m in ladder.multiples]
        if len(set(counts)) < len(counts):
            where = size if tpp is None else f"{size} at {tpp:g} tokens/param"
            raise OptBenchError(f"the ladder's budgets collapse to the same step count at {where} ({counts} steps for "
                                f"multiples {list(ladder.multiples)}): raise the budget or space the multiples wider.")
