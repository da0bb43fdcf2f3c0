"""The verdict's vocabulary: the words a cell can get, the rule of each (:data:`RULES`, :func:`classify`) and its
meaning in words, written from the same rule. The statistics the words are drawn from are
:mod:`hf_optbench.measure.verdict_stats`; the table that applies them is :mod:`hf_optbench.measure.verdict`.

A point's stance ("ahead", "behind", "level", "no difference") is where its interval lies against the metric's
equivalence margin; the trend's outcome (:data:`TRENDS`) is where the trend's interval lies against its threshold.
:func:`classify` draws the cell's word from the smallest and the largest point's stances and the trend's outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# Words that name a trend: on the data axis they read "shrinks with data" (``measure.verdict.Verdict.word``).
TREND_WORDS = ("grows", "gaining", "shrinks", "deficit vanishes")
VERDICTS = ("grows", "holds", "ahead, trend unresolved", "gaining", "shrinks", "deficit vanishes", "behind", "level",
            "no difference", "not measurable here", "insufficient data")
STANCES = ("ahead", "behind", "level", "no difference")
# The trend's four outcomes (:func:`trend_direction`), and how a meaning says each: the rule calls a trend only when
# its whole interval lies beyond the trend's margin (a change of more than the metric's margin across the points
# run), so an interval that excludes 0 but reaches inside that margin is "neither".
TRENDS = ("favourable", "unfavourable", "flat", "unresolved")
TREND_PHRASES = {
    "favourable": "a favourable trend beyond the margin",
    "unfavourable": "an unfavourable trend beyond the margin",
    "flat": "the trend inside the margin",
    "unresolved": "the trend neither beyond nor inside the margin",
}
NO_TREND_BEYOND = "no trend beyond the margin either way"  # the phrase of {"flat", "unresolved"}


@dataclass(frozen=True)
class Rule:
    """One case of the rule, as its meaning states it: the trend outcomes and the stances at the smallest and the
    largest point it is given for (``every_level``: True where every point must be level, False where not every
    point may be, None either way). A word is given exactly for the union of its rules' cases: :func:`classify`
    applies the rule, these state it, and tests/measure/test_verdict_words.py checks over every constructed case
    that the two give the same word."""

    word: str
    trends: tuple[str, ...]
    largest: tuple[str, ...] = STANCES
    smallest: tuple[str, ...] = STANCES
    every_level: bool | None = None

    def covers(self, trend: str, smallest: str, largest: str, every_level: bool) -> bool:
        return (trend in self.trends and largest in self.largest and smallest in self.smallest
                and self.every_level in (None, every_level))


_NEITHER_FAR = ("level", "no difference")
RULES = (
    Rule("grows", ("favourable",), ("ahead",)),
    Rule("deficit vanishes", ("favourable",), _NEITHER_FAR, ("behind",)),
    Rule("gaining", ("favourable",), ("behind",)),
    Rule("gaining", ("favourable",), _NEITHER_FAR, ("ahead", *_NEITHER_FAR)),
    Rule("shrinks", ("unfavourable",)),
    Rule("holds", ("flat",), ("ahead",)),
    Rule("ahead, trend unresolved", ("unresolved",), ("ahead",)),
    Rule("behind", ("flat", "unresolved"), ("behind",)),
    Rule("level", ("flat", "unresolved"), ("level",), ("level",), True),
    Rule("no difference", ("flat", "unresolved"), _NEITHER_FAR, STANCES, False),
)
# What each word tells a reader, after its rule ({grow}: "as models grow" or "as each parameter sees more data").
_GLOSSES = {
    "grows": "the advantage grows {grow}",
    "deficit vanishes": "the deficit closes {grow}",
    "gaining": "the optimizer gains on the baseline {grow}, not (yet) ahead at the {largest}",
    "shrinks": "the advantage decreases (or the deficit deepens) {grow}, whatever the stances",
    "holds": "the advantage is shown to stay within the margin across the {points} run",
    "ahead, trend unresolved": "the data cannot say whether the advantage holds {grow}",
    "behind": "worse than the baseline (a favourable trend beyond the margin would make it \"gaining\", an "
              "unfavourable one \"shrinks\")",
    "level": "equivalent to the baseline within the margin",
    "no difference": "the data show no difference (the MDE says how large a true one could be and stay unseen)",
}
# The cases outside :func:`classify` (``measure.verdict``: a cell with too few points, or one not measurable here),
# stated as the code applies them.
STATELESS_HOLDS = ("with no ratio to compare, the optimizer measures 0 where the baseline measures more at two or more "
                   "{points} (a 100 % saving, e.g. a stateless optimizer's state)")
_OUTSIDE = {
    "not measurable here": "a wall-clock figure that this machine's load or the sharing of it with other runs makes "
                           "uninterpretable (the reason is given); no word is drawn from it",
    "insufficient data": "fewer than two {points} with two or more seeds paired with the baseline",
}
_AXIS_NOUNS = {"size": {"point": "size", "points": "sizes", "grow": "as models grow"},
               "data": {"point": "data ratio", "points": "data ratios", "grow": "as each parameter sees more data"}}


def _stances_text(stances: tuple[str, ...], where: str) -> str:
    """"ahead at the largest size", "level or no difference at ...", "not behind at ..." (three of the four)."""
    if len(stances) == len(STANCES) - 1:
        return f"not {next(s for s in STANCES if s not in stances)} at {where}"
    return f"{' or '.join(stances)} at {where}"


def rule_text(rule: Rule, axis: str = "size") -> str:
    """The case a :class:`Rule` covers, in words: "ahead at the largest size, and a favourable trend beyond the
    margin"."""
    nouns = _AXIS_NOUNS[axis]
    parts = []
    if rule.largest != STANCES:
        parts.append(_stances_text(rule.largest, f"the largest {nouns['point']}"))
    if rule.smallest != STANCES and rule.every_level is not True:
        parts.append(_stances_text(rule.smallest, f"the smallest {nouns['point']}"))
    if rule.every_level is not None:
        if rule.every_level:
            parts = [f"level at every {nouns['point']}"]
        else:
            parts.append(f"not level at every {nouns['point']}")
    if set(rule.trends) == {"flat", "unresolved"}:
        parts.append(NO_TREND_BEYOND)
    elif set(rule.trends) != set(TRENDS):
        parts.append(" or ".join(TREND_PHRASES[t] for t in rule.trends))
    trend = parts.pop() if rule.trends != TRENDS else ""
    return ", ".join(parts) + (", with " if parts and trend else "") + trend


