"""The numbers of a sweep's report: one flat record per run directory, the targets, the derived columns
(time to each target, eval loss at matched budgets, spikes per 1k steps, planner state), the verdicts, and means
over seeds per optimizer and size.

Reads only run directories (``summary.json`` + ``metrics.jsonl``, docs/ARCHITECTURE.md) and the sweep's
``sweep_manifest.json`` / ``sweep_state.jsonl``, so it works on a sweep that is still running or was killed.
Convergence is compared at targets fixed from the baseline's runs alone (:mod:`hf_optbench.report.targets`); the
verdict uses the 50 % target, and a run that never reaches it (or diverges) counts at its budget, marked censored.
Runs at a learning-rate multiplier other than 1 are tuning runs: they feed the tuning curves, not the comparison.
Runs of the baseline at a budget multiple other than 1 are its ladder: they feed the speedup
(:mod:`hf_optbench.report.speedups`), not the per-metric comparison.

A sweep over several data ratios (tokens per parameter) is grouped by **cell** (a size at a ratio,
``study.records.Cell``: "tiny @ 0.5 tok/param") wherever a single-ratio sweep is grouped by size: targets,
ladders, tables and plots. In a single-ratio sweep the cell is the size, so its report reads as before. The verdict
then runs along both axes (``measure.verdict.grid_families``): the size axis at each ratio every size ran, the data
axis at each size, with one Holm procedure over all of it.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_optbench.config.bench_args import TARGET_SMOOTHING_STEPS
from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    BASELINE,
    FINISHED_STATUSES,
    read_metrics,
)
from hf_optbench.study.records import Cell, RunRecord, load_records, set_columns

DERIVED_COLUMNS = ("target", "target_loss", "steps_to_target", "tokens_to_target", "seconds_to_target",
                   "target_censored", "mean_loss_over_budget", "eval_loss_at_50%", "loss_spikes_per_1k", "diverged",
                   "planner_optimizer_state_bytes", "hyperparameter_sources", "speedup", "speedup_bound",
                   "speedup_method", "baseline_equivalent_tokens")


# ---------------------------------------------------------------------------------------------- derived
def parse_targets(text: str | None) -> float | dict[str, float] | None:
    """``5.0`` (every size) or ``tiny=6.1,mini=5.4``; None for the targets fixed from the baseline's runs."""
    if not text:
        return None
    try:
        if "=" not in text:
            return float(text)
        return {k.strip(): float(v) for k, v in (part.split("=", 1) for part in text.split(",") if part.strip())}
    except ValueError as exc:
        raise OptBenchError(f"--target-loss '{text}' is not a number or a list like tiny=6.1,mini=5.4.") from exc


def is_comparison(rec: Mapping[str, Any]) -> bool:
    """A run of the comparison: no learning-rate, weight-decay or budget multiplier, or x1 (the rate and budget the
    sweep compares at)."""
    return all(rec.get(k) is None or float(rec[k]) == 1.0
               for k in ("lr_multiplier", "wd_multiplier", "budget_multiple"))


def is_ladder(rec: Mapping[str, Any]) -> bool:
    """A run of the baseline's budget ladder at a multiple other than 1 (its x1 run is a comparison run)."""
    return rec.get("lr_multiplier") is None and rec.get("budget_multiple") not in (None, 1.0)


