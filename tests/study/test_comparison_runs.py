"""The comparison phase's own additions (issue 29): the ladder extended automatically while an optimizer beats its top
rung (each new rung tuned first), and Muon's attribution runs (its non-matrix group at AdamW's tuned rate).

The rule of the extension on made-up records; then a whole sweep with a stand-in for ``hf_optbench.run``
(``launcher.type: command``) whose losses follow a known data-scaling curve, with Muon's true speedup (6x) beyond the
file's ladder (4x)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from hf_optbench.optim.registry import optimizer_defaults
from hf_optbench.rundir import read_state
from hf_optbench.study.budget import Ladder, ladder_multiples
from hf_optbench.study.sweep import run_sweep

from fixtures.fake_run import FAKE_RUN

REPO = Path(__file__).resolve().parents[2]


def _rec(opt: str, seed: int, multiple: float | None, loss: float, status: str = "completed") -> dict:
    steps = 8 * (multiple or 1.0)
    return {"run_id": f"{opt}__tiny__s{seed}" + (f"__dx{multiple:g}" if multiple else ""), "optimizer": opt,
            "model_size": "tiny", "seed": seed, "budget_multiple": multiple, "status": status, "lr_multiplier": None,
            "final_eval_loss": loss, "_summary": {"max_steps": steps, "tokens_per_step": 256}}


def _ladder_records(top: float, muon_loss: float) -> list[dict]:
    curve = {0.5: 4.4, 1.0: 4.2, 2.0: 4.05, 4.0: 3.95, 8.0: 3.88, 16.0: 3.83}
    out = []
    for seed in (1, 2):
        out += [_rec("adamw", seed, None if m == 1.0 else m, curve[m] + 0.001 * seed) for m in curve if m <= top]
        out.append(_rec("muon", seed, None, muon_loss))
    return out


def test_the_ladder_doubles_while_a_run_beats_its_top_and_stops_at_the_cap() -> None:
    ladder = Ladder((0.5, 1.0, 2.0, 4.0), "adamw", 16.0)
    assert ladder_multiples(ladder, "tiny", _ladder_records(4.0, 4.0)) == (0.5, 1.0, 2.0, 4.0)  # inside: done
    beyond = _ladder_records(4.0, 3.90)  # below the 4x rung's 3.95
    assert ladder_multiples(ladder, "tiny", beyond) == (0.5, 1.0, 2.0, 4.0, 8.0)
    # the 8x rung has run and still does not reach it? not here: 3.88 < 3.90, so it stops at 8x
    assert ladder_multiples(ladder, "tiny", _ladder_records(8.0, 3.90)) == (0.5, 1.0, 2.0, 4.0, 8.0)
    # far beyond: doubling until the cap (16x), then a bound that stays a bound
    assert ladder_multiples(ladder, "tiny", _ladder_records(16.0, 3.5)) == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    assert Ladder((0.5, 1.0, 2.0, 4.0)).cap == 32.0  # without max_multiple: three doublings beyond the top
    unfinished = [r if r["run_id"] != "adamw__tiny__s1__dx4" else {**r, "status": "running/unfinished"}
                  for r in beyond]
    assert ladder_multiples(ladder, "tiny", unfinished) == (0.5, 1.0, 2.0, 4.0)  # decided on finished runs only




def _run_fake(tmp_path: Path, sweep: dict) -> tuple[Path, dict[str, int], io.StringIO]:
    """Write ``sweep`` and run it to the end: (its file, the counts, the log); every run completed."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    counts = run_sweep(path, stream=log)
    assert set(counts) == {"completed"}, log.getvalue()
    return path, counts, log


