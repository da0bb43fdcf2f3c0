"""Issue 40's report on a study-like sweep (3 optimizers x 2 sizes x 3 data ratios x 3 seeds, AdamW's ladder, tuned
files with curves, a second tuning draw that moved Muon's pick at one cell, a step-time calibration): report.md opens
with the answer and fits a page, evidence.md holds the rest, every table stays under 10 columns and 120 characters a
cell, and the tuning-noise, time and rate-transfer answers come out as constructed."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hf_optbench.measure.step_ratio import step_ratios
from hf_optbench.report.build import MAX_CELL, MAX_COLUMNS, build_report

from fixtures.study_fixture import (
    add_calibration,
    add_second_draw,
    add_tuned_files,
    grid_sweep,
    round_medians,
)

SPEEDUPS = {1.0: {"lion": 1.0, "muon": 2.0}, 2.0: {"lion": 1.0, "muon": 2.0}, 4.0: {"lion": 1.0, "muon": 2.0}}
# tuned rates: AdamW's the same everywhere; Muon's falls with data; Lion's halves from tiny to mini
BEST = {**{("adamw", s, t): 4e-3 for s in ("tiny", "mini") for t in (1.0, 2.0, 4.0)},
        **{("muon", s, t): {1.0: 1.6e-2, 2.0: 8e-3, 4.0: 4e-3}[t] for s in ("tiny", "mini") for t in (1.0, 2.0, 4.0)},
        **{("lion", s, t): {"tiny": 2e-3, "mini": 1e-3}[s] for s in ("tiny", "mini") for t in (1.0, 2.0, 4.0)}}
STEP_MS = {("adamw", "tiny"): 10.0, ("lion", "tiny"): 10.0, ("muon", "tiny"): 18.0,
           ("adamw", "mini"): 20.0, ("lion", "mini"): 21.0, ("muon", "mini"): 40.0}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from hf_optbench.report.sections import regime as reference

    tmp = tmp_path_factory.mktemp("study")
    root = grid_sweep(tmp, SPEEDUPS)
    add_tuned_files(root, BEST)
    add_second_draw(root, ("tiny", 1.0), "muon", loss_shift=0.02)
    add_calibration(root, STEP_MS)
    with pytest.MonkeyPatch.context() as mp:
        blocks = np.array([[0, 1, 2, 3, 1, 2, 3, 0]] * 8)
        mp.setattr(reference, "splits", lambda rec: (blocks, blocks, 4))
        files = build_report(root)
    return {name: path.read_text(encoding="utf-8") for name, path in files.items()
            if name in ("report.md", "evidence.md", "report.html")}


def tables(markdown: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table: (header, rows), cells split on unescaped pipes."""
    out: list[tuple[list[str], list[list[str]]]] = []
    block: list[list[str]] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                block.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif block:
            out.append((block[0], block[1:]))
            block = []
    return out


@pytest.mark.slow  # a whole report (162 runs): ~15 s
def test_report_md_opens_with_the_answer_and_fits_a_page(study: dict[str, str]) -> None:
    md = study["report.md"]
    lines = md.splitlines()
    assert len(lines) <= 150, len(lines)
    assert lines[0] == "# Optimizer benchmark report: sweep" and lines[2].startswith("**The question:**")
    heads = [line for line in lines if line.startswith("## ")]
    assert heads == ["## The answer: speedup over tuned adamw"]
    (header, rows), *rest = tables(md)
    assert header == ["optimizer", "size", "1 tok/param", "2 tok/param", "4 tok/param", "verdict along data"]
    assert [r[:2] for r in rows] == [["lion", "tiny"], ["muon", "tiny"], ["lion", "mini"], ["muon", "mini"]]
    assert rest and rest[0][0][0] == "optimizer" and rest[0][0][1] == "along size at 1 tok/param"
    for start in ("Regime: adamw ends below the bigram reference (", "Tuning noise: tiny @ 1 tok/param tuned again at seed 6",
                  "Speedup in time (speedup in tokens ÷ step-time ratio, step times measured alone on Fixture CPU 9000",
                  "Rate transfer (the learning rate tuned at the next smaller size or data ratio"):
        assert any(line.startswith(start) for line in lines), start
    assert md.count("![") == 1 and "![data axis](data_axis.png)" in md and "[evidence.md](evidence.md)" in md


@pytest.mark.slow
def test_every_table_of_both_files_stays_narrow_and_short(study: dict[str, str]) -> None:
    for name in ("report.md", "evidence.md"):
        found = tables(study[name])
        assert found, name
        for header, rows in found:
            assert len(header) <= MAX_COLUMNS, (name, header)
            for row in rows:
                assert len(row) == len(header), (name, header, row)
                assert all(len(cell) <= MAX_CELL for cell in row), (name, max(row, key=len))
    html = study["report.html"]
    assert html.count("<details>") >= 10 and "Tuning noise: a second tuning draw" in html
    assert "The answer: speedup over tuned adamw" in html.split("<details>")[0]


