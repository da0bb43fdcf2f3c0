"""Time to quality: each optimizer's speedup in wall-clock time on the machine the sweep ran on, from its
speedup in tokens and a step-time calibration measured alone.

Why not the runs' own seconds: a sweep runs two (or more) runs at once, so the compared runs' step times hold the
other run's load; their seconds keep "not measurable here" (``report.noise``). At the end of a sweep an interleaved
calibration (one optimizer at a time, rounds in turn, a few dozen steps at each compared shape; more rounds while a
ratio is not stable) writes ``<sweep_dir>/step_calibration.json`` (``study.calibration`` has the schema).

The rule: at a cell, an optimizer's speedup in time is its speedup in tokens (the verdict's point: the same tokens
in fewer steps' worth of the baseline's data) divided by its step-time ratio to the baseline at the same shape, the
ratio paired by round with its interval from the rounds' pooled spread (:mod:`hf_optbench.measure.step_ratio`).
The interval: the token speedup's interval (at its verdict cell's level, widened where the tuning draw widened it)
divided by the ratio's interval (the ratio's high end against the token interval's low end, and the other way
round): interval arithmetic, so the time interval covers at least what both cover. A ratio not within the stated
tolerance after the calibration's last round is marked unstable beside its interval.

A Muon ratio is refused where the calibration timed another Newton-Schulz precision than the compared runs recorded
(``hyperparameters.ns_precision`` of their summary.json): that is another optimizer's step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.measure.step_ratio import LEVEL, TOLERANCE, StepRatio, step_ratios
from hf_optbench.rundir import BASELINE

CALIBRATION_FILE = "step_calibration.json"
MACHINE_KEYS = ("cpu_model", "cpu_capability", "bf16_native", "torch", "device", "threads")
ENTRY_KEYS = ("optimizer", "model_size", "tokens_per_step", "ns_precision", "step_time_median_s",
              "step_time_round_medians_s", "spread")
HOW_TO = ("no step calibration in this sweep directory ({file}): the speedup in time needs each optimizer's step "
          "time measured alone, one run at a time. `hf-optbench sweep` writes it at the end of a sweep (an interleaved "
          "calibration of every compared optimizer x size); run the sweep file again to get one (its finished runs "
          "are kept)")


@dataclass(frozen=True)
class StepTime:
    """One optimizer x size's calibrated step time: the median over every round, the range of round medians and the
    round medians themselves, in round order (what the ratios pair)."""

    optimizer: str
    model_size: str
    tokens_per_step: int
    median: float
    low: float
    high: float
    ns_precision: str | None
    rounds: tuple[float, ...] = ()


@dataclass(frozen=True)
class Calibration:
    machine: dict[str, Any]
    measured_at: str
    rounds: int
    steps_per_round: int
    steps: dict[tuple[str, str], StepTime]
    first_rounds: int = 0  # 0: a file from before rounds were added (its rounds were all it measured)

    def machine_text(self) -> str:
        m = self.machine
        more = (f" (first {self.first_rounds}, up to {2 * self.first_rounds} while a ratio was unstable)"
                if self.first_rounds else "")
        return (f"{m['cpu_model']} ({m['cpu_capability']}, bf16 {'native' if m['bf16_native'] else 'not native'}), "
                f"device {m['device']}, {m['threads']} thread(s), torch {m['torch']}; measured {self.measured_at}, "
                f"{self.rounds} interleaved rounds of {self.steps_per_round} steps{more}")


def _entry(e: Any) -> StepTime:
    if not isinstance(e, Mapping) or any(k not in e for k in ENTRY_KEYS):
        raise ValueError(f"an entry lacks {[k for k in ENTRY_KEYS if not isinstance(e, Mapping) or k not in e]}")
    low, high = (float(x) for x in e["spread"])
    median = float(e["step_time_median_s"])
    if not 0 < low <= median <= high or not math.isfinite(high):
        raise ValueError(f"{e['optimizer']}/{e['model_size']}: spread {e['spread']} does not hold the median "
                         f"{median} (positive step times)")
    rounds = tuple(float(x) for x in e["step_time_round_medians_s"])
    if not all(0 < x < math.inf for x in rounds):
        raise ValueError(f"{e['optimizer']}/{e['model_size']}: round medians {e['step_time_round_medians_s']} are not "
                         "positive step times")
    return StepTime(str(e["optimizer"]), str(e["model_size"]), int(e["tokens_per_step"]), median, low, high,
                    None if e["ns_precision"] is None else str(e["ns_precision"]), rounds)


def read_calibration(sweep_dir: Any) -> tuple[Calibration | None, str]:
    """(the calibration, "") or (None, why there is none: missing or unreadable, with how to get one)."""
    if sweep_dir is None:
        return None, HOW_TO.format(file=CALIBRATION_FILE)
    path = Path(sweep_dir) / CALIBRATION_FILE
    if not path.is_file():
        return None, HOW_TO.format(file=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != 1:
            raise ValueError(f"schema {data.get('schema') if isinstance(data, dict) else None!r}, expected 1")
        machine = data["machine"]
        if not isinstance(machine, dict) or any(k not in machine for k in MACHINE_KEYS):
            raise ValueError(f"machine must hold {', '.join(MACHINE_KEYS)}")
        steps = {(s.optimizer, s.model_size): s for s in map(_entry, data["entries"])}
        return Calibration(machine, str(data["measured_at"]), int(data["rounds"]), int(data["steps_per_round"]),
                           steps, int(data.get("first_rounds") or 0)), ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{path} could not be read ({exc}): no speedup in time"


def step_ratio(cal: Calibration, optimizer: str, size: str, tokens_per_step: int | None,
               baseline: str = BASELINE, ns_precision: str | None = None) -> tuple[StepRatio | None, str]:
    """(the ratio, "") or (None, why not): both calibrated, at the compared runs' tokens per step, Newton-Schulz in
    the runs' recorded precision (``ns_precision``, None: not recorded), paired by round over every optimizer
    calibrated at that shape (:func:`hf_optbench.measure.step_ratio.step_ratios`)."""
    mine, base = cal.steps.get((optimizer, size)), cal.steps.get((baseline, size))
    if mine is None or base is None:
        return None, f"not calibrated ({optimizer if mine is None else baseline} at {size})"
    if mine.tokens_per_step != base.tokens_per_step or tokens_per_step not in (None, mine.tokens_per_step):
        return None, (f"calibrated at {mine.tokens_per_step} tokens/step, compared at {tokens_per_step}: another "
                      "shape")
    if ns_precision is not None and mine.ns_precision not in (None, ns_precision):
        return None, f"calibrated with Newton-Schulz in {mine.ns_precision}, the runs trained in {ns_precision}"
    shape = {s.optimizer: s.rounds for (_, sz), s in cal.steps.items()
             if sz == size and s.tokens_per_step == base.tokens_per_step and len(s.rounds) == len(base.rounds)}
    ratio = step_ratios(shape, baseline).get(optimizer)
    if ratio is None or not math.isfinite(ratio.high):
        return None, f"{len(base.rounds)} round(s) of {optimizer} and {baseline} paired: no spread"
    return ratio, ""


def time_speedup(p: Any, r: StepRatio) -> tuple[float, float, float, str]:
    """(speedup in time, its interval's low, high, stance) from a token speedup point ``p`` (a
    ``measure.verdict.SizeComparison`` of the speedup) and a step-time ratio ``r`` (module doc)."""
    from hf_optbench.measure.verdict import SPEEDUP_MARGIN, stance

    low, high = p.interval()
    value, t_low, t_high = p.ratio() / r.value, low / r.high, high / r.low
    return value, t_low, t_high, stance(-math.log(t_high), -math.log(t_low), SPEEDUP_MARGIN)


def _tokens_per_step(an: Any, size: str) -> int | None:
    found = [r.summary.get("tokens_per_step") for r in an.ok() if r.model_size == size]
    return next((int(t) for t in found if t), None)


def _ratio(an: Any, cal: Calibration, optimizer: str, size: str) -> tuple[StepRatio | None, str]:
    """:func:`step_ratio` at the compared runs' shape and Newton-Schulz precision (a finished run's record)."""
    from hf_optbench.study.calibration import recorded_ns_precision

    found = (recorded_ns_precision(r.summary) for r in an.ok() if r.model_size == size and r.optimizer == optimizer)
    return step_ratio(cal, optimizer, size, _tokens_per_step(an, size),
                      ns_precision=next((ns for ns in found if ns), None))


def spread_text() -> str:
    """The sentence that states the ratio's spread and tolerance."""
    return (f"The step-time ratio is the geometric mean of each round's ratio (both measured alone in the same round); "
            f"its interval is Student-t's at {1 - LEVEL:.0%} over the rounds, with the round-to-round spread pooled "
            f"over every optimizer at the shape (hf_optbench/measure/step_ratio.py). Stable: within ±{TOLERANCE:.0%} "
            "of the ratio; a ratio still outside it after the calibration's last round is marked unstable.")