@pytest.mark.slow  # ~60 fake runs, each its own interpreter
def test_a_true_speedup_beyond_the_ladder_extends_it_and_the_attribution_runs(tmp_path: Path) -> None:
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    cited = {o: optimizer_defaults(o, "tiny")["learning_rate"] for o in ("adamw", "muon")}
    best = {"adamw": {"lr": 2.0, "nm": 1.0}, "muon": {"lr": 8.0, "nm": 0.125}}
    sweep = {"name": "beyond", "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 8, "tuning_blocks": 4},
             "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"], "seed": [1, 2]},
             "tune": {"lr_multipliers": [1, 2, 4], "seed": [0], "confirm_seeds": [],
                      "nonmatrix_multipliers": [0.5, 1, 2]},
             "ladder": {"multiples": [0.5, 1, 2, 4], "optimizer": "adamw", "max_multiple": 16},
             "launcher": {"type": "command", "command": ["{python}", str(fake)], "validate": False,
                          "env": {"FAKE_BEST": json.dumps(best), "FAKE_CITED": json.dumps(cited)}}}
    path, counts, log = _run_fake(tmp_path, sweep)
    out = tmp_path / "out"
    assert ("[sweep] ladder: tiny: muon__tiny__s1, muon__tiny__s2, attribution/muon__tiny__s1, "
            "attribution/muon__tiny__s2 beat the ladder's top rung: adding x8 (cap x16)") in log.getvalue()
    # the new rung was tuned like the others before it ran, and runs at its own rate
    tuned = yaml.safe_load((out / "tuned_hparams.yaml").read_text())
    rungs = {r["budget_multiple"]: r for r in tuned["adamw"]["tiny"]["ladder"]}
    assert sorted(rungs) == [0.5, 2.0, 4.0, 8.0] and rungs[8.0]["max_steps"] == 64 and rungs[8.0]["bracketed"]
    for seed in (1, 2):
        rung = json.loads((out / "runs" / f"adamw__tiny__s{seed}__dx8" / "summary.json").read_text())
        assert rung["learning_rate"] == rungs[8.0]["learning_rate"] != tuned["adamw"]["tiny"]["learning_rate"]
    assert not (out / "runs" / "adamw__tiny__s1__dx16").exists()  # 6x lies inside 8x: no further doubling
    # Muon's groups were tuned (its non-matrix group at 1/8 of its rate), and its attribution runs put that group at
    # AdamW's tuned rate
    muon = tuned["muon"]["tiny"]
    assert muon["nonmatrix_lr_ratio"] == 0.125 and muon["nonmatrix_bracketed"]
    attribution = yaml.safe_load((out / "attribution" / "tuned_hparams_attribution.yaml").read_text())["muon"]["tiny"]
    adamw_rate = tuned["adamw"]["tiny"]["learning_rate"] * tuned["adamw"]["tiny"]["nonmatrix_lr_ratio"]
    assert attribution["nonmatrix_lr"] == pytest.approx(adamw_rate)
    assert attribution["nonmatrix_lr_ratio"] == pytest.approx(adamw_rate / muon["learning_rate"], rel=1e-5)
    for seed in (1, 2):
        run = json.loads((out / "attribution" / "runs" / f"muon__tiny__s{seed}" / "summary.json").read_text())
        assert run["nonmatrix_lr_ratio"] == pytest.approx(attribution["nonmatrix_lr_ratio"])
    # restarted, it decides the same and runs nothing again
    starts = len([r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start"])
    assert run_sweep(path, stream=io.StringIO()) == counts
    assert len([r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start"]) == starts


@pytest.mark.slow  # ~60 fake runs, each its own interpreter
def test_every_ratio_runs_the_whole_protocol_and_each_run_reads_its_own_ratios_values(tmp_path: Path) -> None:
    """Issue 31: budget.tokens_per_param [0.02, 0.04] at tiny (8 and 16 steps of 256 tokens), ladder 0.5-2x. The
    0.02 ratio's 2x rung and the 0.04 ratio's compared runs are both 16 steps, and the stand-in's best non-matrix
    ratio depends on the step count (1 at 8 steps, 0.5 at 16), so the two ratios' tuning chooses differently: the
    rung keeps its ratio's x1 choice (1), the compared run of 0.04 its own (0.5). One tuned file found by max_steps
    would give both the same; each ratio's own file gives each its own."""
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    cited = {o: optimizer_defaults(o, "tiny")["learning_rate"] for o in ("adamw", "muon")}
    best = {"adamw": {"lr": 2.0, "nm": {"4": 1.0, "8": 1.0, "16": 0.5, "32": 0.5}}, "muon": {"lr": 2.0, "nm": 0.5}}
    sweep = {"name": "ratios", "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"tuning_blocks": 4, "block_size": 64, "per_device_train_batch_size": 4,
                           "data_source": "synthetic"},
             "budget": {"tokens_per_param": [0.02, 0.04]},
             "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"], "seed": [1]},
             "tune": {"lr_multipliers": [1, 2, 4], "seed": [0], "confirm_seeds": []},
             "ladder": {"multiples": [0.5, 1, 2], "optimizer": "adamw", "max_multiple": 2},
             "launcher": {"type": "command", "command": ["{python}", str(fake)], "validate": False,
                          "env": {"FAKE_BEST": json.dumps(best), "FAKE_CITED": json.dumps(cited),
                                  "FAKE_SPEEDUP": json.dumps({"adamw": 1.0, "muon": 1.5})}}}
    path, counts, _ = _run_fake(tmp_path, sweep)
    out = tmp_path / "out"
    assert not (out / "tuned_hparams.yaml").exists()
    tuned = {r: yaml.safe_load((out / f"tuned_hparams__tpp{r}.yaml").read_text()) for r in ("0.02", "0.04")}
    assert tuned["0.02"]["adamw"]["tiny"]["nonmatrix_lr_ratio"] == 1.0
    assert tuned["0.04"]["adamw"]["tiny"]["nonmatrix_lr_ratio"] == 0.5
    assert tuned["0.04"]["adamw"]["tiny"]["tokens_per_param"] == 0.04
    rungs = {r["budget_multiple"]: r["max_steps"] for r in tuned["0.02"]["adamw"]["tiny"]["ladder"]}
    assert rungs == {0.5: 4, 2.0: 16}  # every rung of every ratio tuned
    assert {r["budget_multiple"]: r["max_steps"] for r in tuned["0.04"]["adamw"]["tiny"]["ladder"]} == {0.5: 8, 2.0: 32}
    tuning_ids = {p.name for p in (out / "tuning" / "runs").iterdir()}
    assert "adamw__tiny__s0__tpp0.02__lrx1__dx2" in tuning_ids  # the tuning runs carry the ratio too
    assert any(i.startswith("muon__tiny__s0__tpp0.04__lrx") and "__nmx" in i for i in tuning_ids)

    def ran(run_id: str, where: Path = out) -> dict:
        return json.loads((where / "runs" / run_id / "summary.json").read_text())

    rung, compared = ran("adamw__tiny__s1__tpp0.02__dx2"), ran("adamw__tiny__s1__tpp0.04")
    assert rung["max_steps"] == compared["max_steps"] == 16
    assert (rung["nonmatrix_lr_ratio"], compared["nonmatrix_lr_ratio"]) == (1.0, 0.5)
    for r in ("0.02", "0.04"):  # the attribution runs too, each from its ratio's file
        attributed = yaml.safe_load((out / "attribution" / f"tuned_hparams_attribution__tpp{r}.yaml").read_text())
        assert ran(f"muon__tiny__s1__tpp{r}", out / "attribution")["nonmatrix_lr_ratio"] == pytest.approx(
            attributed["muon"]["tiny"]["nonmatrix_lr_ratio"])
    starts = len([r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start"])
    assert run_sweep(path, stream=io.StringIO()) == counts  # restarted: decides the same, runs nothing again
    assert len([r for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start"]) == starts
    # `hf-optbench tune` replays the same rule and writes what the sweep wrote, a file per ratio
    from hf_optbench.cli import main as cli

    assert cli(["tune", str(out / "tuning"), "--output", str(tmp_path / "again.yaml")]) == 0
    for r in ("0.02", "0.04"):
        again = yaml.safe_load((tmp_path / f"again__tpp{r}.yaml").read_text())
        assert again["adamw"]["tiny"]["nonmatrix_lr_ratio"] == tuned[r]["adamw"]["tiny"]["nonmatrix_lr_ratio"]
        assert again["adamw"]["tiny"]["learning_rate"] == tuned[r]["adamw"]["tiny"]["learning_rate"]
