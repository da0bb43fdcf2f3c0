"""Issue 40's second tuning draw, the sweep side: ``tune.second_draw`` checked before any run, the drawn cells' whole
tuning protocol again at the draw's seed (every optimizer, every rung), and only the comparison runs whose tuned
values it changed run again; on made-up tuning results (as test_tuning_phase.py: no training)."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import parse_run_id
from hf_optbench.study.budget import Budget
from hf_optbench.study.second_draw import SecondDraw, parse_second_draw
from hf_optbench.study.second_draw_phase import CHANGES_FILE, draw_comparison, draw_spec, run_values
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, attach_tuned_file
from hf_optbench.study.tuning_phase import tune_phase

from fixtures.fake_run import FAKE_RUN
from fixtures.sweep_fixture import settle_tuning, tuning_spec

STEPS = 8
LADDER = {"ladder": {"multiples": [0.5, 1, 2, 4], "optimizer": "adamw"}}
TUNE = {"lr_multipliers": [1, 2, 4, 8, 16], "confirm_seeds": [], "nonmatrix_multipliers": []}


def _spec(tmp_path: Path, draw: dict | None, **tune: object) -> SweepSpec:
    return tuning_spec(tmp_path, {**TUNE, **tune, **({"second_draw": draw} if draw is not None else {})},
                       ("adamw", "muon"), steps=STEPS, seeds=(1, 2), extra=LADDER)


@pytest.mark.parametrize(("draw", "message"), [
    ({"seed": 0, "cells": [{"model_size": "tiny"}]}, "is one of tune.seed [0]"),
    ({"seed": 1, "cells": [{"model_size": "tiny"}]}, "is one of matrix seed [1, 2]"),
    ({"seed": 6, "cells": [{"model_size": "mini"}]}, "is not in the matrix (tiny)"),
    ({"seed": 6, "cells": []}, "must be a non-empty list"),
    ({"seed": 6, "cells": [{"model_size": "tiny"}, {"model_size": "tiny"}]}, "lists a cell twice"),
    ({"seed": 6}, "exactly seed and cells"),
    ({"seed": 6, "cells": [{"size": "tiny"}]}, "must be mappings {model_size, tokens_per_param}"),
    ({"seed": "6", "cells": [{"model_size": "tiny"}]}, "tune.second_draw.seed must be"),
])
def test_a_bad_second_draw_is_refused_before_any_run(tmp_path: Path, draw: dict, message: str) -> None:
    with pytest.raises(OptBenchError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)").replace("{", r"\{").replace("}", r"\}")):
        _spec(tmp_path, draw)


@pytest.mark.parametrize(("draw", "words"), [
    ({"seed": 2, "cells": [{"model_size": "tiny"}]}, ["tune.second_draw.seed 2 is one of matrix seed [1, 2]",
                                                      "Choose another, e.g. 6"]),
    ({"seed": 6, "cells": [{"model_size": "mini"}]}, ["tune.second_draw cell model_size 'mini' is not in the matrix "
                                                      "(tiny)", "Use one of those sizes"]),
])
def test_a_bad_second_draw_is_refused_before_the_budget_parses_a_run(tmp_path: Path, monkeypatch, draw: dict,
                                                                      words: list[str]) -> None:
    """A sweep with a budget parses a run per optimizer x size (transformers and torch: seconds) to size its steps;
    the draw's own mistakes are the file's and answer first, with torch and transformers unimportable."""
    from hf_optbench.study import sweep_spec

    def no_parse(*_: object) -> None:
        raise AssertionError("a run was parsed before the sweep file's second_draw was checked")

    repo = Path(__file__).resolve().parents[2]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "base": str(repo / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
        "overrides": {"tuning_blocks": 4}, "budget": {"tokens_per_param": 0.5}, "launcher": {"type": "python"},
        "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [1, 2]},
        "tune": {"seed": 0, "lr_multipliers": [0.5, 1, 2], "second_draw": draw}}))
    monkeypatch.setattr(sweep_spec, "probe_run_config", no_parse)
    with monkeypatch.context() as blocked:
        for name in ("torch", "transformers"):
            blocked.setitem(sys.modules, name, None)
        with pytest.raises(OptBenchError) as refused:
            sweep_spec.load_sweep(path)
    for word in words:
        assert word in str(refused.value)


def test_a_draw_seed_among_the_confirm_seeds_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match="is one of tune.confirm_seeds"):
        _spec(tmp_path, {"seed": 1000, "cells": [{"model_size": "tiny"}]}, confirm_seeds=[1000, 1001])


def test_a_sweep_over_ratios_names_each_drawn_cell_by_its_ratio() -> None:
    budget = Budget((0.5, 1.0), frozenset({("tiny", 1.0)}))

    def parse(*cells: dict) -> SecondDraw | None:
        return parse_second_draw({"seed": 6, "cells": list(cells)}, tune_seeds=[0], confirm_seeds=[],
                                 compared_seeds=[1, 2], sizes=["tiny", "mini"], budget=budget)

    drawn = parse({"model_size": "tiny", "tokens_per_param": 0.5}, {"model_size": "mini", "tokens_per_param": 1})
    assert drawn is not None and drawn.cells == (("tiny", 0.5), ("mini", 1.0)) and drawn.includes("mini", 1.0)
    with pytest.raises(OptBenchError, match="needs tokens_per_param, one of"):
        parse({"model_size": "tiny"})
    with pytest.raises(OptBenchError, match="excluded by budget.exclude"):
        parse({"model_size": "tiny", "tokens_per_param": 1})
    for tpp in (2, "abc", [0.5], "0.5"):  # "abc" was a ValueError, [0.5] a TypeError
        with pytest.raises(OptBenchError, match="is not the sweep's one data ratio"):
            parse_second_draw({"seed": 6, "cells": [{"model_size": "tiny", "tokens_per_param": tpp}]},
                              tune_seeds=[0], confirm_seeds=[], compared_seeds=[1], sizes=["tiny"],
                              budget=Budget((0.5,)))


# ------------------------------------------------------------------------------------------------ the draw
BEST = {0: {"adamw": 2.0, "muon": 8.0}, 6: {"adamw": 4.0, "muon": 8.0}}  # the tuning seed moves AdamW's optimum


def _finish(phase: SweepSpec, run: RunSpec, best_at: dict[int, dict[str, float]]) -> None:
    """A tuning run's summary: a bowl in log-rate around ``best_at[seed]`` (halving per doubling of the budget)."""
    d = phase.run_dir(run)
    d.mkdir(parents=True)
    p = parse_run_id(run.run_id)
    steps = int(run.args[len(run.args) - 1 - run.args[::-1].index("--max_steps") + 1])
    best = best_at[run.seed][run.optimizer] / (steps / STEPS) ** 0.5
    loss = 4.0 + 0.05 * math.log2(float(p["lr_multiplier"]) / best) ** 2
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "optimizer": run.optimizer, "model_size": run.model_size, "seed": run.seed,
        "learning_rate": run.learning_rate, "max_steps": steps, "final_tuning_loss": loss}))


