"""The report builds from a small constructed sweep; its files exist and hold the expected runs and verdicts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hf_optbench.cli.report import main as cli_main
from hf_optbench.errors import OptBenchError
from hf_optbench.report.analysis import analyse, parse_targets
from hf_optbench.report.build import build_report
from hf_optbench.rundir import read_metrics
from hf_optbench.study.records import load_runs

from fixtures.installed import hf_optbench_command
from fixtures.sweep_fixture import build_fixture_sweep


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    base = tmp_path_factory.mktemp("sweep")
    root = build_fixture_sweep(base / "demo", diverged=["lion__midi__s1"], failed=["adafactor__tiny__s1"])
    tune = build_fixture_sweep(base / "tune", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0,), steps=20,
                               lr_multipliers=(0.5, 1.0, 2.0), tuning_loss=True)
    return root, build_report(root, tuning_dir=tune)


def test_report_files_exist(report: tuple[Path, dict[str, Path]]) -> None:
    root, files = report
    out = root / "report"
    for name in ("report.md", "report.html", "summary.csv", "runs.parquet", "scaling.png", "memory.png",
                 "throughput.png", "stability.png", "loss_tiny.png", "loss_mini.png", "loss_midi.png",
                 "lr_gradnorm_midi.png", "tuning_tiny.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
        assert files[name] == out / name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_csv_has_every_run_once(report: tuple[Path, dict[str, Path]]) -> None:
    root, _ = report
    rows = list(csv.DictReader(open(root / "report" / "summary.csv", encoding="utf-8")))
    ids = [r["run_id"] for r in rows]
    assert len(ids) == 18 == len(set(ids))
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["lion__midi__s1"]["status"] == "diverged"
    assert by_id["adafactor__tiny__s1"]["status"] == "failed"
    assert "boom" in by_id["adafactor__tiny__s1"]["error"]
    assert by_id["adamw__tiny__s0"]["status"] == "completed"
    # every finished run has a time to the verdict's (50 %) target: reached, or censored at its budget
    finished = [r for r in rows if r["status"] in ("completed", "diverged")]
    assert all(r["tokens_to_target"] and r["target"] == "50%" for r in finished)
    assert all(r["target_censored"] in ("True", "False") for r in finished)
    completed = [r for r in rows if r["status"] == "completed"]
    assert all(r["planner_optimizer_state_bytes"] == r["optimizer_state_bytes"] for r in completed)
    assert all(r["hyperparameter_sources"] for r in completed)


def test_markdown_holds_verdict_tables_and_plots(report: tuple[Path, dict[str, Path]]) -> None:
    root, _ = report
    md = (root / "report" / "evidence.md").read_text(encoding="utf-8")
    assert "## Scaling verdict" in md
    # constructed answers: Lion's state is exactly half of AdamW's at every size; Adafactor's factored state
    # grows sub-linearly, so its saving grows; Lion converges faster (tau 16 vs 20) by a constant factor
    table = md.split("## Scaling verdict")[1].split("### Evidence")[0]
    verdict_rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "holds (0.5→0.5; ahead at midi)" in verdict_rows["lion"]
    assert verdict_rows["adafactor"].split("|")[2].strip().startswith("grows")
    assert "![scaling](scaling.png)" in md and "![memory](memory.png)" in md
    assert "predicted (planner)" in md and "gpt2-xl" in md
    # the new vocabulary with its definitions, the paired intervals and seeds, no trace of the old rule
    assert "| deficit vanishes | Level or no difference at the largest size, behind at the smallest size" in md
    assert "2 x sd" not in md
    ratios = md.split("## Ratios to adamw")[1].split("## Memory")[0]
    assert "| lion | mini | 7,236,352 | measured | 2 | 0.5 [0.5, 0.5] ahead |" in ratios
    conv = md.split("## Convergence")[1].split("## Hyperparameters")[0]
    assert "| tiny | 50% (verdict) |" in conv and "adamw's train loss (trailing mean of 5 steps) at step 30 of 60" in conv
    assert "### Eval loss at matched token budgets" in conv and "Mean train loss over budget" in conv
    hp = md.split("## Hyperparameters")[1].split("## Step time")[0]
    assert "all cited: Lion et al. 2020" in hp and "final tuning loss (the held-out tuning split" in hp
    assert "![tuning_tiny.png](tuning_tiny.png)" in hp
    for run_id in ("adamw__tiny__s0", "lion__midi__s1", "adafactor__tiny__s1"):
        assert run_id in md
    html = (root / "report" / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") >= 5 and "<table>" in html


def test_analysis_numbers(tmp_path: Path) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0, 1),
                               steps=40)
    an = analyse(root)
    assert an.sizes == ["tiny", "mini"] and an.optimizers == ["adamw", "lion"]
    state = next(v for v in an.verdicts if v.metric.key == "optimizer_state_bytes")
    assert [p.ratio() for p in state.points] == pytest.approx([0.5, 0.5], rel=1e-4)  # AdamW also keeps a 4-byte step per tensor
    tok = next(v for v in an.verdicts if v.metric.key == "tokens_to_target")
    assert all(p.ratio() < 1 for p in tok.points)  # lion's faster constructed curve reaches the target first
    # an explicit unreachable target: never reached, so every run counts at its budget, marked censored
    an2 = analyse(root, target_loss=0.1)
    assert all(r["tokens_to_target"] == 40 * 256 and r["tokens_to_target_censored"] for r in an2.records)
    tok2 = next(v for v in an2.verdicts if v.metric.key == "tokens_to_target")
    assert all(p.censored_pairs == p.n_pairs == 2 for p in tok2.points)


def test_runs_parquet_holds_every_metrics_row(report: tuple[Path, dict[str, Path]]) -> None:
    import pandas as pd

    root, files = report
    df = pd.read_parquet(files["runs.parquet"])
    expected = sum(len(rows) for d in (root / "runs").iterdir() for rows in read_metrics(d).values())
    assert len(df) == expected > 0
    for col in ("run_id", "optimizer", "model_size", "seed", "lr_multiplier", "kind", "step", "tokens", "loss",
                "eval_loss", "optimizer_state_bytes"):
        assert col in df.columns, col
    assert set(df["kind"]) == {"train", "eval", "memory"} and df["run_id"].nunique() == 17  # the failed run has none
    lion = df[(df["run_id"] == "lion__tiny__s0") & (df["kind"] == "train")]
    assert lion["step"].tolist() == list(range(1, 61)) and lion["optimizer"].unique().tolist() == ["lion"]


def test_metrics_reader_keeps_last_row_per_step(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1, "loss": 5.0}\n{"kind": "train", "step": 2, "loss": 4.0}\n'
        '{"kind": "train", "step": 2, "loss": 3.0}\n{"kind": "eval", "step": 2, "eval_loss": 4.5}\n{"torn": ')
    m = read_metrics(tmp_path)
    assert [r["loss"] for r in m["train"]] == [5.0, 3.0] and m["eval"][0]["eval_loss"] == 4.5


def test_targets_and_errors(tmp_path: Path) -> None:
    assert parse_targets("5") == 5.0
    assert parse_targets("tiny=6.1, mini=5.4") == {"tiny": 6.1, "mini": 5.4}
    assert parse_targets(None) is None
    with pytest.raises(OptBenchError, match="target-loss"):
        parse_targets("tiny=abc")
    with pytest.raises(OptBenchError, match="not found"):
        load_runs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptBenchError, match="no run directories"):
        build_report(tmp_path / "empty")


def test_cli_writes_to_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"), seeds=(0,),
                               steps=30)
    assert cli_main([str(root), "--output", str(tmp_path / "rep"), "--target-loss", "tiny=6.0,mini=6.0"]) == 0
    assert (tmp_path / "rep" / "report.html").is_file()
    rows = list(csv.DictReader(open(tmp_path / "rep" / "summary.csv", encoding="utf-8")))
    assert {r["target_loss"] for r in rows} == {"6.0"}
    assert "wrote" in capsys.readouterr().out
    state = [json.loads(x) for x in (root / "sweep_state.jsonl").read_text().splitlines()]
    assert len(state) == 8  # the report only reads


def test_bad_records_are_skipped_by_name_through_the_installed_command(tmp_path: Path) -> None:
    """Issue 32: a metrics.jsonl with a ``[]`` line, a ``{"step": "abc"}`` line or trailing binary bytes, and a
    sweep_state.jsonl with binary bytes appended, ended ``report`` in a traceback (AttributeError, ValueError,
    UnicodeDecodeError). Each bad record is skipped with one warning line naming the file; the report is built."""
    import os
    import subprocess

    exe = hf_optbench_command()
    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny",), seeds=(0, 1), steps=30)
    runs = root / "runs"
    with open(runs / "lion__tiny__s0" / "metrics.jsonl", "a") as fh:
        fh.write("[]\n")
    with open(runs / "lion__tiny__s1" / "metrics.jsonl", "a") as fh:
        fh.write('{"kind": "train", "step": "abc", "loss": 1.0}\n')
    with open(runs / "adamw__tiny__s1" / "metrics.jsonl", "ab") as fh:
        fh.write(b"\x00\xff\xfe\x80 trailing bytes")
    with open(root / "sweep_state.jsonl", "ab") as fh:
        fh.write(b"\xff\xfe\x80garbage\n")
    proc = subprocess.run([str(exe), "report", str(root)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    assert all(line.startswith("warning: ") for line in warnings) and len(warnings) == 4, warnings
    for name in ("lion__tiny__s0/metrics.jsonl", "lion__tiny__s1/metrics.jsonl", "adamw__tiny__s1/metrics.jsonl",
                 "sweep_state.jsonl"):
        assert sum(name in line for line in warnings) == 1, (name, warnings)
    assert (root / "report" / "report.md").is_file()


def test_a_report_folder_may_hold_only_what_a_report_wrote(tmp_path: Path) -> None:
    """A user's own report.md and summary.csv are never replaced; a report's earlier outputs (its manifest lists
    them) are, and a file of another name beside them is refused."""
    from hf_optbench.report.build import _record_report, check_report_folder

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("# my own\n")
    (mine / "summary.csv").write_text("a,b\n")
    with pytest.raises(OptBenchError, match=r"no hf-optbench report wrote \(report.md, summary.csv\)"):
        check_report_folder(mine)
    ours = tmp_path / "ours"
    ours.mkdir()
    _record_report(ours, [])
    for name in ("report.md", "summary.csv", "loss_tiny.png", "report.md.tmp-12-abcd1234.md"):
        (ours / name).write_text("a report's\n")
    check_report_folder(ours)
    (ours / "notes.txt").write_text("mine\n")
    with pytest.raises(OptBenchError, match=r"\(notes.txt\)"):
        check_report_folder(ours)