def step_table(an: Any, cal: Calibration) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per optimizer and size, the calibrated step time, its ratio to the baseline's, Muon's NS
    precision."""
    header = ["optimizer", "size", "tokens / step", "median step (ms) [round range]",
              f"step time / {BASELINE}'s [{1 - LEVEL:.0%} interval]", "Newton-Schulz precision"]
    rows = []
    for size in an.model_sizes:
        for opt in an.optimizers:
            s = cal.steps.get((opt, size))
            if s is None:
                continue
            r, why = _ratio(an, cal, opt, size)
            ratio = why or ("1 (the reference)" if opt == BASELINE else r.text() if r is not None else "–")
            rows.append([opt, size, str(s.tokens_per_step), f"{1e3 * s.median:.3g} [{1e3 * s.low:.3g}, "
                         f"{1e3 * s.high:.3g}]", ratio, s.ns_precision or "–"])
    return header, rows


def time_rows(an: Any, cal: Calibration) -> list[list[str]]:
    """Per optimizer (not the baseline) and cell: the token speedup, the step-time ratio, the speedup in time."""
    rows = []
    for opt in (o for o in an.optimizers if o != BASELINE):
        for cell in an.sizes:
            p = an.point(opt, "speedup", cell)[1]
            if p is None:
                continue
            r, why = _ratio(an, cal, opt, an.cell_size.get(cell, cell))
            low, high = p.interval()
            token = f"{p.bound_sign()}{p.ratio():.3g} [{low:.3g}, {high:.3g}]"
            if r is None:
                rows.append([opt, cell, token, why, "–"])
                continue
            value, t_low, t_high, where = time_speedup(p, r)
            rows.append([opt, cell, token, r.text(),
                         f"{p.bound_sign()}{value:.3g} [{t_low:.3g}, {t_high:.3g}] {where}"])
    return rows


def time_section(doc: Any, an: Any) -> None:
    """The evidence file's "Time to quality" section (``doc``: report.build.Doc)."""
    doc.h(2, f"Time to quality: the speedup over {BASELINE} in wall-clock time")
    cal, why = read_calibration(an.sweep_dir)
    if cal is None:
        doc.p(f"Not measured: {why}.")
        return
    doc.p(f"Step times measured alone after the sweep on {cal.machine_text()}. Speedup in time = the speedup in "
          f"tokens ÷ the step-time ratio to {BASELINE} at the same shape; its interval is the token speedup's interval "
          "(at its verdict cell's level, as the answer table's) divided by the ratio's interval (interval "
          f"arithmetic). {spread_text()} The compared runs' own seconds were measured while runs shared the "
          "machine: they keep \"not measurable here\".")
    doc.table(*step_table(an, cal))
    rows = time_rows(an, cal)
    if rows:
        doc.table(["optimizer", "cell", "speedup in tokens [interval]", f"step-time ratio [{1 - LEVEL:.0%} interval]",
                   "speedup in time [interval] stance"], rows)


