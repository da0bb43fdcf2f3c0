"""The sweep file's ``report:`` section and the dry run's seed plan (``--target_trend``, ``--power_from``)."""

from __future__ import annotations

import csv
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from hf_optbench.errors import OptBenchError
from hf_optbench.measure.primary import Question, ReportSpec, seeds_for_trend, slope_sd, trend_mde
from hf_optbench.study.power_plan import data_design, plan_power, point_sd_from
from hf_optbench.study.sweep_manifest import manifest
from hf_optbench.study.sweep_spec import load_sweep

from fixtures.installed import hf_optbench_command

QUICK = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart_cpu.yaml")


def _sweep(tmp_path: Path, **extra: object) -> Path:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": QUICK, "output_dir": str(tmp_path / "sw"), "launcher": {"type": "python"},
        "matrix": {"optimizer": ["adamw", "muon"], "model_size": ["tiny"], "seed": [1, 2]}, **extra}))
    return sweep


def test_the_report_section_is_read_checked_and_recorded_in_the_manifest(tmp_path: Path) -> None:
    assert load_sweep(_sweep(tmp_path)).report == ReportSpec()
    spec = load_sweep(_sweep(tmp_path, report={"primary": ["final_eval_loss along size"], "include_transient": True}))
    assert spec.report == ReportSpec((Question("final_eval_loss", "size"),), True)
    assert manifest(spec)["report"] == {"primary": ["final_eval_loss along size"], "include_transient": True}
    with pytest.raises(OptBenchError, match="report.primary: 'speedup along seeds'"):
        load_sweep(_sweep(tmp_path, report={"primary": ["speedup along seeds"]}))


def _summary(path: Path, spread: float, seeds: int = 6) -> Path:
    """A report's summary.csv: muon's speedup at three ratios, each seed's ln(speedup) off by a known amount; the
    baseline's rows and a bound, which the plan leaves out."""
    offsets = [spread * (i - (seeds - 1) / 2) for i in range(seeds)]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["optimizer", "model_size", "budget_tpp", "seed", "status", "speedup", "speedup_bound",
                                "budget_multiple", "lr_multiplier"])
        w.writeheader()
        for tpp in (1, 3.2, 10):
            for s, off in enumerate(offsets):
                w.writerow({"optimizer": "muon", "model_size": "tiny", "budget_tpp": tpp, "seed": s,
                            "status": "completed", "speedup": 2 * math.exp(off)})
                w.writerow({"optimizer": "adamw", "model_size": "tiny", "budget_tpp": tpp, "seed": s,
                            "status": "completed", "speedup": 1.0})
            w.writerow({"optimizer": "muon", "model_size": "tiny", "budget_tpp": tpp, "seed": 99,
                        "status": "completed", "speedup": 4, "speedup_bound": "lower"})
    return path


def test_the_plan_reads_the_seed_spread_and_gives_the_fewest_seeds(tmp_path: Path) -> None:
    summary = _summary(tmp_path / "summary.csv", 0.05)
    sd, cells = point_sd_from(summary)
    offsets = [0.05 * (i - 2.5) for i in range(6)]
    assert cells == 3 and sd == pytest.approx(math.sqrt(sum(o * o for o in offsets) / 5))
    plan = plan_power((1.0, 3.2, 10.0), optimizers=5, sizes=2, seeds=5, source=summary, target=0.25)
    assert plan.primary_cells == 5 * 2 + 5 * 3
    level, spread = 0.05 / plan.primary_cells / 2, slope_sd(sd, [0.0, math.log10(3.2), 1.0])
    assert plan.seeds_needed == seeds_for_trend(0.25, spread, level, plan.threshold)
    assert plan.mde == pytest.approx(trend_mde(spread, 5, level, plan.threshold))
    assert f"a trend of 0.25 needs {plan.seeds_needed} seeds" in plan.describe()
    data_only = plan_power((1.0, 3.2, 10.0), optimizers=5, sizes=2, seeds=5, source=summary, target=0.25,
                           size_cells=0)  # the primary questions leave the size axis out: a smaller family
    assert data_only.primary_cells == 5 * 2 and data_only.seeds_needed <= plan.seeds_needed
    assert data_only.mde == pytest.approx(trend_mde(spread, 5, 0.05 / 10 / 2, plan.threshold))
    assert "(1 decade, trend threshold" in data_only.describe()
    # 24 over 2.4 is 1.0000000000000002 decades in floats: still one decade as printed
    assert "(1 decade, trend threshold" in plan_power((2.4, 7.6, 24.0), 5, 2, 5, summary, 0.25).describe()
    with pytest.raises(OptBenchError, match="at least two data ratios"):
        plan_power((1.0,), 5, 2, 5, summary, 0.25)
    with pytest.raises(OptBenchError, match="no summary.csv there"):
        plan_power((1.0, 10.0), 5, 2, 5, tmp_path / "nowhere", 0.25)


@pytest.mark.parametrize("flags, says", [
    (["--target_trend", "0.1", "--power_from", "x.csv"], "add --dry_run"),
    (["--dry_run", "--target_trend", "0.1"], "--target_trend needs --power_from"),
])
def test_the_plan_flags_are_refused_in_one_line_where_they_mean_nothing(tmp_path: Path, flags: list[str],
                                                                       says: str) -> None:
    done = subprocess.run([str(hf_optbench_command()), "sweep", str(_sweep(tmp_path)), *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_design_is_the_size_whose_ratios_span_least_and_counts_the_shared_ratios() -> None:
    """Each size's own ratios: the plan is for the narrower span (then the fewer ratios); a ratio two sizes share
    counts once, as one size-axis cell per optimizer."""
    cells = [("tiny", 1.0), ("tiny", 2.0), ("tiny", 4.0), ("mini", 1.0), ("mini", 2.0), ("mini", 4.0), ("mini", 8.0),
             ("tiny", 1.0)]
    assert data_design(cells) == ((1.0, 2.0, 4.0), 3)
    assert data_design([("a", 1.0), ("a", 4.0), ("b", 1.0), ("b", 2.0), ("b", 4.0)]) == ((1.0, 4.0), 2)
    assert data_design([]) == ((), 0)