@dataclass
class Analysis:
    """Everything the report shows, computed once: the comparison's records (with derived columns), every run's
    record and metrics, the targets, the verdicts and the tuning runs."""

    records: list[RunRecord]  # the comparison (lr multiplier none or 1)
    model_sizes: list[str] = field(default_factory=list)  # the model sizes run, by parameter count
    ratios: list[float] = field(default_factory=list)  # the data ratios (tokens per parameter) of a sweep with several
    all_records: list[RunRecord] = field(default_factory=list)  # every run directory of the sweep
    tuning: list[RunRecord] = field(default_factory=list)  # runs with an lr multiplier (+ --tuning-dir)
    ladder: list[RunRecord] = field(default_factory=list)  # the baseline's runs at other budgets
    attribution: list[RunRecord] = field(default_factory=list)  # <sweep>/attribution (study.comparison_runs)
    ladder_fits: dict[tuple[str, int], Any] = field(default_factory=dict)  # (size, seed) -> speedup.LadderFit
    metrics: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    targets: dict[str, list[Any]] = field(default_factory=dict)  # size -> [targets.Target]
    target_notes: list[str] = field(default_factory=list)
    given_targets: bool = False
    sizes: list[str] = field(default_factory=list)  # the cells, by parameter count and ratio (the sizes, for one ratio)
    cell_size: dict[str, str] = field(default_factory=dict)  # cell -> its model size
    cell_tpp: dict[str, float | None] = field(default_factory=dict)  # cell -> its data ratio (None: one ratio)
    optimizers: list[str] = field(default_factory=list)
    verdicts: list[Any] = field(default_factory=list)
    predicted: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sweep_dir: Path | None = None
    # report.sections.tuning_noise.TuningNoise: the second tuning draw's shifts, where the sweep ran one
    tuning_noise: Any = None
    report_spec: Any = None  # measure.primary.ReportSpec: the sweep's primary questions, transient cells in or out
    regime: Any = None  # report.sections.regime.Regime, computed once before the verdicts (None: not computed)
    regime_text: str = ""  # its one line for report.md

    def ok(self) -> list[RunRecord]:
        return [r for r in self.records if r.status in FINISHED_STATUSES]

    def set_columns(self, records: Iterable[RunRecord],
                    columns: Callable[[RunRecord], Mapping[str, Any]]) -> None:
        """Give each of ``records`` (records of this analysis) the derived ``columns(record)``, in every list of
        the analysis that holds it."""
        set_columns((self.records, self.all_records, self.tuning, self.ladder, self.attribution), records, columns)

    @property
    def multi(self) -> bool:
        """A sweep over several data ratios: grouped by cell, judged along two axes."""
        return bool(self.ratios)

    def file_key(self, cell: str) -> str:
        """A cell as a file name's part: "tiny", or "tiny__tpp0.5" (as run ids spell the ratio)."""
        import re

        tpp = self.cell_tpp.get(cell)
        key = self.cell_size.get(cell, cell) + ("" if tpp is None else f"__tpp{tpp:g}")
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", key)  # never a '/' or a space from a label in a file name

    def verdicts_along(self, axis: str, at: str | None = None) -> list[Any]:
        """The verdicts along ``axis`` ("size", "data"), those at ``at`` only when given."""
        return [v for v in self.verdicts if v.axis == axis and (at is None or v.at == at)]

    def point(self, optimizer: str, key: str, cell: str) -> tuple[Any, Any]:
        """(the verdict cell, its point) that holds ``optimizer``'s comparison of metric ``key`` at ``cell``: the size
        axis's (a single-ratio sweep's only axis); in a sweep over ratios the data axis's at the cell's size where
        that axis judges the metric, else the size axis's at the cell's ratio. (None, None) where none does."""
        from hf_optbench.measure.verdict import ratio_label

        size, tpp = self.cell_size.get(cell, cell), self.cell_tpp.get(cell)
        where = [("size", "", size)] if tpp is None else [("data", size, ratio_label(tpp)),
                                                           ("size", ratio_label(tpp), size)]
        for axis, at, label in where:
            for v in self.verdicts_along(axis, at):
                if v.optimizer == optimizer and v.metric.key == key:
                    p = next((p for p in v.points if p.model_size == label), None)
                    if p is not None:
                        return v, p
        return None, None

    def verdict_target(self, size: str) -> Any:
        """The target the verdict uses at ``size`` (the given one, else the baseline's 50 % point), or None."""
        from hf_optbench.report.targets import GIVEN, VERDICT_TARGET

        want = GIVEN if self.given_targets else VERDICT_TARGET
        return next((t for t in self.targets.get(size, []) if t.name == want), None)


# The smoothing window may span at most this share of a run's planned steps: the first target sits at 25 % of them
# (report.targets.FRACTIONS), so the window covers at most half of the steps before it and every target exists.
MAX_WINDOW_SHARE = 0.125


def recorded_window(rec: RunRecord) -> int:
    """The run's own target_smoothing_steps (summary.json, else config.yaml; the default where neither says)."""
    from hf_optbench.report.planned import run_config

    value = rec.summary.get("target_smoothing_steps") or run_config(rec).get("target_smoothing_steps")
    return int(value or TARGET_SMOOTHING_STEPS)


