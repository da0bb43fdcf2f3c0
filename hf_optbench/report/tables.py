"""The report's tables as specs: each table is a list of :class:`Column` (a header, and how to compute the cell
from a row) and one renderer, :func:`render`, makes every table from its spec.

Most tables have one row per optimizer and model size (a :class:`Group`, the seeds of that pair) and say which
groups they show (:class:`GroupTable` ``keep``). Adding a figure to the report is one line in a spec, e.g. in
:data:`STABILITY`::

    Column("max grad-norm spike", pm("max_grad_norm_spike", "{:.3g}")),

``pm(key)`` is the mean ± standard deviation over seeds of a record column, or of any summary.json key of that
name (:func:`hf_optbench.report.analysis.value`); ``mib(key)`` the mean in MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hf_optbench.report.analysis import Analysis, group
from hf_optbench.rundir import BASELINE, FINISHED_STATUSES
from hf_optbench.study.records import RunRecord

Cell = Callable[[Any], Any]


@dataclass(frozen=True)
class Column:
    """One column of a table: its header, and the cell of a row (anything; rendered with ``str``)."""

    header: str
    cell: Cell


@dataclass(frozen=True)
class Group:
    """One optimizer at one model size (a cell: a size at a data ratio, in a sweep with several), over its seeds: a
    row of the per-size tables."""

    an: Analysis
    size: str
    optimizer: str

    def agg(self, key: str, statuses: tuple[str, ...] = FINISHED_STATUSES) -> dict[str, float] | None:
        return group(self.an.records, key, self.optimizer, self.size, statuses)

    def mean(self, key: str) -> float | None:
        return (self.agg(key) or {}).get("mean")

    def runs(self, statuses: tuple[str, ...] = FINISHED_STATUSES) -> list[RunRecord]:
        return [r for r in self.an.records if r.optimizer == self.optimizer
                and r.cell.label == self.size and r.status in statuses]


@dataclass(frozen=True)
class GroupTable:
    """A table with one row per (size, optimizer) group that ``keep`` accepts, sizes outermost."""

    columns: Sequence[Column]
    keep: Callable[[Group], bool]

    def rows(self, an: Analysis) -> list[Group]:
        groups = (Group(an, size, opt) for size in an.sizes for opt in an.optimizers)
        return [g for g in groups if self.keep(g)]


def render(columns: Sequence[Column], rows: Iterable[Any]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of a table: every cell computed by its column, as text."""
    return [c.header for c in columns], [[str(c.cell(row)) for c in columns] for row in rows]


# ------------------------------------------------------------------------------------------------ formats
def fmt_mib(v: float | None) -> str:
    return "–" if v is None else f"{v / 2**20:,.2f}"


def fmt_num(v: float | None, fmt: str = "{:.4g}") -> str:
    return "–" if v is None else fmt.format(v)


def fmt_pm(a: dict[str, float] | None, fmt: str = "{:.4g}", scale: float = 1.0) -> str:
    """"mean ± std" of an aggregate (no ± for one seed or no spread)."""
    if a is None:
        return "–"
    s = fmt.format(a["mean"] / scale)
    if a["n"] > 1 and a["std"] > 0:
        std = a["std"] / scale
        s += " ± " + (fmt.format(std) if "f}" in fmt else f"{std:.2g}")
    return s


def pm(key: str, fmt: str = "{:.4g}", statuses: tuple[str, ...] = FINISHED_STATUSES) -> Cell:
    """Cell: mean ± std over the group's seeds of ``key``."""
    return lambda g: fmt_pm(g.agg(key, statuses), fmt)


def mib(key: str) -> Cell:
    """Cell: mean over the group's seeds of a byte count, in MiB."""
    return lambda g: fmt_mib(g.mean(key))


SIZE = Column("size", lambda g: g.size)
OPTIMIZER = Column("optimizer", lambda g: g.optimizer)


# ------------------------------------------------------------------------------------------- per-size tables
def _planner_check(g: Group) -> str:
    measured, planned = g.mean("optimizer_state_bytes"), g.mean("planner_optimizer_state_bytes")
    if measured is None or planned is None:
        return "–"
    return "equal" if measured == planned else f"differs by {measured - planned:+,.0f} B"


