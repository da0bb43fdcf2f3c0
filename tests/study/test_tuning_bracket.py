"""Tuning that brackets the optimum, weight decay tuned after the learning rate, and sensitivity as a result.

Most tests feed the tuner made-up results: a sweep with a ``tune:`` section is loaded, and each tuning run it asks
for gets a summary.json with a chosen ``final_tuning_loss`` (a known curve), so the extension rule is tested
without training. One test runs the whole sweep with a stand-in for ``hf_optbench.run`` (``launcher.type:
command``), interrupted and started again; one runs the real tiny model to show a run beyond the edge launches.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import OPTIMIZERS, optimizer_defaults
from hf_optbench.optim.tuned import lookup_tuned
from hf_optbench.report.sections.hyperparameters import lr_sensitivity, sensitivity_table
from hf_optbench.report.tuning_curves import bracketed_optima
from hf_optbench.run.plan import resolve_hyperparameters
from hf_optbench.rundir import parse_run_id, read_state
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.tuning import Replay, replay_axis
from hf_optbench.study.tuning_phase import tune_phase, tuning_additions

from fixtures.sweep_fixture import settle_tuning, tuning_spec

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- the rule itself
def _scores(losses: dict[float, float | None]) -> Callable[[float], dict[int, float]]:
    """One tuning seed's losses over a fixed curve: a point not in it has not run yet; math.inf: it diverged."""
    return lambda m: {0: losses[m]} if losses.get(m) is not None else {}


def _replay(name: str, grid: list[float], losses: Callable[[float], dict[int, float]], step: float, cap: int,
            floor: float | None = None):  # noqa: ANN202 - an Axis
    return replay_axis(name, grid, Replay(losses, step, cap, (0,), floor=floor))


def test_replay_extends_one_factor_2_step_beyond_the_edge_until_the_loss_rises() -> None:
    curve = {1.0: 5.0, 2.0: 4.8, 4.0: 4.6}
    axis = _replay("learning rate", [1, 2, 4], _scores(curve), 2.0, 3)
    assert axis.pending == [(8.0, (0,))] and axis.extensions == [8.0] and not axis.bracketed
    assert "upper edge" in axis.note and "adding x8 (extension 1 of at most 3)" in axis.note
    curve[8.0] = 4.7  # rises beyond the edge: x4 is bracketed
    axis = _replay("learning rate", [1, 2, 4], _scores(curve), 2.0, 3)
    assert axis.done and axis.bracketed and axis.best == 4.0 and axis.grid == [1.0, 2.0, 4.0, 8.0]
    # lower edge: one step below; every point diverged: below too (lower rates diverge less)
    assert _replay("lr", [1, 2, 4], _scores({1.0: 4.0, 2.0: 4.5, 4.0: 5.0}), 2.0, 3).pending == [(0.5, (0,))]
    diverged = _replay("lr", [1, 2, 4], _scores(dict.fromkeys([1.0, 2.0, 4.0], math.inf)), 2.0, 3)
    assert diverged.pending == [(0.5, (0,))] and "diverged or failed" in diverged.note
    # a diverged point beyond the edge counts as a rise
    assert _replay("lr", [1, 2], _scores({1.0: 5.0, 2.0: 4.0, 4.0: math.inf}), 2.0, 3).bracketed


def test_replay_stops_at_the_cap_unbracketed() -> None:
    falling = {m: 5.0 - math.log2(m) * 0.1 for m in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)}
    axis = _replay("learning rate", [1, 2, 4], _scores(falling), 2.0, 2)
    assert axis.done and not axis.bracketed and axis.best == 16.0 and axis.extensions == [8.0, 16.0]
    assert "after 2 extension(s) (tune.max_extensions 2): not bracketed" in axis.note
    assert _replay("learning rate", [1, 2, 4], _scores(falling), 2.0, 0).extensions == []