def window(rec: RunRecord) -> int:
    """The report's smoothing window for a run: its own target_smoothing_steps (so report and recorder agree), cut to
    :data:`MAX_WINDOW_SHARE` of its planned steps where it would not fit. Why: at a fixed window of 20 steps a 30-step
    run (nano at 0.15 tokens/param) had no 25 % or 50 % target at all (the window was not full by step 8 or 15), so
    its time to target went unanswered; a window that scales with the run keeps every target, and runs of 160 steps
    or more keep the recorded 20. The report says where it cut (:func:`window_note`)."""
    steps = rec.summary.get("max_steps") or rec.max_steps
    own = recorded_window(rec)
    return min(own, max(1, int(MAX_WINDOW_SHARE * int(steps)))) if steps else own


def window_note(an: Analysis) -> str | None:
    """One line where :func:`window` cut some compared runs' smoothing window, else None."""
    cut = {r.cell.label: (recorded_window(r), window(r)) for r in an.ok() if window(r) < recorded_window(r)}
    if not cut:
        return None
    cells = ", ".join(f"{c} ({new} of {own} steps)" for c in an.sizes if c in cut for own, new in [cut[c]])
    return (f"the train-loss smoothing window of the shortest runs is cut to an eighth of their steps, at most half "
            f"of the steps before the 25 % target, so that every target exists: {cells}; target_smoothing_steps in "
            "the recipe sets the window")


def report_spec_of(sweep_dir: str | os.PathLike[str], include_transient: bool | None = None) -> Any:
    """The sweep's ``report:`` section as its manifest recorded it (the defaults where it has none: the
    benchmark's own question as the primary family, transient cells out of the trends), ``include_transient``
    overriding the file's choice where given."""
    import dataclasses
    import json

    from hf_optbench.measure.primary import parse_report_spec
    from hf_optbench.measure.verdict import METRICS
    from hf_optbench.rundir import MANIFEST_FILE

    manifest = Path(sweep_dir) / MANIFEST_FILE
    raw = None
    if manifest.is_file():
        try:
            raw = json.loads(manifest.read_text(encoding="utf-8")).get("report")
        except (OSError, ValueError, AttributeError):
            raw = None
    spec = parse_report_spec(raw, [m.key for m in METRICS], f"report of {manifest}")
    return spec if include_transient is None else dataclasses.replace(spec, include_transient=include_transient)


def transient_cells(an: Analysis) -> frozenset[tuple[str, float | None]]:
    """(size, ratio) of every cell the regime calls transient, unless the report spec puts them back in."""
    from hf_optbench.report.sections.regime import TRANSIENT

    if an.regime is None or (an.report_spec is not None and an.report_spec.include_transient):
        return frozenset()
    return frozenset((an.cell_size.get(c, c), an.cell_tpp.get(c)) for c, w in an.regime.cells.items() if w == TRANSIENT)


def _no_runs_text(sweep_dir: Path) -> str:
    """Why there is nothing to report: a folder no sweep wrote, or a sweep (its manifest written) whose runs are not
    there yet, still in its tuning phase or before its first run."""
    from hf_optbench.rundir import MANIFEST_FILE, TUNING_DIR

    if not (sweep_dir / MANIFEST_FILE).is_file():
        return f"no run directories in '{sweep_dir}'. Run `hf-optbench sweep` first."
    tuning = sweep_dir / TUNING_DIR
    where = " (its tuning phase has runs: the comparison comes after it)" if tuning.is_dir() and any(
        tuning.glob("runs/*/summary.json")) else ""
    return (f"the sweep in '{sweep_dir}' has no compared run yet{where}: it is running, or stopped before its "
            "comparison. Run `hf-optbench report` again once its runs have finished (the same `hf-optbench sweep` "
            "command continues a stopped one).")