@pytest.mark.slow
def test_the_tuning_draws_shift_stands_beside_each_interval_and_widens_it(study: dict[str, str]) -> None:
    md = study["report.md"]
    (_, rows), *_ = tables(md)
    muon_tiny = next(r for r in rows if r[:2] == ["muon", "tiny"])
    lion_tiny = next(r for r in rows if r[:2] == ["lion", "tiny"])
    lion_mini = next(r for r in rows if r[:2] == ["lion", "mini"])
    # Muon's pick moved at tiny @ 1: its runs ended 0.02 nats higher, so its speedup fell, and the interval widened
    shift = float(re.search(r"draw x([\d.]+), widened", muon_tiny[2]).group(1))
    assert 0.85 < shift < 0.97
    assert re.search(r"draw x[\d.]+ from tiny @ 1 tok/param", muon_tiny[3])  # tiny's other ratios borrow it
    # Lion's pick held: its runs are the main runs, the shift exactly 0; mini was not drawn
    assert lion_tiny[2].endswith("; draw x1")
    assert lion_mini[2].endswith("; draw: not measured")
    line = next(x for x in md.splitlines() if x.startswith("Tuning noise:"))
    assert "Picks changed: muon/tiny at 1 tokens/param: learning_rate 0.004 -> 0.002." in line
    assert re.search(r"Shift of the speedup: muon x0\.\d+ at tiny @ 1 tok/param;", line)
    assert re.search(r"of the final-loss gap: muon \+0\.02\d* nats at tiny @ 1 tok/param", line)
    evidence = study["evidence.md"]
    section = evidence.split("## Tuning noise: a second tuning draw")[1].split("\n## ")[0]
    assert "| muon | tiny @ 1 tok/param | speedup |" in section and "| lion | tiny @ 1 tok/param | speedup |" in section
    assert re.search(r"\| muon \| speedup \| data, at tiny \| tiny @ 1 tok/param \| this cell \| x0\.\d+ \|", section)


@pytest.mark.slow
def test_time_to_quality_divides_the_token_speedup_by_the_step_time_ratio(study: dict[str, str]) -> None:
    section = study["evidence.md"].split("## Time to quality")[1].split("\n## ")[0]
    assert "Fixture CPU 9000 (AVX512, bf16 not native), device cpu, 1 thread(s), torch 2.13.0+cpu" in section
    # the ratio paired by round, its interval from the spread pooled over the optimizers at each size
    rounds = round_medians(STEP_MS)
    ratio = {size: step_ratios({o: rounds[(o, s)] for o, s in STEP_MS if s == size}, "adamw")["muon"]
             for size in ("tiny", "mini")}
    assert ratio["tiny"].value == pytest.approx(1.8) and ratio["tiny"].low < 1.8 < ratio["tiny"].high
    assert f"| muon | tiny | 256 | 18 [17.1, 18.9] | {ratio['tiny'].text()} | bf16 |" in section
    assert "| adamw | tiny | 256 | 10 [9.5, 10.5] | 1 (the reference) | – |" in section
    assert "Stable: within ±10% of the ratio" in section
    row = next(r for h, rows in tables(section) if h[0] == "optimizer" and h[1] == "cell" for r in rows
               if r[:2] == ["muon", "mini @ 2 tok/param"])
    token, (low, high) = float(row[2].split(" [")[0]), map(float, row[2].split(" [")[1].split("]")[0].split(", "))
    assert row[3] == ratio["mini"].text()
    assert float(row[4].split(" [")[0]) == pytest.approx(token / 2.0, rel=0.01)
    t_low, t_high = map(float, row[4].split(" [")[1].split("]")[0].split(", "))
    assert (t_low, t_high) == (pytest.approx(low / ratio["mini"].high, rel=0.01),
                               pytest.approx(high / ratio["mini"].low, rel=0.01))
    assert "not measurable here" in section  # the runs' own seconds keep their word


@pytest.mark.slow
def test_rate_transfer_reads_each_borrowed_rate_on_the_cells_own_curve(study: dict[str, str]) -> None:
    section = study["evidence.md"].split("## Rate transfer")[1].split("\n## ")[0]
    rows = {(r[0], r[1]): r for h, rs in tables(section) for r in rs}
    # AdamW's rate is the same everywhere: no cost; Lion's mini pays for tiny's rate (2x its own: 0.02 nats)
    assert rows[("adamw", "mini @ 1 tok/param")][3].startswith("0.004: +0 nats")
    assert rows[("lion", "mini @ 1 tok/param")][3].startswith("0.002: +0.02 nats, speedup x")
    assert rows[("muon", "tiny @ 2 tok/param")][4].startswith("0.016: +0.02 nats")
    line = next(x for x in study["report.md"].splitlines() if x.startswith("Rate transfer"))
    assert "adamw's rate transfers across sizes within 0 nats and transfers across data ratios within 0 nats" in line
    assert "lion's rate costs up to 0.02 nats across sizes" in line
    assert "muon's rate transfers across sizes within 0 nats and costs up to 0.02 nats across data ratios" in line


def test_the_opening_note_names_each_family_and_its_axes() -> None:
    """A sweep whose primary questions are the speedup along data alone: the note says the data-axis trends were
    tested as primary questions in their family and the size-axis trends as secondary ones in theirs, not one tier
    for both; a sweep without primary questions names one family."""
    from types import SimpleNamespace as NS

    from hf_optbench.report.short_report import _sentences_note

    metric = NS(key="speedup")
    cells = [NS(metric=metric, p_value=0.01, tier=t, family=f, axis=a)
             for t, f, a in [("secondary", 110, "size"), ("primary", 10, "data"), ("primary", 10, "data")]]
    an = NS(verdicts=cells, report_spec=None, regime=None)
    note = _sentences_note(an, "speedup")
    assert ("tested as the sweep's primary questions (along data: Holm's procedure over 10 cells at 5 %) and the "
            "sweep's secondary questions (along size: Holm's procedure over 110 cells at 5 %)") in note, note
    single = NS(verdicts=[NS(metric=metric, p_value=0.01, tier="", family=7, axis=a) for a in ("data", "size")],
                report_spec=None, regime=None)
    assert "tested as Holm's procedure over 7 cells at 5 %" in _sentences_note(single, "speedup")