def test_weight_decay_below_its_lowest_point_tries_none_and_a_best_at_zero_is_bracketed_by_the_domain() -> None:
    """Lion at `tiny` (measured): the tuning loss kept falling as weight decay shrank, so factor-3 steps could never
    bracket it; its domain ends at 0, which the grid tries next."""
    falling = {1 / 3: 2.6269, 1.0: 2.6273, 3.0: 2.6317}
    axis = _replay("weight decay", [1 / 3, 1, 3], _scores({round(k, 6): v for k, v in falling.items()}), 3.0, 3,
                       floor=0.0)
    assert axis.pending == [(0.0, (0,))] and axis.extensions == [0.0]
    at_zero = _replay("weight decay", [1 / 3, 1, 3],
                          _scores({0.0: 2.6201, 0.333333: 2.6269, 1.0: 2.6273, 3.0: 2.6317}), 3.0, 3, floor=0.0)
    assert at_zero.done and at_zero.bracketed and at_zero.best == 0.0 and "edge of its domain" in at_zero.note
    between = _replay("weight decay", [1 / 3, 1, 3],
                          _scores({0.0: 2.6290, 0.333333: 2.6269, 1.0: 2.6273, 3.0: 2.6317}), 3.0, 3, floor=0.0)
    assert between.bracketed and between.best == 0.333333


# ------------------------------------------------------------------------------- made-up results on disk
def _spec(tmp_path: Path, tune: dict, optimizers: tuple[str, ...] = ("adamw",), extra: dict | None = None) -> SweepSpec:
    """A sweep of the tiny size; its tuning confirms no choice and tunes no group ratio unless ``tune`` asks
    (those have tests of their own, tests/study/test_tuning_phase.py)."""
    return tuning_spec(tmp_path, {"confirm_seeds": [], "nonmatrix_multipliers": [], **tune}, optimizers, extra=extra)


def _finish(spec: SweepSpec, run: RunSpec, loss: float | None) -> None:
    """A finished tuning run as a run leaves it: summary.json with the run's point and its tuning loss."""
    assert spec.tuning is not None
    d = spec.tuning.run_dir(run)
    d.mkdir(parents=True)
    args = run.args
    wd = float(args[args.index("--weight_decay") + 1]) if "--weight_decay" in args else None
    summary = {"status": "completed" if loss is not None else "diverged", "optimizer": run.optimizer,
               "model_size": run.model_size, "seed": run.seed, "learning_rate": run.learning_rate,
               "weight_decay": wd, "final_tuning_loss": loss}
    (d / "summary.json").write_text(json.dumps(summary))


Loss = Callable[[str, float, float | None], float | None]  # (optimizer, lr multiplier, wd multiplier) -> loss


def _settle(spec: SweepSpec, loss: Loss) -> list[str]:
    """The sweep's tuning loop, each run's loss from ``loss`` (its optimizer, lr and wd multipliers)."""
    return settle_tuning(spec, lambda run: _finish(spec, run, loss(run.optimizer, float(run.lr_multiplier or 0),
                                                                   parse_run_id(run.run_id).get("wd_multiplier"))))


def _bowl(best_lr: float, best_wd: float | None = None) -> Loss:
    """A loss with its minimum at lr multiplier ``best_lr`` (and wd multiplier ``best_wd``), rising both ways."""
    def loss(opt: str, lr: float, wd: float | None) -> float:
        extra = 0.0 if best_wd is None else 0.1 * math.log(float(wd or 1.0) / best_wd, 3) ** 2
        return 4.0 + 0.1 * math.log2(lr / best_lr) ** 2 + extra
    return loss


def test_best_at_the_upper_edge_adds_a_run_at_2x_beyond(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"lr_multipliers": [1, 2, 4], "seed": [0, 1]})
    assert spec.tuning is not None
    for run in spec.tuning.runs:
        _finish(spec, run, _bowl(16.0)("adamw", float(run.lr_multiplier or 0), None))
    said: list[str] = []
    added = tuning_additions(spec, said.append)
    assert tuning_additions(spec, [].append) == added  # the rule changes nothing: the planner adds the runs
    spec.tuning.runs.extend(added)
    assert [r.run_id for r in added] == ["adamw__tiny__s0__lrx8", "adamw__tiny__s1__lrx8"]
    argv = added[0].args
    assert float(argv[argv.index("--learning_rate") + 1]) == pytest.approx(8 * 1e-3)
    assert added[0].phase == "tune" and "--tuning_blocks=4" in argv and argv[argv.index("--run_name") + 1] == added[0].run_id
    assert said == ["adamw/tiny: best learning rate x4 is at the upper edge of [x1, x2, x4]: adding x8 (extension 1 "
                    "of at most 3)"]
    assert tuning_additions(spec, said.append) == [] and len(said) == 1  # nothing new until x8 has finished


