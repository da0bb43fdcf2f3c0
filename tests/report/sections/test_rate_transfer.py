"""Issue 40's rate transfer: a borrowed rate is read on the cell's own tuning curve (on the grid, interpolated in
log-rate, or not measured beyond it or next to a divergence), and the short report's line says each optimizer's worst
cost."""

from __future__ import annotations

import math

import pytest

from hf_optbench.report.sections.rate_transfer import RATIO, SIZE, Cost, Row, curve_loss, transfer_line

from fixtures.study_fixture import curve

RATES = (1e-3, 2e-3, 4e-3, 8e-3)


def test_a_rate_is_read_on_the_grid_between_its_points_or_not_at_all() -> None:
    c = curve(4e-3, RATES, depth=0.02)  # 3.0 at 4e-3, +0.02 per squared factor of 2
    assert curve_loss(c, 2e-3) == (pytest.approx(3.02), "on the grid")
    loss, how = curve_loss(c, 2e-3 * math.sqrt(2))  # half-way in log-rate between 2e-3 and 4e-3
    assert how == "interpolated in log-rate" and loss == pytest.approx(3.01)
    assert curve_loss(c, 1.6e-2) == (None, "beyond the grid 0.001-0.008")
    c[0]["tuning_loss"] = None  # 1e-3 diverged
    assert curve_loss(c, 1e-3) == (math.inf, "on the grid")
    assert curve_loss(c, 1.5e-3) == (None, "next to a rate that diverged")
    assert curve_loss([], 1e-3) == (None, "no curve")


def test_the_line_says_within_the_margin_or_the_worst_cost() -> None:
    rows = [Row("muon", "mini", 8e-3, {SIZE: Cost("tiny", 8e-3, 0.0, "on the grid", 1.0)}),
            Row("lion", "mini", 1e-3, {SIZE: Cost("tiny", 2e-3, 0.03, "on the grid", 0.9),
                                         RATIO: Cost("mini @ 1", 1e-3, 0.004, "interpolated in log-rate", 0.99)}),
            Row("sgd", "mini", 1e-3, {SIZE: Cost("tiny", 4e-2, math.inf, "on the grid")}),
            Row("adafactor", "mini", 1e-3, {SIZE: Cost("tiny", 4e-2, None, "beyond the grid")})]
    line = transfer_line(rows)
    assert "muon's rate transfers across sizes within 0 nats" in line
    assert "lion's rate costs up to 0.03 nats across sizes (speedup x0.9 at tiny's rate) and transfers across data " \
           "ratios within 0.004 nats" in line
    assert "sgd's rate diverges at 1 of 1 cell(s) across sizes" in line and "adafactor" not in line
    assert rows[3].costs[SIZE].text() == "0.04: not measured (beyond the grid)"
    assert rows[2].costs[SIZE].text() == "0.04: diverged on this cell's grid"
    assert rows[1].costs[RATIO].text() == "0.001: +0.004 nats, speedup x0.99 (interpolated in log-rate)"
    assert transfer_line([]).startswith("Rate transfer: not measured")
