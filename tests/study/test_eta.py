"""The sweep's ETA from its structure: the runs it will add (extensions, later axes, rung tuning, attribution), the
budget multiples of the ladder, the step and run costs the runs measure, the runs at once."""

from __future__ import annotations

import dataclasses
import heapq
from pathlib import Path

import pytest

from hf_optbench.rundir import run_id_for
from hf_optbench.study import eta
from hf_optbench.study.calibration import settings
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, attach_tuned_file, load_sweep

DEMO = Path(__file__).resolve().parents[2] / "recipes" / "sweeps" / "cpu_demo.yaml"
DEMO_AS_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "cpu_demo_85db3b8.yaml"  # the rounds replayed below


@pytest.fixture(scope="module")
def demo() -> SweepSpec:
    return load_sweep(DEMO, "/nonexistent/eta-demo")


def test_the_demo_s_structure(demo: SweepSpec) -> None:
    """From the file alone: every optimizer's learning-rate grid (4 points) and its expected extensions, Lion's
    weight decay and AdamW's and Muon's non-matrix ratio less their x1 point, AdamW's four rungs of three points at
    their own budgets, Muon's attribution at the five comparison seeds, at each of the two ratios."""
    s = eta.structure(demo)
    e = eta.EXPECTED_EXTENSIONS
    for tpp in (0.5, 1.0):
        base = demo.steps[("tiny", "adamw", tpp)]
        for opt in ("adamw", "lion", "muon", "adafactor"):
            assert s.expected[("tune", opt, "tiny", tpp, "lr", None)] == 4 + e
        assert s.expected[("tune", "lion", "tiny", tpp, "wd", None)] == 2 + e
        assert s.expected[("tune", "adamw", "tiny", tpp, "nm", None)] == s.expected[("tune", "muon", "tiny", tpp, "nm",
                                                                                     None)] == 2 + e
        assert ("tune", "adafactor", "tiny", tpp, "nm", None) not in s.expected
        for dx in (0.5, 2.0, 4.0):
            assert s.expected[("tune", "adamw", "tiny", tpp, "rung", dx)] == 3 + e
            assert s.steps[("tune", "adamw", "tiny", tpp, "rung", dx)] == round(dx * base)  # a 4x rung: 4x the steps
            assert s.expected[("compare", "adamw", "tiny", tpp, None, dx)] == 5
        assert s.expected[("attribution", "muon", "tiny", tpp, None, None)] == 5
        assert [k for k in s.expected if k[0] == "attribution" and k[3] == tpp] == [
            ("attribution", "muon", "tiny", tpp, None, None)]
    assert s.tuning_levels == 3  # the learning rate; weight decay or the ratio; the rungs


def test_a_second_tuning_draw_counts_its_tuning_and_a_share_of_the_comparison(demo: SweepSpec) -> None:
    """tune.second_draw (issue 40) at the 1 token/param cell: that cell's every tuning axis once more, and
    EXPECTED_DRAW_RERUN of its comparison runs; the 0.5 tokens/param cell is as without a draw."""
    from hf_optbench.study.second_draw import SecondDraw

    plain = eta.structure(demo)
    drawn = eta.structure(dataclasses.replace(demo, second_draw=SecondDraw(seed=6, cells=(("tiny", 1.0),))))
    assert {k: v for k, v in drawn.expected.items() if not k[0].startswith(eta.DRAW)} == plain.expected
    draw_keys = {k for k in drawn.expected if k[0].startswith(eta.DRAW)}
    for key, count in plain.expected.items():
        as_drawn = (eta.DRAW + key[0], *key[1:])
        if key[3] == 0.5 or key[0] == "attribution":
            assert as_drawn not in draw_keys, key
        elif key[0] == "tune":  # one tuning seed, then the draw's, in groups of its own
            assert drawn.expected[as_drawn] == count and drawn.steps[as_drawn] == plain.steps[key], key
        else:
            assert drawn.expected[as_drawn] == pytest.approx(count * eta.EXPECTED_DRAW_RERUN), key
    assert {k[0] for k in draw_keys} == {"draw-tune", "draw-compare"}


