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


FAKE_RUN = r'''
import argparse, json, math, os, pathlib, sys
from hf_optbench.optim.tuned import lookup_tuned
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--run_name", "--tuned_hparams_file", "--optimizer_kwargs"):
    p.add_argument(k)
p.add_argument("--seed", type=int)
p.add_argument("--learning_rate", type=float)
p.add_argument("--weight_decay", type=float)
p.add_argument("--max_steps", type=int)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
lr, ratio = a.learning_rate, json.loads(a.optimizer_kwargs or "{}").get("nonmatrix_lr_ratio")
if lr is None:  # a compared run: the tuned file, as run.plan.resolve_optimization reads it
    entry = lookup_tuned(a.tuned_hparams_file, a.optimizer, a.model_size, max_steps=a.max_steps)
    lr, ratio = entry["learning_rate"], entry.get("nonmatrix_lr_ratio", ratio)
cited = json.loads(os.environ["FAKE_CITED"])[a.optimizer]
best = json.loads(os.environ["FAKE_BEST"])[a.optimizer]
speedup = {"adamw": 1.0, "muon": 6.0}[a.optimizer]
steps = a.max_steps
best_lr = cited * best["lr"] * (steps / 8) ** -0.5
loss = (3.0 + (speedup * steps / 8) ** -0.5 + 0.05 * math.log2(lr / best_lr) ** 2
        + 0.05 * math.log2((ratio or 1.0) / best["nm"]) ** 2 + 0.0005 * (a.seed % 7))
summary = {"status": "completed", "optimizer": a.optimizer, "model_size": a.model_size, "seed": a.seed,
           "learning_rate": lr, "max_steps": steps, "tokens_per_step": 256, "final_eval_loss": loss,
           "final_tuning_loss": loss, "nonmatrix_lr_ratio": ratio}
(out / "summary.json").write_text(json.dumps(summary))
'''


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
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    counts = run_sweep(path, stream=log)
    out = tmp_path / "out"
    assert set(counts) == {"completed"}, log.getvalue()
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
