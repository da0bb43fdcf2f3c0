"""The report's speedup: a sweep with a baseline ladder gets a speedup question in the verdict table, a speedup
column in summary.csv, the budget per size, and an MDE beside every "no difference"."""

from __future__ import annotations

import csv
import json
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
    text = files["report.md"].read_text()
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
    from hf_optbench.report.speedups import budget_table

    _, rows, warnings = budget_table(an)
    assert len(rows) == 3 and warnings and "differ in tokens per parameter" in warnings[0]


def test_no_ladder_no_speedup_question(tmp_path: Path) -> None:
    an = analyse(build_fixture_sweep(tmp_path / "s", optimizers=("adamw", "lion"), sizes=("tiny", "mini")))
    assert not [v for v in an.verdicts if v.metric.key == "speedup"]
    assert all(r.get("speedup") is None for r in an.records)


NO_CLAIM = ("level", "no difference", "insufficient data")


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
        "launcher": {"type": "python", "env": {"OMP_NUM_THREADS": "1"}},
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
    from hf_optbench.report.sensitivity import tuned_ratio_table

    recs = [{"optimizer": "adamw", "model_size": "tiny", "learning_rate": 4e-3, "weight_decay": 0.1},
            {"optimizer": "lion", "model_size": "tiny", "learning_rate": 1e-3, "weight_decay": 0.9},
            {"optimizer": "muon", "model_size": "tiny", "learning_rate": 8e-3, "weight_decay": 0.1}]
    header, rows = tuned_ratio_table(recs)
    assert rows == [["lion", "tiny", "0.25", "9", "0.1-0.33; 3-10 (Chen et al. 2023 (Lion), Sec. 5)"],
                    ["muon", "tiny", "2", "1", "–"]]