def test_the_eta_keeps_the_second_draw_after_the_main_phases_settle(demo: SweepSpec) -> None:
    """The CPU study of 2026-11-27 read "sweep ETA 0:00:42" (its calibration alone) for the last 13 minutes: the
    draw's tuning counted in the main tuning's groups, dropped when those settled, and its comparison reruns carry
    the ids of runs the main comparison had finished. Now: once every main run is done, what is left is the draw's
    expected work; its runs count as they begin, apart from the main runs of the same ids, down to the calibration."""
    from hf_optbench.study.second_draw import SecondDraw

    spec = dataclasses.replace(demo, second_draw=SecondDraw(seed=6, cells=(("tiny", 1.0),)),
                               tuning=dataclasses.replace(demo.tuning, runs=list(demo.tuning.runs)))
    for run in spec.tuning.runs + spec.runs:
        run.max_steps = round(spec.steps[("tiny", run.optimizer, run.budget_tpp)] * (run.budget_multiple or 1))
    p = eta.Predictor(spec, {(o, "tiny"): 0.005 for o in ("adamw", "lion", "muon", "adafactor")}, None, jobs=1)
    everything = spec.tuning.runs + spec.runs
    p.begin_phase(everything, everything)
    for phase in ("tune", "compare", "attribution"):
        p.settle(phase)
    left = p.remaining()
    s = p.structure
    cost = p.cost
    expected = sum(n * cost.run_s(k[1], k[2], s.steps[k]) for k, n in s.expected.items() if k[0].startswith(eta.DRAW))
    assert left == pytest.approx(expected, rel=0.3) and left > 60  # the draw's whole tuning and a share of reruns
    # the draw's tuning begins: its first round's runs are counted as themselves, not as the main tuning's
    drawn = [dataclasses.replace(r, run_id=r.run_id.replace("__s0__", "__s6__"), seed=6)
             for r in spec.tuning.runs if r.budget_tpp == 1.0]
    p.begin_draw()
    p.begin_phase(drawn, [])
    assert p.remaining() >= left - 1e-6
    for run in drawn:
        p.started(run)
        p.ended(run, 3.0, {"train_runtime_s": 2.0, "steps": run.max_steps})
    p.settle("draw-tune")
    reruns = [r for r in spec.runs if r.budget_tpp == 1.0 and r.optimizer == "adamw"]  # ids the main run finished
    p.begin_phase(reruns, [])
    p.settle("draw-compare")
    before = p.remaining()
    assert before == pytest.approx(sum(cost.run_s(r.optimizer, "tiny", r.max_steps) for r in reruns), rel=0.01)
    for run in reruns:
        p.started(run)
        p.ended(run, 3.0, None)
    assert p.remaining() == 0.0


def test_costs_come_from_the_runs_then_from_the_plain_step_plus_what_the_runs_add() -> None:
    cost = eta.CostModel(plain={("adamw", "tiny"): 0.004, ("muon", "tiny"): 0.010})
    assert cost.step("muon", "tiny") == pytest.approx(0.010 * eta.PRIOR_STEP_SCALE)
    assert cost.fixed_s() == eta.PRIOR_FIXED_S
    # AdamW measured: 391 steps in 3.128 s (8 ms a step, 4 ms beyond the plain step) in a run of 5.0 s that also
    # built the data cache (1.5 s): 0.372 s fixed
    cost.observe("adamw", "tiny", 5.0, {"train_runtime_s": 3.128, "steps": 391,
                                         "data": {"cache_hit": False, "build_seconds": 1.5}})
    assert cost.step("adamw", "tiny") == pytest.approx(0.008)
    assert cost.step("muon", "tiny") == pytest.approx(0.014)  # its own plain step + the runs' 4 ms
    assert cost.fixed_s() == pytest.approx(0.372)
    assert cost.run_s("adamw", "tiny", 4 * 391) == pytest.approx(0.372 + 4 * 3.128)
    assert cost.step("lion", "tiny") == pytest.approx((0.008 + 0.014) / 2)  # unmeasured: the size's others
    cost.observe("adamw", "tiny", 9.0, {"train_runtime_s": "?", "steps": 391})  # unreadable: ignored
    assert cost.step("adamw", "tiny") == pytest.approx(0.008)


def _tuning_run(opt: str, lr: float, tpp: float, steps: int, wd: float | None = None, nm: float | None = None,
                dx: float | None = None) -> RunSpec:
    rid = run_id_for(opt, "tiny", 0, lr, wd_multiplier=wd, nonmatrix_multiplier=nm, budget_multiple=dx, budget_tpp=tpp)
    run = RunSpec(rid, opt, "tiny", 0, lr, [], phase="tune", budget_multiple=dx, budget_tpp=tpp)
    run.max_steps = round(steps * (dx or 1))
    return run


