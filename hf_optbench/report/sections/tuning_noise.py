"""The second tuning draw in the report: each drawn cell's comparison composed again from the draw, the
shift it makes in every optimizer's estimate, and the verdict's intervals widened by it
(:mod:`hf_optbench.measure.tuning_noise` holds the rule).

The draw (``study.second_draw_phase``) reran only the comparison and ladder runs whose tuned values it changed; the
others would repeat the main runs exactly, so each drawn cell's second comparison is the main cell's runs with the
draw's runs in their place (same ids, same seeds). Each cell's speedups are read again off that composition's own
ladders (the baseline's rungs may have moved too), and both comparisons are estimated the same way (the verdict's
estimate at one size: the mean paired gap, or the censored-normal one): the shift is the second's gap minus the
first's, on the verdict's scale (minus the log speedup; the final-loss difference in nats).

Which shift a verdict point gets: its own cell's where that cell was drawn (measured); else the largest shift of a
drawn cell of the same size and optimizer (borrowed: the tuning's noise at that size, the point says from where);
else none (not measured: the interval stands, and the table says so).

The section whole lives here: the shifts (:func:`apply_tuning_noise`), evidence.md's section
(:func:`noise_section`) and report.md's line (:func:`tuning_noise_line`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.measure.tuning_noise import PointShift, widen_verdict
from hf_optbench.rundir import FINISHED_STATUSES
from hf_optbench.study.records import Cell, RunRecord, set_columns

# The metrics the draw's shift is measured on (the convergence answer: the speedup and the final loss behind it).
SHIFT_KEYS = ("speedup", "final_eval_loss")
LABELS = {"speedup": "speedup", "final_eval_loss": "final eval loss"}


@dataclass(frozen=True)
class CellShift:
    """One optimizer's estimate at one drawn cell, from the main comparison and from the draw's (gaps on the
    verdict's scale), and the shift between them."""

    optimizer: str
    key: str
    cell: str
    main: Any  # measure.verdict.SizeComparison
    draw: Any

    @property
    def shift(self) -> float | None:
        """The draw's gap minus the main one's; None where either is a bound (every pair censored one way)."""
        if self.main.bounded is not None or self.draw.bounded is not None:
            return None
        return self.draw.gap - self.main.gap


@dataclass(frozen=True)
class Applied:
    """One verdict point's shift as applied: where the shift came from (its own cell, or the drawn cell it was
    borrowed from) and what the rule did."""

    optimizer: str
    key: str
    along: str
    cell: str
    source: str  # the drawn cell whose shift this is
    point: PointShift
    word_before: str
    word_after: str


@dataclass
class TuningNoise:
    """What the report says of the second draw."""

    seed: int
    tuning_seeds: list[int]
    cells: list[str]
    changes: list[dict[str, Any]]
    shifts: dict[tuple[str, str, str], CellShift] = field(default_factory=dict)  # (optimizer, key, cell)
    applied: list[Applied] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # drawn cells whose draw has not finished

    def shift(self, optimizer: str, key: str, cell: str) -> float | None:
        found = self.shifts.get((optimizer, key, cell))
        return found.shift if found is not None else None


@dataclass
class _Scratch:
    """What ``report.speedups.derive_speedups`` reads of an analysis: one cell's runs."""

    records: list[RunRecord]
    ladder: list[RunRecord]
    attribution: list[RunRecord] = field(default_factory=list)
    ladder_fits: dict[Any, Any] = field(default_factory=dict)

    def set_columns(self, records: Iterable[RunRecord], columns: Callable[[RunRecord], Mapping[str, Any]]) -> None:
        set_columns((self.records, self.ladder, self.attribution), records, columns)


def read_changes(sweep_dir: Any) -> dict[str, Any] | None:
    """The draw's record (``study.second_draw_phase.CHANGES_FILE``), or None where the sweep has none."""
    from hf_optbench.study.second_draw_phase import CHANGES_FILE, draw_dir

    path = draw_dir(sweep_dir) / CHANGES_FILE if sweep_dir is not None else None
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) and data.get("schema") == 1 else None