def _reached(g: Group) -> str:
    """"2/3 (1 censored)": runs that reached the verdict's target, of the finished ones; the others count at
    their budget."""
    runs = [r for r in g.runs() if r.get("tokens_to_target") is not None]
    censored = sum(1 for r in runs if r.get("tokens_to_target_censored"))
    return f"{len(runs) - censored}/{len(runs)}" + (f" ({censored} censored)" if censored else "")


def _wall_note(g: Group, key: str) -> str:
    """The wall-clock warning of hf_optbench.report.noise beside a figure of a non-baseline optimizer."""
    from hf_optbench.report.noise import by_seed, wallclock_note

    if g.optimizer == BASELINE:
        return ""
    note = wallclock_note(by_seed(g.runs(), key, g.optimizer, g.size), by_seed(
        [r for r in g.an.ok() if r.optimizer == BASELINE], key, BASELINE, g.size))  # by_seed: by cell
    return f" {note}" if note else ""


def _diverged(g: Group) -> str:
    runs = g.runs()
    return f"{sum(1 for r in runs if r['status'] == 'diverged')}/{len(runs)}"


def _impl(g: Group) -> str:
    return next((r.get("optimizer_impl") for r in g.runs()), "") or ""


_MEMORY_KEYS = ("param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_memory_bytes",
                "planner_optimizer_state_bytes", "optimizer_state_bytes_per_param")
COMPLETED = ("completed",)

MEMORY = GroupTable(keep=lambda g: any(g.agg(k) for k in _MEMORY_KEYS), columns=[
    SIZE, OPTIMIZER,
    Column("parameters", mib("param_bytes")),
    Column("gradients", mib("grad_bytes")),
    Column("optimizer state", mib("optimizer_state_bytes")),
    Column("peak", mib("peak_memory_bytes")),
    Column("state B/param", pm("optimizer_state_bytes_per_param", "{:.3f}")),
    Column("planner state", mib("planner_optimizer_state_bytes")),
    Column("planner vs measured", _planner_check),
])
CONVERGENCE = GroupTable(keep=lambda g: bool(g.runs()), columns=[
    SIZE, OPTIMIZER,
    Column("final eval loss", pm("final_eval_loss", statuses=COMPLETED)),
    Column("eval loss at 50 % budget", pm("eval_loss_at_50%")),
    Column("mean train loss over budget", pm("mean_loss_over_budget", statuses=COMPLETED)),
    Column("steps to target", pm("steps_to_target", "{:.0f}")),
    Column("tokens to target", pm("tokens_to_target", "{:,.0f}")),
    Column("seconds to target", lambda g: pm("seconds_to_target", "{:.1f}")(g) + _wall_note(g, "seconds_to_target")),
    Column("reached", _reached),
])
THROUGHPUT = GroupTable(keep=lambda g: g.agg("step_time_median_s") is not None, columns=[
    SIZE, OPTIMIZER,
    Column("implementation", _impl),
    Column("median step (s)", lambda g: pm("step_time_median_s", "{:.4f}")(g) + _wall_note(g, "step_time_median_s")),
    Column("p90 step (s)", pm("step_time_p90_s", "{:.4f}")),
    Column("tokens/s", lambda g: pm("tokens_per_s", "{:,.0f}")(g) + _wall_note(g, "tokens_per_s")),
    Column("MFU", pm("mfu", "{:.3f}")),
])
STABILITY = GroupTable(keep=lambda g: bool(g.runs()), columns=[
    SIZE, OPTIMIZER,
    Column("loss spikes", pm("loss_spikes", "{:.1f}")),
    Column("per 1k steps", pm("loss_spikes_per_1k", "{:.2f}")),
    Column("grad-norm spikes", pm("grad_norm_spikes", "{:.1f}")),
    Column("max loss spike", pm("max_loss_spike", "{:.3g}")),
    Column("diverged", _diverged),
])


# ----------------------------------------------------------------------------------------- other tables
def _last_error_line(r: dict[str, Any]) -> str:
    return (str(r.get("error") or "").strip().splitlines() or [""])[-1][:160]