def _demo_rounds(demo: SweepSpec) -> list[list[RunSpec]]:
    """The tuning rounds the demo ran at commit 85db3b8 (its report's tuning tables: 32, 10, 7, 27 and 5 runs)."""
    s = {tpp: demo.steps[("tiny", "adamw", tpp)] for tpp in (1.0, 2.0)}
    t = _tuning_run
    return [
        [],
        [t("muon", 16, tpp, s[tpp]) for tpp in s] + [t("lion", 4, tpp, s[tpp], wd=w) for tpp in s for w in (1 / 3, 3)]
        + [t("adamw", 4, tpp, s[tpp], nm=n) for tpp in s for n in (0.5, 2)],
        [t("muon", 32, 1.0, s[1.0]), t("lion", 4, 1.0, s[1.0], wd=9), t("lion", 4, 2.0, s[2.0], wd=9),
         t("adamw", 4, 1.0, s[1.0], nm=4), t("adamw", 4, 2.0, s[2.0], nm=4), t("muon", 8, 2.0, s[2.0], nm=0.5),
         t("muon", 8, 2.0, s[2.0], nm=2)],
        [t("adamw", m, tpp, s[tpp], nm=4, dx=dx) for tpp in s for dx in (0.25, 0.5, 2, 4) for m in (2, 4, 8)]
        + [t("muon", 16, 1.0, s[1.0], nm=0.5), t("muon", 16, 1.0, s[1.0], nm=2), t("muon", 8, 2.0, s[2.0], nm=0.25)],
        [t("adamw", 16, tpp, s[tpp], nm=4, dx=dx) for tpp, dx in ((1.0, 0.25), (1.0, 0.5), (2.0, 0.25), (2.0, 0.5),
                                                                  (1.0, 4))],
    ]


def test_the_first_eta_of_a_simulated_demo_is_within_a_quarter_of_its_end() -> None:
    """The demo as it ran (171 runs, 5 tuning rounds, comparison, attribution) on 2 slots, each run costing a fixed
    part plus its steps x its optimizer's step (AdamW 8.7, Lion 9.4, Muon 16.1, Adafactor 12.1 ms: the committed
    demo's runs), the plain steps 4 ms less: the ETA after the first two runs and at every later run lies within
    25 % of the simulated end (issue 38's target), and it counts down to the calibration."""
    demo = load_sweep(DEMO_AS_RUN, "/nonexistent/eta-demo-sim")  # its own: the simulation adds runs
    step = {"adamw": 0.0087, "lion": 0.0094, "muon": 0.0161, "adafactor": 0.0121}
    fixed = 1.3
    plain = {(o, "tiny"): t - 0.004 for o, t in step.items()}
    for run in demo.tuning.runs + demo.runs:
        run.max_steps = round(demo.steps[("tiny", run.optimizer, run.budget_tpp)] * (run.budget_multiple or 1))
    p = eta.Predictor(demo, plain, settings(demo), jobs=2)
    clock, seen = 0.0, []

    def phase(runs: list[RunSpec], known: list[RunSpec]) -> None:
        nonlocal clock
        p.begin_phase(known, [r for r in known if r not in runs])
        queue, slots = list(runs), []
        while queue or slots:
            while queue and len(slots) < 2:
                run = queue.pop(0)
                p.started(run)
                heapq.heappush(slots, (clock + fixed + run.max_steps * step[run.optimizer], id(run), run))
            clock, _, run = heapq.heappop(slots)
            p.ended(run, fixed + run.max_steps * step[run.optimizer],
                    {"train_runtime_s": run.max_steps * step[run.optimizer], "steps": run.max_steps})
            seen.append((clock, p.remaining()))

    for i, new in enumerate(_demo_rounds(demo)):
        demo.tuning.runs.extend(new)
        phase(new if i else list(demo.tuning.runs), demo.tuning.runs)
    p.settle("tune")
    attach_tuned_file(demo)
    phase(list(demo.runs), demo.runs)
    attribution = [dataclasses.replace(r, phase="attribution") for r in demo.runs if r.optimizer == "muon"]
    phase(attribution, attribution)
    p.settle("attribution")
    p.settle("compare")
    assert len(seen) == 171
    calibration = p.remaining()
    end = clock + calibration
    assert 0 < calibration < 30  # the demo's calibration, well under 30 s
    first_at, first_eta = seen[1]
    assert abs(first_at + first_eta - end) <= 0.25 * end, (first_at + first_eta, end)
    assert all(abs(at + left - end) <= 0.25 * end for at, left in seen)