def _tuned(spec: SweepSpec, best_at: dict[int, dict[str, float]] = BEST) -> None:
    assert spec.tuning is not None
    settle_tuning(spec, lambda run: _finish(spec.tuning, run, best_at))
    tune_phase(spec)
    attach_tuned_file(spec)


@pytest.mark.slow  # a sweep's tuning settled in-process (~3 s idle)
def test_the_draw_tunes_its_cell_again_and_reruns_only_the_runs_whose_values_changed(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"seed": 6, "cells": [{"model_size": "tiny"}]})
    _tuned(spec)
    draw = draw_spec(spec)
    assert draw.tuning is not None and draw.output_dir == spec.output_dir / "second_draw"
    assert {r.seed for r in draw.tuning.runs} == {6} and {r.optimizer for r in draw.tuning.runs} == {"adamw", "muon"}
    assert draw.tuning.output_dir == spec.output_dir / "second_draw" / "tuning"
    _tuned(draw)
    # the whole protocol again: AdamW's rungs are tuned at the draw's seed too, each around the draw's optimum
    drawn = yaml.safe_load((draw.output_dir / "tuned_hparams.yaml").read_text())
    main = yaml.safe_load((spec.output_dir / "tuned_hparams.yaml").read_text())
    assert drawn["adamw"]["tiny"]["multiplier"] == 4.0 and main["adamw"]["tiny"]["multiplier"] == 2.0
    assert sorted(r["budget_multiple"] for r in drawn["adamw"]["tiny"]["ladder"]) == [0.5, 2.0, 4.0]
    assert drawn["muon"]["tiny"]["learning_rate"] == main["muon"]["tiny"]["learning_rate"]
    said: list[str] = []
    runs = draw_comparison(spec, draw, said.append)
    # Muon's pick did not change: its runs are the main runs (not run again); every AdamW run moved (x1 and rungs)
    assert {r.optimizer for r in runs} == {"adamw"}
    assert sorted(r.run_id for r in runs) == sorted(r.run_id for r in spec.runs if r.optimizer == "adamw")
    assert all(r.args[r.args.index("--tuned_hparams_file") + 1] == str(draw.output_dir / "tuned_hparams.yaml")
               and r.args.count("--tuned_hparams_file") == 1 for r in runs)
    assert draw.runs == []  # the planner sets them as the draw's runs (study.sweep_plan)
    assert any(line.startswith("adamw/tiny: learning_rate ") and "2 run(s) again" in line for line in said)
    record = json.loads((draw.output_dir / CHANGES_FILE).read_text())
    assert record["seed"] == 6 and record["tuning_seeds"] == [0] and record["cells"] == [
        {"model_size": "tiny", "tokens_per_param": None}]
    x1 = next(c for c in record["changed"] if c["budget_multiple"] is None)
    assert x1["optimizer"] == "adamw" and x1["main"]["learning_rate"] * 2 == pytest.approx(
        x1["second_draw"]["learning_rate"]) and len(x1["runs"]) == 2
    # a run of an unchanged pick reads the same values from both files
    muon = next(r for r in spec.runs if r.optimizer == "muon")
    assert run_values(spec.tuned_file_for(None), muon) == run_values(draw.tuned_file_for(None), muon)