def test_loss_rising_on_both_sides_stops_and_is_bracketed(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"lr_grid": {"low": 0.5, "high": 4}})
    assert spec.tune is not None and spec.tune.multipliers == [0.5, 1.0, 2.0, 4.0]
    assert _settle(spec, _bowl(2.0)) == []  # bracketed by the initial grid: nothing added
    (path,), warnings = tune_phase(spec)
    entry = yaml.safe_load(path.read_text())["adamw"]["tiny"]
    assert entry["multiplier"] == 2.0 and entry["bracketed"] is True and entry["extensions"] == [] and warnings == []
    assert "weight_decay" not in entry  # AdamW keeps its cited weight decay
    assert bracketed_optima(tmp_path / "out") == {("adamw", "tiny"): True}


def test_cap_reached_is_recorded_unbracketed_and_warned(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"lr_multipliers": [1, 2, 4], "max_extensions": 2})
    said = _settle(spec, _bowl(64.0))
    assert len(said) == 2 and "adding x16 (extension 2 of at most 2)" in said[1]
    (path,), warnings = tune_phase(spec)
    entry = yaml.safe_load(path.read_text())["adamw"]["tiny"]
    assert entry["multiplier"] == 16.0 and entry["grid"] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert entry["bracketed"] is False and entry["lr_bracketed"] is False and entry["extensions"] == [8.0, 16.0]
    assert len(warnings) == 1 and "not bracketed" in warnings[0] and "bracketed: false" in warnings[0]
    assert "# warning: adamw/tiny: best learning rate x16 is at the upper edge" in path.read_text()
    assert bracketed_optima(tmp_path / "out") == {("adamw", "tiny"): False}
    assert bracketed_optima(tmp_path / "out" / "tuning") == {("adamw", "tiny"): False}  # from the runs alone


def test_weight_decay_is_tuned_after_the_learning_rate_for_lion_only(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"lr_multipliers": [0.5, 1, 2], "seed": [0]}, optimizers=("adamw", "lion"))
    assert spec.tuning is not None
    loss = _bowl(1.0, 3.0)
    for run in spec.tuning.runs:
        if run.optimizer == "adamw" or run.lr_multiplier != 2.0:  # lion's learning-rate grid not finished yet
            _finish(spec, run, loss(run.optimizer, float(run.lr_multiplier or 0), None))
    assert tuning_additions(spec, print) == []  # no weight decay before its learning rate is settled
    _settle(spec, loss)
    ids = sorted(r.run_id for r in spec.tuning.runs)
    assert [i for i in ids if "wdx" in i] == ["lion__tiny__s0__lrx1__wdx0.333333", "lion__tiny__s0__lrx1__wdx3",
                                              "lion__tiny__s0__lrx1__wdx9"]
    wd9 = next(r for r in spec.tuning.runs if r.run_id.endswith("wdx9"))
    assert float(wd9.args[wd9.args.index("--weight_decay") + 1]) == pytest.approx(0.3 * 9)
    assert float(wd9.args[wd9.args.index("--learning_rate") + 1]) == pytest.approx(optimizer_defaults("lion", "tiny")
                                                                                    ["learning_rate"])
    (path,), _ = tune_phase(spec)
    tuned = yaml.safe_load(path.read_text())
    lion = tuned["lion"]["tiny"]
    assert lion["weight_decay"] == pytest.approx(0.9) and lion["wd_multiplier"] == 3.0 and lion["wd_bracketed"]
    assert lion["wd_grid"] == [0.333333, 1.0, 3.0, 9.0] and lion["bracketed"] is True
    assert [c["weight_decay"] for c in lion["wd_curve"]] == pytest.approx([0.1, 0.3, 0.9, 2.7])
    assert "weight_decay" not in tuned["adamw"]["tiny"]
    # a compared run reads both, and says where they came from
    spec_run = next(r for r in spec.runs if r.optimizer == "lion")
    cfg = parse_args(spec_run.args + ["--tuned_hparams_file", str(path), "--output_dir", str(tmp_path / "x"),
                                      "--use_cpu", "true"])
    chosen = resolve_hyperparameters(cfg)
    assert chosen["weight_decay"] == {"value": pytest.approx(0.9), "source": f"tuned: {path.name}"}
    assert chosen["learning_rate"]["source"] == f"tuned: {path.name}"