def time_line(an: Any) -> str:
    """The short report's line: per optimizer, its speedup in time over the cells, the machine named."""
    cal, why = read_calibration(an.sweep_dir)
    if cal is None:
        return f"Speedup in time: not measured ({why})."
    parts = []
    for opt in (o for o in an.optimizers if o != BASELINE):
        found: list[tuple[float, str]] = []
        steps: dict[str, StepRatio] = {}
        for cell in an.sizes:
            p = an.point(opt, "speedup", cell)[1]
            size = an.cell_size.get(cell, cell)
            r = _ratio(an, cal, opt, size)[0]
            if p is not None and r is not None:
                found.append((time_speedup(p, r)[0], cell))
                steps[size] = r
        if found:
            lo, hi = min(found), max(found)
            ns = next((s.ns_precision for (o, _), s in cal.steps.items() if o == opt and s.ns_precision), None)
            per_size = ", ".join(f"x{r.value:.3g}{'' if r.stable else ' (unstable)'} at {size}"
                                 for size, r in steps.items())
            parts.append(f"{opt} {lo[0]:.3g}x ({lo[1]}) to {hi[0]:.3g}x ({hi[1]}), its step time {per_size} of "
                         f"{BASELINE}'s" + (f", Newton-Schulz in {ns}" if ns else ""))
    if not parts:
        return "Speedup in time: no optimizer has both a token speedup and a calibrated step time."
    return (f"Speedup in time (speedup in tokens ÷ step-time ratio, step times measured alone on "
            f"{cal.machine['cpu_model']}, {cal.machine['device']}): " + "; ".join(parts) + ".")
