"""The report's speedup: a sweep with a baseline ladder gets a speedup question in the verdict table, a speedup
column in summary.csv, the budget per size, and an MDE beside every "no difference"."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_optbench.report.analysis import analyse  # noqa: E402
from hf_optbench.report.build import build_report  # noqa: E402

from fixtures.sweep_fixture import build_fixture_sweep  # noqa: E402

STEPS, TOKENS_PER_STEP = 60, 8 * 32
D1 = STEPS * TOKENS_PER_STEP
SIZES = ("tiny", "mini", "midi")
SEEDS = (0, 1, 2)
NOISE = {0: 0.0, 1: 0.002, 2: -0.002}  # per-seed shift shared by the seed's runs (same init and data order)


def law(tokens: float, size: str) -> float:
    return 1.2 * (tokens / D1) ** -0.3 + {"tiny": 3.0, "mini": 2.8, "midi": 2.6}[size]


def _sweep(tmp_path: Path, speedups: dict[str, float], ladder: tuple[float, ...] = (0.5, 2.0, 4.0)) -> Path:
    eval_loss = {f"{opt}__{size}__s{seed}": law(s * D1, size) + NOISE[seed] + (0.001 * seed if opt != "adamw" else 0)
                 for opt, s in {"adamw": 1.0, **speedups}.items() for size in SIZES for seed in SEEDS}
    root = build_fixture_sweep(tmp_path / "sweep", optimizers=("adamw", *speedups), sizes=SIZES, seeds=SEEDS,
                               steps=STEPS, eval_loss=eval_loss)
    manifest = json.loads((root / "sweep_manifest.json").read_text())
    for size in SIZES:
        for seed in SEEDS:
            src = root / "runs" / f"adamw__{size}__s{seed}"
            for m in ladder:
                rid = f"adamw__{size}__s{seed}__dx{m:g}"
                shutil.copytree(src, root / "runs" / rid)
                summary = json.loads((src / "summary.json").read_text())
                summary.update(max_steps=round(m * STEPS), final_eval_loss=law(m * D1, size) + NOISE[seed])
                (root / "runs" / rid / "summary.json").write_text(json.dumps(summary))
                manifest["runs"].append({"run_id": rid, "optimizer": "adamw", "model_size": size, "seed": seed,
                                         "lr_multiplier": None, "budget_multiple": m, "max_steps": round(m * STEPS)})
    (root / "sweep_manifest.json").write_text(json.dumps(manifest))
    return root


def _verdict(an, opt: str, key: str):  # noqa: ANN001, ANN202
    return next(v for v in an.verdicts if v.optimizer == opt and v.metric.key == key)


def test_a_true_speedup_is_measured_per_seed_and_gets_a_verdict(tmp_path: Path) -> None:
    an = analyse(_sweep(tmp_path, {"lion": 1.5, "adafactor": 1.0}))
    lion = [r for r in an.records if r["optimizer"] == "lion"]
    assert len(lion) == 9 and all(r["speedup"] == pytest.approx(1.5, rel=0.02) for r in lion)
    assert all(r["speedup_method"] == "power law" and not r["speedup_censored"] for r in lion)
    assert all(r["speedup"] == 1.0 for r in an.records if r["optimizer"] == "adamw")
    v = _verdict(an, "lion", "speedup")
    assert v.verdict == "holds"
    assert all(p.stance == "ahead" and p.ratio() == pytest.approx(1.5, rel=0.02) for p in v.points)
    assert "speedup 1.5" in v.evidence
    # the same optimizer's final eval loss, on the LM scale: ~0.08 nats lower, beyond the 0.01-nat margin
    assert _verdict(an, "lion", "final_eval_loss").points[-1].stance == "ahead"
    # adafactor's loss is the baseline's + 0.001-0.002 nats: no speedup claim either way
    assert _verdict(an, "adafactor", "speedup").verdict in ("no difference", "level")


def test_the_report_has_the_speedup_question_column_budget_and_mde(tmp_path: Path) -> None:
    root = _sweep(tmp_path, {"lion": 1.5, "adafactor": 1.0})
    files = build_report(root)
    text = files["evidence.md"].read_text()
    assert "convergence: speedup (AdamW-equivalent data)" in text
    assert "## Data budget per size" in text and "## Speedup over adamw (its budget ladder)" in text
    assert "power law 3/3" in text
    rows = list(csv.DictReader(files["summary.csv"].open()))
    compared = [r for r in rows if r["run_id"] == "lion__midi__s1"]
    assert float(compared[0]["speedup"]) == pytest.approx(1.5, rel=0.02)
    assert {r["budget_multiple"] for r in rows if "__dx" in r["run_id"]} == {"0.5", "2.0", "4.0"}
    adafactor_row = next(line for line in text.splitlines() if line.startswith("| adafactor |"))
    assert "no difference" not in adafactor_row or "MDE" in adafactor_row


def test_a_loss_beyond_the_ladder_is_censored_and_the_fixed_budget_warns(tmp_path: Path) -> None:
    an = analyse(_sweep(tmp_path, {"lion": 6.0}))
    lion = [r for r in an.records if r["optimizer"] == "lion"]
    assert all(r["speedup_censored"] and r["speedup_bound"] == "above" for r in lion)
    assert all(r["speedup"] == pytest.approx(4.0, rel=1e-3) for r in lion)
    assert "9 pair(s) include a loss beyond the ladder's range" in _verdict(an, "lion", "speedup").evidence
    from hf_optbench.report.sections.speedup import budget_table

    _, rows, warnings = budget_table(an)
    assert len(rows) == 3 and warnings and "differ in tokens per parameter" in warnings[0]


def test_no_ladder_no_speedup_question(tmp_path: Path) -> None:
    an = analyse(build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini")))
    assert not [v for v in an.verdicts if v.metric.key == "speedup"]
    assert all(r.get("speedup") is None for r in an.records)


NO_CLAIM = ("level", "no difference", "insufficient data", "not measurable here")


@pytest.mark.slow
def test_a_real_null_sweep_with_budget_and_ladder_claims_nothing(tmp_path: Path) -> None:
    """hf-optbench sweep + report end to end (tiny and mini, 2 seeds): AdamW against itself under another name
    (the dotted path with AdamW's cited values) gets a speedup question, a speedup column, and no verdict on any
    question."""
    import io

    import yaml

    from hf_optbench.study.sweep import run_sweep

    repo = Path(__file__).resolve().parents[2]
    sweep = {
        "base": str(repo / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "null"),
        "overrides": {"data_source": "synthetic", "block_size": 32, "per_device_train_batch_size": 4,
                      "per_device_eval_batch_size": 8, "validation_blocks": 8, "eval_steps": 1000,
                      "save_strategy": "no"},
        "matrix": {"optimizer": ["adamw", "torch.optim.AdamW"], "model_size": ["tiny", "mini"], "seed": [1, 2]},
        "per_optimizer": {"torch.optim.AdamW": {"learning_rate": 0.001,
                                                "optimizer_kwargs": '{"betas": [0.9, 0.99], "fused": true}'}},
        "budget": {"tokens_per_param": 0.01}, "ladder": {"multiples": [0.5, 1, 2]},
        # one run at a time: one warm worker for the whole sweep (two at once start a worker per slot)
        "launcher": {"type": "python", "jobs": 1, "env": {"OMP_NUM_THREADS": "1"}}, "calibration": False,
    }
    path = tmp_path / "null.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 16}
    files = build_report(tmp_path / "null")
    rows = {r["run_id"]: r for r in csv.DictReader(files["summary.csv"].open())}
    assert rows["adamw__mini__s1__dx2"]["max_steps"] == str(2 * int(rows["adamw__mini__s1"]["max_steps"]))
    assert float(rows["adamw__mini__s1"]["tokens_per_param"]) == pytest.approx(0.01, rel=0.02)
    assert all(float(rows[f"torch.optim.AdamW__{s}__s{i}"]["speedup"]) == pytest.approx(1.0, abs=0.03)
               for s in ("tiny", "mini") for i in (1, 2))
    an = analyse(tmp_path / "null")
    assert {v.metric.key for v in an.verdicts} >= {"speedup", "final_eval_loss"}
    assert all(v.verdict in NO_CLAIM for v in an.verdicts), [(v.metric.key, v.verdict) for v in an.verdicts]
    assert "| torch.optim.AdamW | " in files["report.md"].read_text()


def test_the_verdict_table_says_when_a_tuned_optimum_is_not_bracketed(tmp_path: Path) -> None:
    import yaml

    root = build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini"))
    entry = {"learning_rate": 1e-3, "multiplier": 1.0, "bracketed": True}
    # copies, not one shared dict: PyYAML would write a shared object as an alias, which the loader refuses
    tuned = {"adamw": {"tiny": {**entry}, "mini": {**entry}},
             "lion": {"tiny": {**entry, "bracketed": False}, "mini": {**entry}}}
    (root / "tuned_hparams.yaml").write_text(yaml.safe_dump(tuned))
    text = build_report(root)["report.md"].read_text()
    assert "Warning: 1 tuned optimum(s) not bracketed: lion/tiny" in text
    tuned["lion"]["tiny"]["bracketed"] = True
    (root / "tuned_hparams.yaml").write_text(yaml.safe_dump(tuned))
    assert "Every tuned optimum compared here is bracketed (4 optimizer x size pairs)" in \
        build_report(root)["report.md"].read_text()


def test_tuned_ratios_to_adamw_beside_the_lion_papers_band() -> None:
    from hf_optbench.report.sections.hyperparameters import tuned_ratio_table

    recs = [{"optimizer": "adamw", "model_size": "tiny", "learning_rate": 4e-3, "weight_decay": 0.1},
            {"optimizer": "lion", "model_size": "tiny", "learning_rate": 1e-3, "weight_decay": 0.9},
            {"optimizer": "muon", "model_size": "tiny", "learning_rate": 8e-3, "weight_decay": 0.1}]
    header, rows = tuned_ratio_table(recs)
    assert rows == [["lion", "tiny", "0.25", "9", "0.1-0.33; 3-10 (Chen et al. 2023 (Lion), Sec. 5)"],
                    ["muon", "tiny", "2", "1", "–"]]


def _tuned_file(root: Path) -> None:
    """A tuned file as the tuning phase writes it: groups, rungs, margins (made up, the tables only read them)."""
    import yaml

    rung = {"budget_multiple": 4.0, "max_steps": 4 * STEPS, "learning_rate": 0.002, "multiplier": 2.0, "bracketed": True,
            "margin": 0.01, "noise": 0.002, "within_noise": False}
    tuned = {size: {"adamw": {"learning_rate": 0.004, "multiplier": 4.0, "bracketed": True, "lr_bracketed": True,
                              "nonmatrix_lr_ratio": 1.0, "nonmatrix_lr": 0.004, "nonmatrix_bracketed": True,
                              "lr_margin": 0.002, "lr_noise": 0.003, "lr_seeds": [0, 1000, 1001],
                              "lr_within_noise": True, "ladder": [{**rung, "budget_multiple": 0.5,
                                                                   "learning_rate": 0.008, "multiplier": 8.0}, rung]},
                     "muon": {"learning_rate": 0.032, "multiplier": 32.0, "bracketed": True, "nonmatrix_lr_ratio": 0.25,
                              "nonmatrix_lr": 0.008, "nonmatrix_bracketed": True}} for size in SIZES}
    data = {opt: {size: tuned[size][opt] for size in SIZES} for opt in ("adamw", "muon")}
    data = json.loads(json.dumps(data))  # no shared objects: YAML would write them as anchors, which are refused
    (root / "tuned_hparams.yaml").write_text("# Tuned hyperparameters (hf-optbench)\n" + yaml.safe_dump(data))


def test_the_report_attributes_muon_s_speedup_and_shows_every_rung_s_rate(tmp_path: Path) -> None:
    """Issue 29: the report states the attribution (Muon's speedup with its non-matrix group at AdamW's tuned rate,
    beside the fully tuned one), each ladder rung's own tuned rate, and every group's tuned rate."""
    root = _sweep(tmp_path, {"muon": 1.5})
    _tuned_file(root)
    attribution = root / "attribution" / "runs"
    attribution.mkdir(parents=True)
    for size in SIZES:
        for seed in SEEDS:
            src = root / "runs" / f"muon__{size}__s{seed}"
            shutil.copytree(src, attribution / src.name)
            summary = json.loads((src / "summary.json").read_text())
            summary["final_eval_loss"] = law(1.2 * D1, size) + NOISE[seed]  # a 1.2x speedup without its group rate
            (attribution / src.name / "summary.json").write_text(json.dumps(summary))
    an = analyse(root)
    assert len(an.attribution) == 9 and all(r["speedup"] == pytest.approx(1.2, rel=0.03) for r in an.attribution)
    files = build_report(root)
    text = files["evidence.md"].read_text()
    section = text.split("### Attribution")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| muon | midi"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2].startswith("0.008 (x0.25 of 0.032)") and cells[4].startswith("0.004 (x1 of 0.004)")
    assert cells[3].startswith("1.5") and cells[5].startswith("1.2") and cells[6].startswith("0.8")
    assert "| size | x0.5 | x1 | x2 | x4 |" in text  # every rung's own rate (x2 has none in this file)
    assert "| midi | 0.008 (x8) | 0.004 (x4), margin 0.002 ≤ noise 0.003 | – | 0.002 (x2) |" in text
    assert "### Tuned values, every parameter group alike" in text
    assert "| muon | tiny | 0.032 (x32) | cited | 0.008 (x0.25) |" in text
    # the short report says it in one line, per cell (issue 40)
    line = next(x for x in files["report.md"].read_text().splitlines() if x.startswith("Attribution ("))
    assert re.search(r"muon 1\.2\d* \(fully tuned 1\.5\d*\) at tiny, 1\.2\d* \(fully tuned 1\.5\d*\) at mini", line), line