def test_weight_decay_set_by_the_sweep_is_not_tuned_and_said(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {"lr_multipliers": [0.5, 1, 2]}, optimizers=("lion",),
                 extra={"per_optimizer": {"lion": {"weight_decay": 0.5}}})
    _settle(spec, _bowl(1.0))
    assert spec.tuning is not None and not any("wdx" in r.run_id for r in spec.tuning.runs)
    (path,), warnings = tune_phase(spec)
    entry = yaml.safe_load(path.read_text())["lion"]["tiny"]
    assert "weight_decay" not in entry and "sets weight_decay" in entry["wd_not_tuned"]
    assert any("weight decay not tuned" in w for w in warnings)


def test_marked_optimizers_are_those_whose_cited_weight_decay_is_not_adamws() -> None:
    """The registry marks weight-decay tuning where the citation differs from AdamW's (Lion: 3x, Chen et al. 2023),
    never where there is none to scale (SGD's 0)."""
    for size_class in ("cpu", "125M"):
        adamw = optimizer_defaults("adamw", size_class)["weight_decay"]
        for name, spec in OPTIMIZERS.items():
            wd = optimizer_defaults(name, size_class)["weight_decay"]
            assert spec.tune_weight_decay == (wd != adamw and wd > 0), name
    assert OPTIMIZERS["lion"].tune_weight_decay and not OPTIMIZERS["adamw"].tune_weight_decay


def test_lookup_tuned_checks_the_weight_decay(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"lion": {"tiny": {"learning_rate": 1e-4, "weight_decay": 0.9}}}))
    assert lookup_tuned(str(path), "lion", "tiny")["weight_decay"] == 0.9
    path.write_text(yaml.safe_dump({"lion": {"tiny": {"learning_rate": 1e-4, "weight_decay": -0.1}}}))
    with pytest.raises(OptBenchError, match="weight_decay is -0.1"):
        lookup_tuned(str(path), "lion", "tiny")


@pytest.mark.parametrize("tune, match", [
    ({"lr_multipliers": [0.5, 1, 2], "lr_grid": {"low": 0.5, "high": 2}}, "one of them"),
    ({"lr_grid": {"low": 0.3, "high": 4}}, "powers of 2"),
    ({"lr_grid": {"low": 2, "high": 8}}, "low <= 1 <= high"),
    ({"lr_grid": [0.5, 2]}, "must be a mapping"),
    ({"lr_multipliers": [0.5, 1, 2], "max_extensions": -1}, "max_extensions"),
    ({"lr_multipliers": [0.5, 1, 2], "wd_multipliers": [0.5, 2]}, "wd_multipliers"),
])
def test_bad_tune_keys_fail_with_the_fix(tmp_path: Path, tune: dict, match: str) -> None:
    with pytest.raises(OptBenchError, match=match):
        _spec(tmp_path, tune)


# ------------------------------------------------------------------------------------------------ sensitivity
def test_sensitivity_width_on_a_known_curve() -> None:
    """Best 4.0 at x4; 1 % above it is 4.04. Lower end: between x2 (4.02) and x1 (4.10), at 1/4 of the way in log
    lr -> x2 / 2^0.25. Upper end: between x8 (4.00) and x16 (4.08), half-way -> x8 * 2^0.5."""
    s = lr_sensitivity({1.0: 4.10, 2.0: 4.02, 4.0: 4.0, 8.0: 4.0, 16.0: 4.08})
    assert s is not None and s.best == 4.0 and not s.at_least
    assert s.low == pytest.approx(2 / 2 ** 0.25) and s.high == pytest.approx(8 * 2 ** 0.5)
    assert s.width == pytest.approx(4 * 2 ** 0.75) and s.text() == "6.73x"
    edge = lr_sensitivity({1.0: 4.0, 2.0: 4.01, 4.0: None})  # up to x2, then a diverged point: only a bound
    assert edge is not None and edge.low_bound and edge.high_bound and edge.text() == "≥ 2x"
    assert lr_sensitivity({1.0: None, 2.0: None}) is None