def analyse(sweep_dir: str | os.PathLike[str], target_loss: float | dict[str, float] | None = None,
            baseline: str = BASELINE, tuning_dir: str | os.PathLike[str] | None = None,
            include_transient: bool | None = None) -> Analysis:
    """Everything the report shows, computed once. ``tuning_dir``: a tuning sweep whose runs give the tuning
    curves (the sweep's own runs at lr multipliers other than 1 always do). ``include_transient``: put the cells
    that end at or above the bigram reference back into the trends (the sweep file's ``report.include_transient``
    otherwise decides; default no)."""
    from hf_optbench.measure.verdict import grid_families, verdict, verdict_table
    from hf_optbench.report.comparability import check_comparable
    from hf_optbench.report.noise import unmeasurable
    from hf_optbench.report.planned import planner_state, predicted_ratios
    from hf_optbench.report.sections.regime import regime_summary
    from hf_optbench.report.sections.tuning_noise import apply_tuning_noise
    from hf_optbench.report.speedups import derive_speedups
    from hf_optbench.study.comparison_runs import attribution_dir

    everything = load_records(sweep_dir)
    if not everything:
        raise OptBenchError(_no_runs_text(Path(sweep_dir)))
    an = Analysis(records=[r for r in everything if is_comparison(r)], all_records=everything,
                  sweep_dir=Path(sweep_dir))
    extra = load_records(tuning_dir) if tuning_dir is not None else []
    an.tuning = [r for r in everything + extra if r.lr_multiplier is not None]
    an.ladder = [r for r in everything if is_ladder(r)]
    attributed = attribution_dir(sweep_dir)
    an.attribution = [r for r in load_records(attributed) if r.status in FINISHED_STATUSES] if attributed else []
    # before anything is derived: runs that differ in more than what is compared are refused, never pooled
    check_comparable([r for r in an.records if r.status in FINISHED_STATUSES],
                     [r for r in an.ladder if r.status in FINISHED_STATUSES])
    skipped = len(everything) - len(an.records) - len(an.ladder)
    if an.ladder:
        an.notes.append(f"{len(an.ladder)} run(s) of {baseline} at other data budgets form its ladder: they give the "
                        "speedup, not the other comparisons")
    if skipped:
        an.notes.append(f"{skipped} run(s) at a learning-rate multiplier other than 1 are tuning runs: they appear "
                        "in the tuning curves and the run list, not in the comparison")
    ok = an.ok()
    _set_cells(an, ok)
    _drop_leftover_tuning(an)
    an.optimizers = sorted({r.optimizer for r in an.records if r.optimizer},
                           key=lambda o: (o != baseline, o))
    for r in everything + extra:
        if r.status in FINISHED_STATUSES:
            an.metrics[r.run_id] = read_metrics(r.run_dir)
    _set_targets(an, target_loss, baseline)
    an.set_columns(an.records, lambda r: _derived(an, r))
    an.set_columns(an.records, lambda r: {"planner_optimizer_state_bytes": planner_state(r)})
    derive_speedups(an, baseline)
    ok = an.ok()
    an.report_spec = report_spec_of(sweep_dir, include_transient)
    an.regime_text, an.regime = regime_summary(an)
    transient = transient_cells(an)
    if any(r.optimizer == baseline for r in ok) and an.multi:
        an.verdicts = verdict_table(grid_families(ok, unmeasurable=lambda rows: unmeasurable(
            rows, an.optimizers, list(dict.fromkeys(str(r["model_size"]) for r in rows)), baseline),
            transient=frozenset((s, t) for s, t in transient if t is not None)),
            baseline=baseline, report=an.report_spec)
    elif any(r.optimizer == baseline for r in ok):
        an.verdicts = verdict(ok, baseline=baseline, unmeasurable=unmeasurable(ok, an.optimizers, an.sizes, baseline),
                              report=an.report_spec, transient=frozenset(s for s, _ in transient))
    else:
        an.notes.append(f"no completed '{baseline}' runs: ratios and verdicts need the baseline")
    an.tuning_noise = apply_tuning_noise(an, baseline)  # intervals widened by the second tuning draw's shift
    an.predicted = predicted_ratios(an, baseline)
    return an


def _drop_leftover_tuning(an: Analysis) -> None:
    """Tuning runs of cells the sweep no longer has (a ratio or size removed from the file after they ran) are named
    in a note and left out of the tuning curves: they tuned nothing this report compares."""
    if not an.sizes:
        return
    leftover = [r for r in an.tuning if r.cell.label not in an.sizes]
    if leftover:
        cells = sorted({r.cell.label for r in leftover})
        an.tuning = [r for r in an.tuning if r.cell.label in an.sizes]
        an.notes.append(f"{len(leftover)} tuning run(s) of cell(s) this sweep no longer has ({', '.join(cells)}): "
                        "listed under Runs, left out of the tuning curves")


def _set_cells(an: Analysis, ok: Sequence[RunRecord]) -> None:
    """The sizes (by parameter count), the data ratios of a sweep with several, and the cells the report groups by:
    each size at each ratio it ran, by size then ratio (the sizes themselves for one ratio)."""
    params = {r.model_size: float(r["num_params"]) for r in reversed(ok) if r.get("num_params")}
    an.model_sizes = sorted({r.model_size for r in an.records if r.model_size},
                            key=lambda s: params.get(s, math.inf))
    an.ratios = sorted({float(r.budget_tpp) for r in an.records if r.budget_tpp is not None})
    cells = {(r.model_size, r.budget_tpp) for r in an.records if r.model_size}
    for size, tpp in sorted(cells, key=lambda c: (an.model_sizes.index(c[0]), c[1] or 0.0)):
        cell = Cell(size, tpp).label
        an.sizes.append(cell)
        an.cell_size[cell], an.cell_tpp[cell] = size, tpp