def _estimates(records: Sequence[Mapping[str, Any]], baseline: str) -> dict[tuple[str, str], Any]:
    """{(optimizer, key): the cell's point} of one cell's comparison, estimated as the verdict estimates a size."""
    from hf_optbench.measure.verdict import METRICS, verdict

    specs = tuple(m for m in METRICS if m.key in SHIFT_KEYS)
    out = {}
    for v in verdict(list(records), baseline=baseline, metrics=specs):
        if v.points:
            out[(v.optimizer, v.metric.key)] = v.points[-1]
    return out


def _compared(runs: Sequence[RunRecord], baseline: str) -> list[RunRecord]:
    """One cell's finished runs with their speedups read off that cell's ladders."""
    from hf_optbench.report.speedups import derive_speedups

    # as report.analysis does: a diverged run's last loss is no result
    mine = [r.with_columns({"final_eval_loss": None}) if r.status == "diverged" else r
            for r in runs if r.status in FINISHED_STATUSES]
    rung = [r.budget_multiple not in (None, 1.0) for r in mine]
    scratch = _Scratch([r for r, x in zip(mine, rung, strict=True) if not x],
                       [r for r, x in zip(mine, rung, strict=True) if x])
    derive_speedups(scratch, baseline)
    return scratch.records


def measure_draw(an: Any, baseline: str) -> TuningNoise | None:
    """The draw's shift at every drawn cell of ``an`` (an ``report.analysis.Analysis``), or None without a draw."""
    from hf_optbench.study.records import load_records
    from hf_optbench.study.second_draw_phase import draw_dir

    changes = read_changes(an.sweep_dir)
    if changes is None:
        return None
    cells = [Cell(c["model_size"], c.get("tokens_per_param")).label for c in changes.get("cells", [])]
    noise = TuningNoise(int(changes["seed"]), list(changes.get("tuning_seeds") or []), cells,
                        list(changes.get("changed") or []))
    runs_dir = draw_dir(an.sweep_dir) / "runs"
    again = {r.run_id: r for r in load_records(draw_dir(an.sweep_dir))} if runs_dir.is_dir() else {}
    expected = {rid for c in noise.changes for rid in c.get("runs", [])}
    unfinished = {rid for rid in expected if rid not in again or again[rid].status not in FINISHED_STATUSES}
    for cell in cells:
        main = [r for r in an.records + an.ladder if r.cell.label == cell]
        if any(r.run_id in unfinished for r in main):
            noise.missing.append(cell)
            continue
        first = _estimates(_compared(main, baseline), baseline)
        second = _estimates(_compared([again[r.run_id] if r.run_id in expected else r for r in main], baseline),
                            baseline)
        for (opt, key), p in first.items():
            if (opt, key) in second:
                noise.shifts[(opt, key, cell)] = CellShift(opt, key, cell, p, second[(opt, key)])
    return noise


def _borrowed(noise: TuningNoise, an: Any, optimizer: str, key: str, cell: str) -> tuple[float | None, str]:
    """(shift, the drawn cell it is from) for a verdict point at ``cell``: its own, else the largest of a drawn cell
    of the same size (module doc), else (None, "")."""
    own = noise.shift(optimizer, key, cell)
    if own is not None:
        return own, cell
    size = an.cell_size.get(cell, cell)
    found = [(abs(s), s, c) for c in noise.cells if an.cell_size.get(c, c) == size
             and (s := noise.shift(optimizer, key, c)) is not None]
    if not found:
        return None, ""
    _, shift, source = max(found)
    return shift, source


def point_cell(an: Any, v: Any, p: Any) -> str:
    """The label of the cell (``study.records.Cell``) a verdict point stands for: on the data axis the verdict's size
    at the point's ratio (its ``num_params`` holds tokens per parameter), on the size axis the point's size at the
    verdict's ratio."""
    from hf_optbench.measure.verdict import DATA_AXIS, ratio_label

    if v.axis == DATA_AXIS:
        return Cell(v.at, float(p.num_params)).label
    tpp = next((r for r in an.ratios if ratio_label(r) == v.at), None)
    return Cell(p.model_size, tpp).label