def test_the_progress_line_carries_the_predictor_s_eta(tmp_path: Path) -> None:
    """Every run's start and end line says the sweep's ETA from the predictor, told of each run that starts and ends
    (its summary.json read from the phase's run directory)."""
    import io
    import json

    from hf_optbench.study.sweep_state import Progress

    class Spy:
        jobs = 1

        def __init__(self) -> None:
            self.events: list[tuple[str, str, object]] = []

        def begin_phase(self, runs, finished):
            self.events.append(("begin", str(len(runs)), len(list(finished))))

        def started(self, run):
            self.events.append(("started", run.run_id, None))

        def ended(self, run, duration, summary):
            self.events.append(("ended", run.run_id, summary))

        def remaining(self):
            return 125.0

    spy, out = Spy(), io.StringIO()
    progress = Progress(0, 0, out, predictor=spy)
    progress.jobs = 2
    run = RunSpec("adamw__tiny__s0", "adamw", "tiny", 0, None, [])
    phase = SweepSpec(Path("sweep.yaml"), Path("base.yaml"), tmp_path, {}, {}, {}, {"type": "python"}, runs=[run])
    (tmp_path / "runs" / run.run_id).mkdir(parents=True)
    (tmp_path / "runs" / run.run_id / "summary.json").write_text(json.dumps({"steps": 3, "train_runtime_s": 1.0}))
    progress.begin_phase(0, 0, 1, phase=phase, finished=[])
    progress.started(run, [run])
    progress.ended(run, "completed", 2.0)
    assert spy.jobs == 2
    assert spy.events == [("begin", "1", 0), ("started", run.run_id, None),
                          ("ended", run.run_id, {"steps": 3, "train_runtime_s": 1.0})]
    assert out.getvalue().count("sweep ETA 0:02:05") == 2


@pytest.mark.slow
def test_dry_run_prints_the_predicted_wall_time_from_a_measurement_here(tmp_path: Path) -> None:
    """``hf-optbench sweep FILE --dry_run``: the runs, then one line with the predicted wall time, the runs expected
    (the tuning's later axes included), the step measured here per optimizer; nothing launched or written."""
    import io

    import yaml

    from hf_optbench.study.sweep import run_sweep

    quick = str(DEMO.parents[1] / "quickstart_cpu.yaml")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "base": quick, "output_dir": str(tmp_path / "out"),
        "overrides": {"data_source": "synthetic", "block_size": 16, "per_device_train_batch_size": 2,
                      "max_steps": 5, "tuning_blocks": 4},
        "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"], "seed": [1, 2]},
        "tune": {"lr_multipliers": [0.5, 1, 2], "confirm_seeds": []},
        "launcher": {"type": "python", "env": {"OMP_NUM_THREADS": "1"}}}))
    out = io.StringIO()
    counts = run_sweep(path, dry_run=True, stream=out)
    assert counts == {"pending": 6 + 4}
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("[sweep] predicted wall time")]
    # known: 6 grid points, 4 compared runs; expected besides: each optimizer's learning-rate extensions (0.6) and
    # non-matrix ratio (the default grid's 3 points beyond x1, + 0.6), Muon's attribution at the 2 seeds: 20.4
    assert "10 known now" in line and "~20 runs" in line
    assert "adamw/tiny" in line and "muon/tiny" in line and "calibration at the end" in line
    assert line.split("machine: ")[1].split()[0].count(":") == 2  # H:MM:SS, not "?"
    assert not (tmp_path / "out").exists()


def test_the_warm_worker_s_start_is_counted_until_the_first_run_starts(demo: SweepSpec) -> None:
    """The sweep's start-up is part of its wall time: the prediction before the first run includes the warm
    worker's start (a prior from benchmarks/results/run_overhead.md), which is behind it once a run has started."""
    plain = {(o, "tiny"): 0.005 for o in ("adamw", "lion", "muon", "adafactor")}
    without = eta.Predictor(demo, plain, None, jobs=1)
    with_start = eta.Predictor(demo, plain, None, jobs=1, startup_s=eta.PRIOR_WORKER_START_S)
    assert with_start.remaining() == pytest.approx(without.remaining() + eta.PRIOR_WORKER_START_S)
    assert "the warm worker's start ~4.1 s" in with_start.describe() and "warm worker" not in without.describe()
    first = demo.tuning.runs[0]
    with_start.started(first)
    without.started(first)
    assert with_start.remaining() == pytest.approx(without.remaining())