def test_sensitivity_table_from_tuning_runs(tmp_path: Path) -> None:
    from hf_optbench.study.records import load_runs

    spec = _spec(tmp_path, {"lr_multipliers": [1, 2, 4], "max_extensions": 1})
    _settle(spec, _bowl(32.0))
    assert spec.tuning is not None
    header, rows = sensitivity_table(load_runs(spec.tuning.output_dir))
    assert header[:3] == ["optimizer", "size", "best lr multiplier"] and "final tuning loss" in header[3]
    # best x8 (4.4) at the extended grid's edge; 1 % above is 4.444, crossed 0.088 of the way to x4 (4.9) in log lr
    assert rows == [["adamw", "tiny", "x8", "x7.53 – ≥ x8", "≥ 1.06x", "**no**: the best is at an edge of the grid"]]


# ---------------------------------------------------------------------------- the sweep, stopped and restarted
FAKE_RUN = r'''
import argparse, json, math, os, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--run_name", "--tuned_hparams_file"):
    p.add_argument(k)
p.add_argument("--seed", type=int)
p.add_argument("--learning_rate", type=float)
p.add_argument("--weight_decay", type=float)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "argv.json").write_text(json.dumps(sys.argv[1:]))
key = a.optimizer + "/" + a.model_size
lr, wd = a.learning_rate, a.weight_decay
if lr is None:  # a compared run: as run.plan.resolve_hyperparameters reads the tuned file
    import yaml
    entry = yaml.safe_load(open(a.tuned_hparams_file))[a.optimizer][a.model_size]
    lr, wd = entry["learning_rate"], entry.get("weight_decay")
if wd is None:
    wd = json.loads(os.environ["FAKE_CITED_WD"])[key]
best_lr, best_wd = json.loads(os.environ["FAKE_BEST"])[key]
loss = 4.0 + 0.1 * math.log2(lr / best_lr) ** 2 + 0.1 * math.log(wd / best_wd, 3) ** 2 + 0.001 * a.seed
summary = {"status": "completed", "optimizer": a.optimizer, "model_size": a.model_size, "seed": a.seed,
           "learning_rate": lr, "weight_decay": wd, "final_eval_loss": loss, "final_tuning_loss": loss}
(out / "summary.json").write_text(json.dumps(summary))
'''


def test_a_sweep_stopped_mid_extension_continues_exactly(tmp_path: Path) -> None:
    """adamw's best is x16 of a [1, 2, 4] grid (three extensions: x8, x16, then x32 rises), lion's x0.5 (two: x0.5,
    x0.25) and its weight decay x3 (x9 rises). The sweep stops after 8 runs, mid-extension; started again it adds
    exactly the runs still needed (each run starts once), tunes lion's weight decay only once its learning rate is
    settled, and compares at the tuned values."""
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    cited = {o: optimizer_defaults(o, "tiny") for o in ("adamw", "lion")}
    best = {"adamw/tiny": [cited["adamw"]["learning_rate"] * 16, 0.1],
            "lion/tiny": [cited["lion"]["learning_rate"] * 0.5, 0.3 * 3]}
    sweep = {"name": "restart", "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 4, "tuning_blocks": 4},
             "matrix": {"optimizer": ["adamw", "lion"], "model_size": ["tiny"], "seed": [1, 2]},
             "tune": {"lr_multipliers": [1, 2, 4], "seed": [0], "confirm_seeds": [], "nonmatrix_multipliers": []},
             "launcher": {"type": "command", "command": ["{python}", str(fake)], "validate": False,
                          "env": {"FAKE_BEST": json.dumps(best), "FAKE_CITED_WD": json.dumps(
                              {f"{o}/tiny": cited[o]["weight_decay"] for o in cited})}}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    first = run_sweep(path, max_runs=8, stream=log)
    assert first["completed"] == 8 and first["pending"] > 0
    assert "adamw/tiny: best learning rate x4 is at the upper edge of [x1, x2, x4]: adding x8" in log.getvalue()
    assert run_sweep(path, stream=log) == {"completed": 14 + 4}
    out = tmp_path / "out"
    starts = [r["run_id"] for r in read_state(out / "tuning" / "sweep_state.jsonl") if r["event"] == "start"]
    assert len(starts) == len(set(starts)) == 14
    assert sorted(starts) == sorted(
        [f"adamw__tiny__s0__lrx{m:g}" for m in (1, 2, 4, 8, 16, 32)]
        + [f"lion__tiny__s0__lrx{m:g}" for m in (0.25, 0.5, 1, 2, 4)]
        + [f"lion__tiny__s0__lrx0.5__wdx{w}" for w in ("0.333333", "3", "9")])
    rows = read_state(out / "tuning" / "sweep_state.jsonl")
    lion_lr_end = max(r["time"] for r in rows if r["event"] == "end" and r["run_id"].startswith("lion")
                      and "wdx" not in r["run_id"])
    assert min(r["time"] for r in rows if r["event"] == "start" and "wdx" in r["run_id"]) >= lion_lr_end
    tuned = yaml.safe_load((out / "tuned_hparams.yaml").read_text())
    assert tuned["adamw"]["tiny"]["multiplier"] == 16.0 and tuned["adamw"]["tiny"]["extensions"] == [8.0, 16.0, 32.0]
    assert tuned["lion"]["tiny"]["multiplier"] == 0.5 and tuned["lion"]["tiny"]["wd_multiplier"] == 3.0
    assert all(tuned[o]["tiny"]["bracketed"] for o in ("adamw", "lion"))
    for seed in (1, 2):
        summary = json.loads((out / "runs" / f"lion__tiny__s{seed}" / "summary.json").read_text())
        assert summary["weight_decay"] == pytest.approx(0.9)
        assert summary["learning_rate"] == tuned["lion"]["tiny"]["learning_rate"]
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 18}  # finished: nothing runs again
    assert len([r for r in read_state(out / "tuning" / "sweep_state.jsonl") if r["event"] == "start"]) == 14