def apply_tuning_noise(an: Any, baseline: str) -> TuningNoise | None:
    """Measure the draw (:func:`measure_draw`) and replace every speedup and final-loss verdict of ``an`` by its widened
    form (``measure.tuning_noise.widen_verdict``); the record of what was applied. None (nothing changed) without a
    draw."""
    noise = measure_draw(an, baseline)
    if noise is None or not noise.shifts:
        return noise
    out = []
    for v in an.verdicts:
        if v.metric.key not in SHIFT_KEYS or not v.points:
            out.append(v)
            continue
        sources = {p.model_size: _borrowed(noise, an, v.optimizer, v.metric.key, point_cell(an, v, p))
                   for p in v.points}
        new, records = widen_verdict(v, {label: s for label, (s, _) in sources.items()})
        cells = {p.model_size: point_cell(an, v, p) for p in v.points}
        along = v.axis + (f", at {v.at}" if v.at else "")  # as report.sections.verdict.along writes it
        noise.applied += [Applied(v.optimizer, v.metric.key, along, cells[r.label], sources[r.label][1], r,
                                  v.word, new.word) for r in records]
        out.append(new)
    an.verdicts = out
    return noise


# --------------------------------------------------------------------------------------------------- text
def shift_text(key: str, shift: float | None) -> str:
    """"x0.93" (the draw's speedup over the main one's) or "+0.006 nats"; "n/a" for a bound."""
    if shift is None or not math.isfinite(shift):
        return "n/a"
    return f"x{math.exp(-shift):.3g}" if key == "speedup" else f"{shift:+.3g} nats"


def beside(noise: TuningNoise | None, an: Any, optimizer: str, key: str, cell: str) -> str:
    """What the interval of ``optimizer`` at ``cell`` shows of the draw: "draw x0.93" (its own cell), "draw x0.93 from
    tiny @ 0.15 tok/param" (borrowed), "draw: not measured" (none), "" without a draw."""
    if noise is None:
        return ""
    shift, source = _borrowed(noise, an, optimizer, key, cell)
    if shift is None:
        return "draw: not measured"
    widened = any(a.cell == cell and a.optimizer == optimizer and a.key == key and a.point.widened
                  for a in noise.applied)
    where = "" if source == cell else f" from {source}"
    return f"draw {shift_text(key, shift)}{where}{', widened' if widened else ''}"


def _estimate_text(p: Any, key: str) -> str:
    if key == "speedup":
        return f"{p.bound_sign()}{p.ratio():.3g}"
    return f"{p.bound_sign()}{p.gap:+.3g}"


