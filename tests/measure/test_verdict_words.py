"""Words true to their rules (issues 40 and 44): every case the rule produces, constructed from the rule's own
thresholds, gets a word whose meaning states that case; every printed p says what it is the p of; METHOD.md's table
of words is the rule as the code states it."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.measure.intervals import t_interval
from hf_optbench.measure.verdict import (
    MetricSpec,
    Observation,
    confidence_text,
    meanings,
    stance,
    verdict_for,
)
from hf_optbench.measure.verdict_words import (
    NO_TREND_BEYOND,
    RULES,
    STANCES,
    TREND_PHRASES,
    TRENDS,
    VERDICTS,
    classify,
    rule_text,
    trend_direction,
    word_rule,
)

RATIO = MetricSpec("m", "memory", "metric")
SIZES = {"tiny": 1.1e5, "mini": 8.1e5, "midi": 2.7e6}
METHOD = Path(__file__).resolve().parents[2] / "docs" / "METHOD.md"
MARGIN, THRESHOLD = math.log(1.02), 0.02


def _interval(where: str, edge: float) -> tuple[float, float]:
    """An interval placed against ``±edge`` (a stance's margin or a trend's threshold), as the rule reads it."""
    return {"below": (-3 * edge, -2 * edge), "above": (2 * edge, 3 * edge), "inside": (-edge / 2, edge / 2),
            "straddles": (edge / 2, 3 * edge), "wide": (-3 * edge, 3 * edge)}[where]


# Each of the four stances and trend outcomes, drawn by the rule's functions from intervals placed against the
# margin and the threshold: the cases are the rule's, not a list typed into the test.
STANCE_CASES = {stance(*_interval(w, MARGIN), MARGIN): w for w in ("below", "above", "inside", "straddles")}
TREND_CASES = {trend_direction(_interval(w, THRESHOLD), THRESHOLD): w for w in ("below", "above", "inside", "wide")}


def test_the_constructed_intervals_give_every_stance_and_trend() -> None:
    assert set(STANCE_CASES) == set(STANCES) and set(TREND_CASES) == set(TRENDS)
    # an interval that excludes 0 but reaches inside the threshold is unresolved: neither beyond nor inside (issue 40)
    assert trend_direction((THRESHOLD / 2, 3 * THRESHOLD), THRESHOLD) == "unresolved"
    assert trend_direction(None, None) == "unresolved"


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    """(trend, the stances at each point from the smallest to the largest): two and three points, every stance."""
    return [(t, pts) for t in TREND_CASES for n in (2, 3) for pts in itertools.product(STANCE_CASES, repeat=n)]


@pytest.mark.parametrize(("trend", "stances"), _cases())
def test_every_case_gets_the_word_whose_rule_states_it(trend: str, stances: tuple[str, ...]) -> None:
    """classify (the rule as the code applies it) and RULES (the rule as the meanings state it) agree on every case:
    exactly one stated case covers it, and it is the word the code gives."""
    points = [SimpleNamespace(stance=s) for s in stances]
    every_level = all(s == "level" for s in stances)
    word = classify(points, trend, every_level)  # type: ignore[arg-type]
    covering = [r for r in RULES if r.covers(trend, stances[0], stances[-1], every_level)]
    assert [r.word for r in covering] == [word]
    meaning = meanings("size")[word]
    assert rule_text(covering[0]) in meaning[0].lower() + meaning[1:]
    # the meaning says where the trend lies as the rule read it: beyond the margin, inside it, or neither
    either = set(covering[0].trends) == {"flat", "unresolved"}
    assert (NO_TREND_BEYOND if either else TREND_PHRASES[trend]) in meaning.lower()


def test_every_word_has_a_stated_rule_and_the_data_axis_says_ratios() -> None:
    assert {r.word for r in RULES} | {"not measurable here", "insufficient data"} == set(VERDICTS)
    for word, text in meanings("data").items():
        assert "size" not in text, word
    assert "the largest data ratio" in meanings("data")["behind"]


def _judge(table: dict[str, list[float]]) -> object:
    out = []
    for size, diffs in table.items():
        for seed, d in enumerate(diffs):
            out += [Observation("adamw", size, SIZES[size], seed, 100.0),
                    Observation("opt", size, SIZES[size], seed, 100.0 * math.exp(d))]
    return verdict_for(out, "opt", RATIO)


SEED_NOISE = (0.004, -0.003, 0.001, -0.002, 0.0)


@pytest.mark.parametrize(("name", "table", "word"), [
    # issue 44: the largest point level, another not: "no difference", which its meaning now covers
    ("largest level, smallest not", {"tiny": [0.3, -0.25, 0.1, -0.2, 0.05], "midi": [0.001, -0.001, 0.0, 0.0005,
                                                                                      -0.0005]}, "no difference"),
    # issue 40: ahead everywhere, a trend whose interval excludes 0 but reaches inside the threshold
    ("trend excludes 0 inside the margin", {"tiny": [-0.30 + e for e in SEED_NOISE],
                                            "mini": [-0.29 + 2 * e for e in SEED_NOISE],
                                            "midi": [-0.28 + e for e in SEED_NOISE]}, "ahead, trend unresolved"),
    ("behind, deficit deepening", {"tiny": [0.1 + e for e in SEED_NOISE], "midi": [0.3 + e for e in SEED_NOISE]},
     "shrinks"),
    ("behind, deficit closing", {"tiny": [0.5 + e for e in SEED_NOISE], "midi": [0.1 + e for e in SEED_NOISE]},
     "gaining"),
    ("behind, flat", {"tiny": [0.2 + e for e in SEED_NOISE], "midi": [0.2 + e for e in SEED_NOISE]}, "behind"),
])
def test_judged_cells_get_the_word_whose_meaning_states_their_case(name: str, table: dict, word: str) -> None:
    v = _judge(table)
    assert v.verdict == word, name
    trend = v.trend or "unresolved"
    assert trend == trend_direction(v.slope_ci, v.threshold)
    first, last = v.points[0].stance, v.points[-1].stance
    every_level = all(p.stance == "level" for p in v.points)
    (rule,) = [r for r in RULES if r.covers(trend, first, last, every_level)]
    assert rule.word == word and rule_text(rule) in word_rule(word)
    if name.startswith("trend excludes"):
        assert v.slope_ci[0] > 0 and v.slope_ci[0] < v.threshold  # significant against 0, not beyond the margin
        assert f"vs ±{v.threshold:.3f}: {TREND_PHRASES['unresolved']}" in v.evidence


def test_the_printed_p_says_what_it_is_the_p_of_and_the_intervals_their_confidence() -> None:
    v = _judge({"tiny": [-0.30 + e for e in SEED_NOISE], "mini": [-0.2 + 2 * e for e in SEED_NOISE],
                "midi": [-0.1 + e for e in SEED_NOISE]})
    last = v.points[-1]
    assert v.p_value == pytest.approx(min(1.0, 2 * min(last.p_value, v.trend_p_value)))
    assert (f"cell p {v.p_value:.2g} = 2 × min(p at midi {last.p_value:.2g}, trend p {v.trend_p_value:.2g}), "
            f"tested at {v.level:.2g}") in v.evidence
    # every interval of the cell is at half its tested level: recomputed from the paired differences
    assert all(p.level == pytest.approx(v.level / 2) for p in v.points)
    diffs = [-0.1 + e for e in SEED_NOISE]
    _, _, low, high = t_interval(diffs, v.level / 2)
    assert (last.ci_low, last.ci_high) == pytest.approx((low, high))
    assert f"intervals {confidence_text(v.level / 2)}" in v.evidence
    assert confidence_text(0.0036 / 2) == "99.82 %" and confidence_text(0.025) == "97.5 %"


def test_method_md_states_each_word_s_rule_as_the_code_does() -> None:
    text = METHOD.read_text(encoding="utf-8")
    section = text.split("## The verdict words", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| ([a-z ,]+?) \| (.+?) \|$", section, flags=re.M))
    for word in [r.word for r in RULES] + ["insufficient data"]:
        assert rows.get(word) == word_rule(word), word