@pytest.mark.slow  # a sweep's tuning settled in-process (~3 s idle)
def test_a_draw_that_changes_nothing_reruns_nothing_and_says_every_shift_is_zero(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"seed": 6, "cells": [{"model_size": "tiny"}]})
    same = {0: BEST[0], 6: BEST[0]}
    _tuned(spec, same)
    draw = draw_spec(spec)
    _tuned(draw, same)
    said: list[str] = []
    assert draw_comparison(spec, draw, said.append) == []
    assert said == ["no tuned value changed at any drawn cell: every shift is exactly 0 (no comparison run again)"]
    assert json.loads((draw.output_dir / CHANGES_FILE).read_text())["changed"] == []


@pytest.mark.slow  # a sweep's tuning settled in-process (~3 s idle)
def test_a_dry_run_lists_the_draws_initial_grid(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"seed": 6, "cells": [{"model_size": "tiny"}]})
    log = io.StringIO()
    counts = run_sweep(spec.path, dry_run=True, stream=log)
    lines = [line.split()[0] for line in log.getvalue().splitlines()
             if line.strip() and not line.startswith("[sweep] ")]  # the closing line: study.eta's prediction
    assert "adamw__tiny__s6__lrx4" in lines and "muon__tiny__s6__lrx16" in lines and "adamw__tiny__s0__lrx4" in lines
    assert counts["pending"] == len(lines)
    assert not (spec.output_dir / "second_draw").exists()  # a dry run writes nothing


# ------------------------------------------------------------------------------------------ a whole sweep


@pytest.mark.slow  # ~40 stand-in runs, each its own interpreter
def test_a_sweep_with_a_second_draw_runs_it_after_the_comparison_and_restarts_without_rerunning(
        tmp_path: Path) -> None:
    from hf_optbench.optim.registry import optimizer_defaults
    from hf_optbench.rundir import read_state

    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    cited = {o: optimizer_defaults(o, "tiny")["learning_rate"] for o in ("adamw", "muon")}
    # AdamW's optimum at x2, but at x4 for the draw's tuning seed 6; Muon's at x4 for every seed
    best = {"adamw": {"lr": 2.0, "nm": 1.0}, "muon": {"lr": 4.0, "nm": 1.0},
            "seed 6": {"adamw": {"lr": 4.0, "nm": 1.0}, "muon": {"lr": 4.0, "nm": 1.0}}}
    repo = Path(__file__).resolve().parents[2]
    sweep = {"name": "draw", "base": str(repo / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 8, "tuning_blocks": 4},
             "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"], "seed": [1, 2]},
             "tune": {"lr_multipliers": [1, 2, 4, 8], "seed": [0], "confirm_seeds": [], "nonmatrix_multipliers": [],
                      "second_draw": {"seed": 6, "cells": [{"model_size": "tiny"}]}},
             "ladder": {"multiples": [0.5, 1, 2], "optimizer": "adamw", "max_multiple": 2},
             "launcher": {"type": "command", "command": ["{python}", str(fake)], "validate": False,
                          "env": {"FAKE_BEST": json.dumps(best), "FAKE_CITED": json.dumps(cited),
                                  "FAKE_SPEEDUP": json.dumps({"adamw": 1.0, "muon": 1.5})}}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    counts = run_sweep(path, stream=log)
    assert set(counts) == {"completed"}, log.getvalue()
    out = tmp_path / "out"
    draw = out / "second_draw"
    assert {p.name for p in (draw / "tuning" / "runs").iterdir()} >= {"adamw__tiny__s6__lrx4", "muon__tiny__s6__lrx4",
                                                                      "adamw__tiny__s6__lrx4__dx2"}
    assert yaml.safe_load((draw / "tuned_hparams.yaml").read_text())["adamw"]["tiny"]["multiplier"] == 4.0
    # AdamW's pick moved: its compared runs and rungs ran again (reading the draw's file); Muon's did not
    assert {p.name for p in (draw / "runs").iterdir()} == {
        f"adamw__tiny__s{s}{dx}" for s in (1, 2) for dx in ("", "__dx0.5", "__dx2")}
    assert "[sweep] second draw: adamw/tiny: learning_rate " in log.getvalue()
    record = json.loads((draw / CHANGES_FILE).read_text())
    assert {(c["optimizer"], c["budget_multiple"]) for c in record["changed"]} == {
        ("adamw", None), ("adamw", 0.5), ("adamw", 2.0)}
    starts = {d: len([r for r in read_state(d / "sweep_state.jsonl") if r["event"] == "start"])
              for d in (out, draw, draw / "tuning")}
    assert run_sweep(path, stream=io.StringIO()) == counts  # restarted: decides the same, runs nothing again
    assert starts == {d: len([r for r in read_state(d / "sweep_state.jsonl") if r["event"] == "start"])
                      for d in starts}