def _set_targets(an: Analysis, target_loss: float | dict[str, float] | None, baseline: str) -> None:
    """The targets per cell: given (one for all, or per size), else fixed from the baseline's completed runs."""
    from hf_optbench.report.targets import baseline_targets, given_target, merge_size_notes

    an.given_targets = target_loss is not None
    for size in an.sizes:
        if isinstance(target_loss, dict):
            if an.cell_size[size] in target_loss:
                an.targets[size] = [given_target(size, target_loss[an.cell_size[size]])]
        elif target_loss is not None:
            an.targets[size] = [given_target(size, float(target_loss))]
        else:
            runs = [(r, an.metrics[r.run_id].get("train", []), window(r)) for r in an.ok()
                    if r.cell.label == size and r.optimizer == baseline and r.status == "completed"]
            an.targets[size], notes = baseline_targets(size, runs, baseline)
            an.target_notes += notes
            if not runs:
                an.target_notes.append(f"{size}: no completed {baseline} run, so no target")
    an.target_notes = merge_size_notes(an.target_notes)
    cut = window_note(an) if target_loss is None else None
    if cut:
        an.target_notes.append(cut)


def _derived(an: Analysis, r: RunRecord) -> dict[str, Any]:
    """The derived columns of one record: stability figures, the time to each target (censored at the budget), the
    eval loss at each target's token count and the mean loss over the budget."""
    from hf_optbench.report.targets import budget, eval_at_tokens, mean_loss_over_budget, time_to_each

    finished = r.status in FINISHED_STATUSES
    d: dict[str, Any] = {"diverged": 1.0 if r.status == "diverged" else 0.0 if r.status == "completed" else None}
    steps = r.get("steps") or 0
    d["loss_spikes_per_1k"] = (1000.0 * float(r.get("loss_spikes") or 0) / steps) if finished and steps else None
    d["hyperparameter_sources"] = r.summary.get("hyperparameter_sources")
    if r.status == "diverged":
        d["final_eval_loss"] = None  # a diverged run's last loss is not a convergence figure (see stability)
    targets = an.targets.get(r.cell.label, [])
    m = an.metrics.get(r.run_id, {})
    train = m.get("train", [])
    limit = budget(r, train) if finished else None
    d["to_target"] = time_to_each(train, targets, window(r), limit) if finished and targets else {}
    d["eval_at"] = {t.name: eval_at_tokens(m.get("eval", []), t.tokens) for t in targets}
    d["eval_loss_at_50%"] = d["eval_at"].get("50%")
    d["mean_loss_over_budget"] = mean_loss_over_budget(train, (limit or {}).get("tokens"),
                                                       r.status == "diverged") if finished else None
    chosen = an.verdict_target(r.cell.label)
    d["target"] = chosen.name if chosen else None
    d["target_loss"] = chosen.loss if chosen else None
    hit = d["to_target"].get(chosen.name) if chosen else None
    for key in ("steps", "tokens", "seconds"):
        d[f"{key}_to_target"] = hit[key] if hit else None
        d[f"{key}_to_target_censored"] = bool(hit and hit["censored"])
    d["target_censored"] = d["tokens_to_target_censored"] if hit else None
    return d


# ------------------------------------------------------------------------------------------- aggregation
def _agg(values: Iterable[Any]) -> dict[str, float] | None:
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "n": len(vals)}


def group(records: Sequence[RunRecord], key: str, optimizer: str, size: str,
          statuses: tuple[str, ...] = FINISHED_STATUSES, by_size: bool = False) -> dict[str, float] | None:
    """mean/std/min/max/n of ``key`` over the seeds of one optimizer at one cell (``size``: a cell, the size itself in
    a single-ratio sweep; with ``by_size`` a model size, every ratio's runs pooled) (runs with ``statuses``)."""
    return _agg(r.figure(key) for r in records
                if r.optimizer == optimizer and (r.model_size if by_size else r.cell.label) == size
                and r.status in statuses)

