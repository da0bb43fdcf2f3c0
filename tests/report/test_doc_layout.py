"""Issue 40's table rule in the report's Doc: a table wider than MAX_COLUMNS splits into tables that repeat its key
columns, a Markdown cell longer than MAX_CELL continues on rows below at its coarsest boundary, and the HTML keeps
both whole, with the evidence's sections collapsed."""

from __future__ import annotations

from pathlib import Path

from hf_optbench.report.build import MAX_CELL, MAX_COLUMNS, Doc, split_wide, wrap_cell


def test_a_wide_table_splits_and_repeats_its_key_columns() -> None:
    header = ["optimizer", "size", *[f"m{i}" for i in range(12)]]
    rows = [["muon", "tiny", *[str(i) for i in range(12)]]]
    parts = split_wide(header, rows, keep=2)
    assert [len(h) for h, _ in parts] == [MAX_COLUMNS, 2 + 12 - (MAX_COLUMNS - 2)]
    assert all(h[:2] == ["optimizer", "size"] and r[0][:2] == ["muon", "tiny"] for h, r in parts)
    assert [c for h, _ in parts for c in h[2:]] == header[2:]
    assert split_wide(header[:5], [r[:5] for r in rows]) == [(header[:5], [rows[0][:5]])]


def test_a_long_cell_continues_at_its_coarsest_boundary() -> None:
    text = "; ".join(f"part {i} " + "x" * 30 for i in range(8))
    pieces = wrap_cell(text)
    assert all(len(p) <= MAX_CELL for p in pieces) and len(pieces) > 1
    assert " ".join(pieces) == text and all(p.endswith(";") for p in pieces[:-1])
    assert wrap_cell("short") == ["short"]
    assert all(len(p) <= MAX_CELL for p in wrap_cell("y" * 300)) and "".join(wrap_cell("y" * 300)) == "y" * 300


def test_markdown_wraps_the_cell_and_html_keeps_it_whole(tmp_path: Path) -> None:
    doc, evidence = Doc(), Doc()
    long = "; ".join(["a clause of some length"] * 10)
    doc.table(["key", "text"], [["k", long]])
    evidence.h(2, "Runs")
    evidence.p("every run")
    md = doc.markdown(tmp_path).splitlines()
    rows = [line for line in md if line.startswith("| ") and not line.startswith("| key")]
    assert rows[0].startswith("| k | a clause") and all(r.startswith("|  | ") for r in rows[1:]) and len(rows) > 1
    html = doc.html("t", evidence)
    assert f"<td>{long}</td>" in html and "<details><summary><b>Runs</b></summary>" in html
    assert html.index("<table>") < html.index("<details>") and html.count("</details>") == 1