def word_rule(word: str, axis: str = "size") -> str:
    """The whole rule of ``word`` in words: its cases joined by "or" (``classify``'s and the two outside it)."""
    nouns = _AXIS_NOUNS[axis]
    cases = [rule_text(r, axis) for r in RULES if r.word == word]
    if word == "holds":
        cases.append(STATELESS_HOLDS.format(**nouns))
    if word in _OUTSIDE:
        cases.append(_OUTSIDE[word].format(**nouns))
    return "; or ".join(cases)


def word_meaning(word: str, axis: str = "size") -> str:
    """One word's meaning along ``axis`` ("size" or "data"): its rule as the code applies it (:func:`word_rule`),
    then what it tells a reader; on the data axis every point is a data ratio."""
    nouns = {**_AXIS_NOUNS[axis], "largest": f"largest {_AXIS_NOUNS[axis]['point']}"}
    gloss = _GLOSSES.get(word)
    rule = word_rule(word, axis)
    return rule[0].upper() + rule[1:] + "." + (f" {gloss[0].upper()}{gloss[1:]}.".format(**nouns) if gloss else "")


class Stanced(Protocol):
    """A point as :func:`classify` reads it: its stance (one of :data:`STANCES`)."""

    @property
    def stance(self) -> str: ...


def trend_direction(ci: tuple[float, float] | None, threshold: float | None) -> str:
    """Where the trend's interval lies against ``±threshold`` (the metric's margin over the decades spanned):
    "favourable" (wholly below ``-threshold``: beyond the margin, the advantage grows), "unfavourable" (wholly above
    ``+threshold``), "flat" (wholly inside), "unresolved" (none of these, or no trend to judge: see
    :data:`TREND_PHRASES`)."""
    if ci is None or threshold is None:
        return "unresolved"
    if ci[1] < -threshold:
        return "favourable"
    if ci[0] > threshold:
        return "unfavourable"
    if -threshold <= ci[0] and ci[1] <= threshold:
        return "flat"
    return "unresolved"


def classify(points: Sequence[Stanced], trend: str, all_level: bool) -> str:
    """The verdict from the smallest and largest sizes' stances and the trend (one of :data:`TRENDS`, from
    :func:`trend_direction`); :data:`RULES` states the same rule case by case, and the meanings are written from it."""
    first, last = points[0].stance, points[-1].stance
    if trend == "favourable":
        if last == "ahead":
            return "grows"
        if first == "behind" and last in ("level", "no difference"):
            return "deficit vanishes"
        return "gaining"
    if trend == "unfavourable":
        return "shrinks"
    if last == "ahead":
        return "holds" if trend == "flat" else "ahead, trend unresolved"
    if last == "behind":
        return "behind"
    if all_level:
        return "level"
    return "no difference"
