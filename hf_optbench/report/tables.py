"""The machinery of the report's tables: each table is a list of :class:`Column` (a header, and how to compute the
cell from a row) and one renderer, :func:`render`, makes every table from its spec. The specs live with their
sections (:mod:`hf_optbench.report.sections`); here are the pieces they share: the formats, the cells of a group's
figures, the wall-clock warning and the verdict's and the paired ratio's cells.

Most tables have one row per optimizer and model size (a :class:`Group`, the seeds of that pair) and say which
groups they show (:class:`GroupTable` ``keep``). Adding a figure to the report is one line in a spec, e.g. in
:data:`hf_optbench.report.sections.throughput_stability.STABILITY`::

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


def fmt_mean_sd(mean: float, sd: float, n: int, fmt: str) -> str:
    """"mean ± sd" of a pandas aggregate ("–" for NaN, no ± for one seed or no spread; the sd in ``fmt``
    where it has a thousands separator, else to two significant digits)."""
    if mean != mean:  # NaN: no value
        return "–"
    sd_text = fmt.format(sd) if "," in fmt else f"{sd:.2g}"
    return fmt.format(mean) + (f" ± {sd_text}" if n > 1 and sd == sd and sd > 0 else "")


def pm(key: str, fmt: str = "{:.4g}", statuses: tuple[str, ...] = FINISHED_STATUSES) -> Cell:
    """Cell: mean ± std over the group's seeds of ``key``."""
    return lambda g: fmt_pm(g.agg(key, statuses), fmt)


def mib(key: str) -> Cell:
    """Cell: mean over the group's seeds of a byte count, in MiB."""
    return lambda g: fmt_mib(g.mean(key))


SIZE = Column("size", lambda g: g.size)
OPTIMIZER = Column("optimizer", lambda g: g.optimizer)


# ------------------------------------------------------------------------------------ cells several tables share
def wall_note(g: Group, key: str) -> str:
    """The wall-clock warning of hf_optbench.report.noise beside a figure of a non-baseline optimizer."""
    from hf_optbench.report.noise import by_seed, wallclock_note

    if g.optimizer == BASELINE:
        return ""
    note = wallclock_note(by_seed(g.runs(), key, g.optimizer, g.size), by_seed(
        [r for r in g.an.ok() if r.optimizer == BASELINE], key, BASELINE, g.size))  # by_seed: by cell
    return f" {note}" if note else ""


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