def noise_section(doc: Any, an: Any) -> None:
    """The evidence file's "Tuning noise" section (``doc``: report.build.Doc): the picks the draw changed, the
    shift at each drawn cell, and each interval's shift against its half-width (module doc; docs/METHOD.md)."""
    from hf_optbench.measure.tuning_noise import NEGLIGIBLE_SHARE
    from hf_optbench.study.second_draw_phase import change_lines

    noise: TuningNoise | None = an.tuning_noise
    doc.h(2, "Tuning noise: a second tuning draw")
    if noise is None:
        doc.p("Not measured: this sweep tuned at one seed, and its intervals cover the compared seeds only, not the draw "
              "of the tuning that picked each optimizer's values. `tune.second_draw` in the sweep file tunes chosen "
              "cells again at another seed and this section states the shift (docs/METHOD.md).")
        return
    doc.p(f"Cells tuned again at seed {noise.seed} (the main tuning: seed(s) "
          f"{', '.join(map(str, noise.tuning_seeds))}), the whole protocol; the comparison runs whose tuned values "
          "changed ran again under their own seeds, the others are the main runs (same values, same seed: the same "
          f"run). Drawn: {', '.join(noise.cells)}." + (f" Not finished: {', '.join(noise.missing)}." if noise.missing
                                                      else ""))
    changes = change_lines(noise.changes)
    doc.p("Picks the draw changed: " + ("; ".join(changes) if changes else "none (every shift below is exactly 0)")
          + ".")
    rows = [[s.optimizer, s.cell, LABELS[s.key], _estimate_text(s.main, s.key), _estimate_text(s.draw, s.key),
             shift_text(s.key, s.shift)] for s in noise.shifts.values()]
    if rows:
        doc.table(["optimizer", "cell", "metric", "main tuning", "second draw", "shift"], rows)
    applied = [[a.optimizer, LABELS[a.key], a.along, a.cell, a.source if a.source != a.cell else "this cell",
                shift_text(a.key, a.point.shift), f"{a.point.half_width:.3g}", f"{a.point.share:.2f}",
                "widened" + ("" if a.word_before == a.word_after else f": {a.word_before} → {a.word_after}")
                if a.point.widened else "stands"] for a in noise.applied]
    if applied:
        doc.p(f"Each verdict point's shift (on the verdict's scale: minus the log speedup, nats of final loss) against "
              f"its interval's half-width: over {NEGLIGIBLE_SHARE:.2f} of it, the interval is widened by the shift on "
              "both sides and the verdict taken again at the widened interval (hf_optbench/measure/tuning_noise.py). "
              "A cell not drawn borrows the largest shift of a drawn cell of its size (\"from\").")
        doc.table(["optimizer", "metric", "along", "point", "shift from", "shift", "half-width", "share",
                   "interval"], applied)


def _shift_summary(noise: Any, key: str) -> str:
    found = [(abs(s.shift), s) for s in noise.shifts.values() if s.key == key and s.shift is not None]
    if not found:
        return "none measured"
    nonzero = [s for m, s in found if m > 0]
    if not nonzero:
        return "exactly 0 in every drawn cell"
    return ", ".join(f"{s.optimizer} {shift_text(key, s.shift)} at {s.cell}" for s in nonzero)


def tuning_noise_line(an: Any) -> str:
    """report.md's line on the tuning noise: what the second tuning draw moved: the picks, the speedup and final-loss estimates, the intervals and words."""
    from hf_optbench.study.second_draw_phase import change_lines

    noise = an.tuning_noise
    if noise is None:
        return ("Tuning noise: not measured. These intervals cover the compared seeds, not the tuning draw that picked "
                "each optimizer's values (`tune.second_draw` in the sweep file measures it; docs/METHOD.md).")
    text = (f"Tuning noise: {', '.join(noise.cells)} tuned again at seed {noise.seed} (the main tuning: seed(s) "
            f"{', '.join(map(str, noise.tuning_seeds))}). ")
    if noise.missing:
        return text + f"The draw has not finished at {', '.join(noise.missing)}: no shift stated."
    changes = change_lines(noise.changes)
    text += (f"Picks changed: {'; '.join(changes)}. " if changes else
             "No pick changed: every shift is exactly 0 (the runs are the same runs). ")
    text += (f"Shift of the speedup: {_shift_summary(noise, 'speedup')}; of the final-loss gap: "
             f"{_shift_summary(noise, 'final_eval_loss')}. ")
    widened = [a for a in noise.applied if a.point.widened]
    words = {(a.optimizer, a.key, a.along): (a.word_before, a.word_after) for a in noise.applied
             if a.word_before != a.word_after}
    text += (f"{len(widened)} of {len(noise.applied)} intervals with a shift were widened by it (shift over a third "
             "of the half-width; cells not drawn borrow their size's drawn shift)")
    if words:
        text += "; verdicts taken again: " + "; ".join(f"{o} {LABELS[k]} along {a}: {b} → {w}"
                                                       for (o, k, a), (b, w) in words.items())
    return text + "."
