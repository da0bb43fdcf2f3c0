"""Issue 40's time to quality on constructed calibration files: the speedup in time is the token speedup over the
step-time ratio, its interval the token interval over the ratio's interval (paired by round, the spread pooled);
a missing, malformed or other-shape calibration, or one that timed another Newton-Schulz precision than the runs,
is said, never guessed. Two calibrations drawn from one noisy machine give the same word at a stated rate."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.measure.step_ratio import StepRatio, more_rounds, step_ratios
from hf_optbench.measure.verdict import SizeComparison
from hf_optbench.report.sections.time_to_quality import (
    CALIBRATION_FILE,
    read_calibration,
    step_ratio,
    time_line,
    time_speedup,
)

from fixtures.study_fixture import add_calibration, round_medians


def _point(speedup: float, low: float, high: float) -> SizeComparison:
    return SizeComparison("tiny", 1e5, -math.log(speedup), 0.1, -math.log(high), -math.log(low), "ahead", 5, 0.0,
                          0.0, margin=math.log(1.03), higher_is_better=True)


def _ratio(value: float, low: float, high: float) -> StepRatio:
    return StepRatio(value, low, high, 3, 0.1, 6)


def test_the_speedup_in_time_divides_by_the_step_ratio_and_its_interval() -> None:
    p = _point(2.0, 1.6, 2.5)
    value, low, high, where = time_speedup(p, _ratio(1.6, 1.5, 1.7))
    assert value == pytest.approx(1.25) and low == pytest.approx(1.6 / 1.7) and high == pytest.approx(2.5 / 1.5)
    assert where == "no difference"  # 0.94 to 1.67 straddles 1
    assert time_speedup(_point(2.0, 1.9, 2.1), _ratio(1.2, 1.1, 1.3))[3] == "ahead"
    assert time_speedup(_point(1.1, 1.05, 1.15), _ratio(2.0, 1.9, 2.1))[3] == "behind"


def test_the_ratio_pairs_rounds_over_the_shape_and_refuses_another_precision(tmp_path: Path) -> None:
    steps = {("adamw", "tiny"): 10.0, ("lion", "tiny"): 11.0, ("muon", "tiny"): 18.0}
    add_calibration(tmp_path, steps, spread=0.1)
    cal, why = read_calibration(tmp_path)
    assert why == "" and cal is not None
    r, _ = step_ratio(cal, "muon", "tiny", 256)
    rounds = round_medians(steps, spread=0.1)
    assert r == step_ratios({opt: rounds[(opt, size)] for opt, size in steps}, "adamw")["muon"]
    assert r.value == pytest.approx(1.8) and r.low < 1.8 < r.high and r.df == 4  # lion's rounds pooled in
    assert step_ratio(cal, "muon", "tiny", 256, ns_precision="bf16")[0] == r
    none, why = step_ratio(cal, "muon", "tiny", 256, ns_precision="fp32")
    assert none is None and why == "calibrated with Newton-Schulz in bf16, the runs trained in fp32"
    assert step_ratio(cal, "soap", "tiny", 256) == (None, "not calibrated (soap at tiny)")
    none, why = step_ratio(cal, "muon", "tiny", 512)
    assert none is None and "calibrated at 256 tokens/step, compared at 512" in why
    assert cal.steps[("muon", "tiny")].ns_precision == "bf16" and cal.steps[("adamw", "tiny")].ns_precision is None
    assert "Fixture CPU 9000 (AVX512, bf16 not native), device cpu, 1 thread(s)" in cal.machine_text()


# Round medians (s) of the main job's two calibrations on the 2-core AMD EPYC, 9 minutes apart, identical runs
# before them: by the median of every step Muon's ratio read x1.40 in one and x1.56 in the other.
MEASURED = ({"adamw": [0.0059, 0.0074, 0.0073], "lion": [0.0072, 0.0075, 0.0080],
             "muon": [0.0095, 0.0097, 0.0099], "adafactor": [0.0096, 0.0090, 0.0110]},
            {"adamw": [0.0062, 0.0060, 0.0079], "lion": [0.0066, 0.0080, 0.0071],
             "muon": [0.0079, 0.0109, 0.0103], "adafactor": [0.0076, 0.0074, 0.0108]})
# The main job's Muon speedup in tokens at tiny @ 0.5 tok/param, as its report of 2026-11-27 gave it (docs/results/
# cpu_demo/evidence.md at 409c37a), where that calibration's round range made its speedup in time "ahead".
TOKENS = _point(2.35, 2.04, 2.72)


def test_two_calibrations_whose_ratios_differ_within_the_spread_give_one_word() -> None:
    first, second = (step_ratios(rounds, "adamw")["muon"] for rounds in MEASURED)
    assert (round(first.value, 2), round(second.value, 2)) == (1.42, 1.45)  # x1.40 and x1.56 by every step's median
    assert first.low < second.value < first.high and second.low < first.value < second.high
    assert first.value != pytest.approx(second.value, rel=1e-3)
    assert time_speedup(TOKENS, first)[3] == time_speedup(TOKENS, second)[3] == "ahead"


# The noise of one round's median, per entry (log scale): paired, two of them make the 0.12-0.17 pooled spread of a
# round's log ratio that the two MEASURED calibrations show. True step times in ms at the main job's scale.
NOISY, QUIET = 0.12, 0.03
TRUE_MS = {"adamw": 7.0, "lion": 7.7, "muon": 10.5, "adafactor": 9.0}


def _calibration(rng: random.Random, sigma: float, first: int = 3) -> dict[str, list[float]]:
    """One calibration drawn from the noise model, measured as study.calibration measures: its first rounds, then
    more while a ratio is unstable (up to twice)."""
    rounds: dict[str, list[float]] = {opt: [] for opt in TRUE_MS}
    while not rounds["adamw"] or more_rounds([rounds], "adamw", len(rounds["adamw"]), first):
        for opt, ms in TRUE_MS.items():
            rounds[opt].append(ms * math.exp(rng.gauss(0.0, sigma)) / 1e3)
    return rounds


def _round_range(rounds: dict[str, list[float]]) -> StepRatio:
    """The rule this replaced, for comparison: the ratio of the medians over 3 rounds, its range the slowest round
    of the one against the fastest of the other."""
    mine, base = rounds["muon"][:3], rounds["adamw"][:3]
    return StepRatio(statistics.median(mine) / statistics.median(base), min(mine) / max(base), max(mine) / min(base),
                     3, math.nan, 0)


def test_two_calibrations_of_one_noisy_machine_agree_on_the_word_and_cover_the_truth() -> None:
    """1000 pairs of calibrations of the same runs: Muon's word at the main job's cell agrees in at least 90 % of
    pairs (the round range's in under 70 %), each ratio's interval covers the true ratio in at least 90 % of
    calibrations (95 % nominal, less the stopping rule's share), and none measures more than twice its first
    rounds."""
    rng, truth = random.Random(48), TRUE_MS["muon"] / TRUE_MS["adamw"]
    agree = by_range = cover = 0
    used = []
    for _ in range(1000):
        pair = [_calibration(rng, NOISY) for _ in range(2)]
        first, second = (step_ratios(rounds, "adamw")["muon"] for rounds in pair)
        agree += time_speedup(TOKENS, first)[3] == time_speedup(TOKENS, second)[3]
        by_range += time_speedup(TOKENS, _round_range(pair[0]))[3] == time_speedup(TOKENS, _round_range(pair[1]))[3]
        cover += first.low <= truth <= first.high
        used += [len(rounds["adamw"]) for rounds in pair]
    assert agree >= 900 and by_range < 700 and cover >= 900 and max(used) == 6
    quiet = [len(_calibration(rng, QUIET)["adamw"]) for _ in range(200)]
    assert sum(quiet) / len(quiet) < 3.2  # a quiet machine pays for no more rounds than before


def test_no_file_says_how_to_get_one_and_a_bad_one_says_why(tmp_path: Path) -> None:
    cal, why = read_calibration(tmp_path)
    assert cal is None and "no step calibration" in why and "`hf-optbench sweep` writes it" in why
    an = SimpleNamespace(sweep_dir=tmp_path, optimizers=["adamw", "muon"], sizes=[])
    assert time_line(an).startswith("Speedup in time: not measured (no step calibration")
    path = add_calibration(tmp_path, {("adamw", "tiny"): 10.0})
    data = json.loads(path.read_text())
    for broken, message in (({**data, "schema": 2}, "schema 2, expected 1"),
                            ({**data, "machine": {"cpu_model": "x"}}, "machine must hold"),
                            ({**data, "entries": [{**data["entries"][0], "spread": [0.02, 0.03]}]},
                             "does not hold the median"),
                            ({**data, "entries": [{**data["entries"][0], "step_time_round_medians_s": [0.01, 0.0]}]},
                             "are not positive step times")):
        (tmp_path / CALIBRATION_FILE).write_text(json.dumps(broken))
        cal, why = read_calibration(tmp_path)
        assert cal is None and message in why and "could not be read" in why