def _sources(r: RunRecord) -> str:
    from hf_optbench.report.tuning_curves import sources_cell

    return sources_cell(r.summary.get("hyperparameter_sources"))


RUNS = [  # one row per run record
    Column("run", lambda r: r.run_id),
    Column("status", lambda r: r.status),
    Column("lr multiplier", lambda r: "–" if r.lr_multiplier is None else f"{float(r.lr_multiplier):g}"),
    Column("lr", lambda r: fmt_num(r.get("learning_rate"), "{:.3g}")),
    Column("hyperparameters from", _sources),
    Column("steps", lambda r: fmt_num(r.get("steps"), "{:.0f}")),
    Column("final eval loss", lambda r: fmt_num(r.get("final_eval_loss"))),
    Column("attempts", lambda r: r.get("attempts") or ""),
    Column("error", _last_error_line),
]
def _slope(v: Any) -> str:
    """The trend as a reader reads it (``Verdict.trend_text``: + is the optimizer's advantage growing)."""
    return v.trend_text() or "–"


def along(v: Any) -> str:
    """Which axis a verdict runs along and where on the other: "size, at 0.5 tok/param" or "data, at tiny"."""
    return v.axis + (f", at {v.at}" if v.at else "")


EVIDENCE = [  # one row per verdict (optimizer x metric)
    Column("optimizer", lambda v: v.optimizer),
    Column("metric", lambda v: v.metric.label),
    Column("verdict", lambda v: v.word),
    Column("paired seeds per size", lambda v: ", ".join(f"{p.model_size} {p.n_pairs}" for p in v.points) or "–"),
    Column("censored pairs", lambda v: sum(p.censored_pairs for p in v.points)),
    Column("advantage trend / decade [CI] (+: grows)", _slope),
    Column("tier", lambda v: v.tier or "–"),
    Column("trend threshold / decade", lambda v: fmt_num(v.threshold, "{:.3f}")),
    Column("evidence", lambda v: v.evidence),
]


def evidence_columns(an: Analysis) -> list[Column]:
    """:data:`EVIDENCE`, with the axis each verdict runs along in a sweep over data ratios."""
    return EVIDENCE[:2] + [Column("along", along)] + EVIDENCE[2:] if an.multi else EVIDENCE


def data_axis_table(an: Analysis, key: str = "speedup") -> tuple[list[str], list[list[str]]]:
    """(header, rows): per optimizer and size, the data-axis verdict's paired ratio at each data ratio (its
    interval and stance) and the verdict along data."""
    from hf_optbench.measure.verdict import ratio_label

    labels = [ratio_label(r) for r in an.ratios]
    rows = []
    for v in an.verdicts_along("data"):
        if v.metric.key != key or not v.points:
            continue
        points = {p.model_size: p for p in v.points}
        rows.append([v.optimizer, v.at, *[ratio_cell(points.get(label)) for label in labels], v.word])
    return ["optimizer", "size", *labels, "verdict along data"], rows


def verdict_cell(v: Any) -> str:
    """"grows (2.45→0.823; ahead at midi)": the verdict, the ratio (or gap) at the smallest and the largest size
    ("≥ 4" where every pair is a bound), and where the optimizer stands at the largest size (ahead, behind, level or
    no difference: the stance of its paired interval, see hf_optbench/measure/verdict.py)."""
    from hf_optbench.measure.verdict import NOT_MEASURABLE

    if v.verdict == NOT_MEASURABLE:
        why = "runs shared the machine" if "sharing the machine" in v.evidence else "seed spread > effect"
        return f"{v.verdict} ({why}; see Evidence)"
    if not v.judged_points:
        return f"{v.word} ({v.evidence})"
    a, b = v.judged_points[0], v.judged_points[-1]
    where = b.stance
    if v.metric.mode == "ratio":
        span = f"{a.bound_sign()}{a.ratio():.3g}→{b.bound_sign()}{b.ratio():.3g}"
    else:
        span = f"{a.bound_sign()}{a.gap:+.2g}→{b.bound_sign()}{b.gap:+.2g}"
    bounds = f"; {b.censored_pairs}/{b.n_pairs} bounds at {b.model_size}" if b.censored_pairs else ""
    if v.verdict == "no difference":
        return f"{v.verdict} ({span}; {b.mde_text(v.metric.mode, v.metric.unit)} at {b.model_size}{bounds})"
    if v.verdict in ("level", "insufficient data"):
        return f"{v.verdict} ({span})"
    return f"{v.word} ({span}; {where} at {b.model_size}{bounds})"