# ----------------------------------------------------------------------------------------- the real tiny model
@pytest.mark.slow  # ~27 s on the 2-core machine under load: two warm-worker starts (~10 s of imports each)
def test_the_tiny_model_really_runs_beyond_the_edge(tmp_path: Path) -> None:
    """hf_optbench.run itself, 4 steps of the tiny model: with x0.001 and x0.01 of the cited rate the model barely
    moves, so x1 wins at the grid's upper edge and the tuner launches x2, a real run that completes."""
    sweep = {"name": "tiny", "base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 4, "data_source": "synthetic", "block_size": 32,
                           "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "validation_blocks": 4,
                           "tuning_blocks": 4, "eval_steps": 4, "warmup_steps": 0, "save_strategy": "no",
                           "data_cache_dir": str(tmp_path / "cache")},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [1]},
             "tune": {"lr_multipliers": [0.001, 0.01, 1], "max_extensions": 1},
             # one run at a time: one warm worker for both rounds (two at once would start one per slot, and a
             # third for the one-run round, pinned differently)
             "launcher": {"type": "python", "jobs": 1, "env": {"OMP_NUM_THREADS": "1"}}, "calibration": False}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    counts = run_sweep(path, max_runs=4, stream=log)  # the tuning only: the comparison is not this test's subject
    assert counts.get("completed") == 4, log.getvalue()
    summary = json.loads((tmp_path / "out/tuning/runs/adamw__tiny__s0__lrx2/summary.json").read_text())
    assert summary["status"] == "completed" and summary["learning_rate"] == pytest.approx(2e-3)
    assert summary["final_tuning_loss"] is not None
    assert "adding x2 (extension 1 of at most 1)" in log.getvalue()


def test_the_report_counts_a_best_weight_decay_of_zero_as_bracketed() -> None:
    from hf_optbench.report.tuning_curves import bracketed_from_records

    def rec(lr: float, wd: float | None, loss: float) -> dict:
        rid = f"lion__tiny__s0__lrx{lr:g}" + ("" if wd is None else f"__wdx{wd:g}")
        return {"run_id": rid, "optimizer": "lion", "model_size": "tiny", "lr_multiplier": lr, "wd_multiplier": wd,
                "status": "completed", "final_tuning_loss": loss}

    lr_curve = [rec(4, None, 2.70), rec(8, None, 2.6273), rec(16, None, 2.76)]
    at_zero = lr_curve + [rec(8, 0.0, 2.6213), rec(8, 1 / 3, 2.6269), rec(8, 3.0, 2.6317)]
    assert bracketed_from_records(at_zero)[("lion", "tiny")]
    at_edge = lr_curve + [rec(8, 1 / 3, 2.6269), rec(8, 3.0, 2.6317)]  # 0 not tried: x1/3 is only the grid's edge
    assert not bracketed_from_records(at_edge)[("lion", "tiny")]