def verdict_columns(an: Analysis, verdicts: Sequence[Any] | None = None) -> list[Column]:
    """One row per non-baseline optimizer, one column per metric that has a verdict (among ``verdicts``: one family's,
    along one axis at one place; all of the analysis's by default)."""
    chosen = an.verdicts if verdicts is None else list(verdicts)

    def cell(spec: Any) -> Cell:
        return lambda opt: next((verdict_cell(v) for v in chosen if v.optimizer == opt and v.metric == spec), "–")

    specs = list(dict.fromkeys(v.metric for v in chosen))
    return [Column("optimizer", lambda opt: opt)] + [Column(f"{s.question}: {s.label}", cell(s)) for s in specs]


@dataclass(frozen=True)
class RatioRow:
    """A row of the ratio table: measured at a size the sweep ran, or predicted by the memory planner."""

    optimizer: str
    size: str
    params: str
    source: str
    ratios: dict[str, str]  # metric key -> cell


def ratio_cell(p: Any) -> str:
    """"0.823 [0.70, 0.96] ahead (1/5 pairs bounds)": the paired ratio (the censored-normal estimate where some
    pairs are bounds; itself a bound, "≥ 4", where all are), its interval (at half the cell's level), where it stands
    against the equivalence margin (with the MDE where it shows no difference), and how many pairs are bounds."""
    if p is None:
        return "–"
    text = p.ratio_text()
    text = text.replace(" no difference", f" no difference ({p.mde_text('ratio')})", 1) if p.stance == "no difference" \
        else text
    return text + (" transient" if p.transient else "")


def _ratio_wall_note(an: Analysis, opt: str, size: str) -> str:
    from hf_optbench.report.noise import by_seed, wallclock_note

    note = wallclock_note(by_seed(an.ok(), "seconds_to_target", opt, size),
                          by_seed(an.ok(), "seconds_to_target", BASELINE, size))
    return f" {note}" if note else ""


def ratio_rows(an: Analysis) -> list[RatioRow]:
    """Each non-baseline optimizer's ratio to the baseline per size (cell) run, then its planner-predicted rows;
    each cell is the point of the verdict that judges it (:meth:`Analysis.point`)."""
    from hf_optbench.measure.verdict import METRICS
    from hf_optbench.report.noise import WALL_CLOCK_KEYS

    rows = []
    for opt in (o for o in an.optimizers if o != BASELINE):
        for size in an.sizes:
            ratios, pairs = {}, 0
            for s in (s for s in METRICS if s.mode == "ratio"):
                p = an.point(opt, s.key, size)[1]
                ratios[s.key] = ratio_cell(p) + (_ratio_wall_note(an, opt, size) if s.key in WALL_CLOCK_KEYS else "")
                pairs = max(pairs, p.n_pairs if p else 0)
            ratios["pairs"] = str(pairs)
            n = group(an.records, "num_params", opt, size)
            rows.append(RatioRow(opt, size, fmt_num(n["mean"] if n else None, "{:,.0f}"), "measured", ratios))
        rows += [RatioRow(opt, p["model_size"], f"{p['num_params']:,}", "predicted (planner)",
                          {"optimizer_state_bytes": f"{p['ratio']:.3f}"})  # the planner predicts state only
                 for p in an.predicted if p["optimizer"] == opt]
    return rows


def ratio_columns() -> list[Column]:
    from hf_optbench.measure.verdict import METRICS

    def cell(key: str) -> Cell:
        return lambda row: row.ratios.get(key, "–")

    return [Column("optimizer", lambda r: r.optimizer), Column("size", lambda r: r.size),
            Column("parameters", lambda r: r.params), Column("source", lambda r: r.source),
            Column("paired seeds", cell("pairs"))] \
        + [Column(s.label, cell(s.key)) for s in METRICS if s.mode == "ratio"]
