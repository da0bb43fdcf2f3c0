"""The value lists of a sweep file's matrix (and of its ``tune:`` seeds), checked: an empty list, a value given
twice (an optimizer under two of its aliases, a size under two spellings too), a seed outside what numpy and torch
can seed, a non-positive multiplier; and, once expanded, two runs under one run id. Each is an OptBenchError naming
the key and the fix, raised before any run starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_optbench.config.checks import SEED_RANGE
from hf_optbench.errors import OptBenchError


def as_list(table: dict[str, Any], key: str, required: bool, where: str = "sweep matrix") -> list[Any]:
    """``table[key]`` as a list ([] when absent and not ``required``); an empty list given is a mistake:
    ``seed: []`` meant seed 0, the tuning seed, silently."""
    value = table.get(key)
    if value is None:
        if required:
            raise OptBenchError(f"{where} needs '{key}': a list, e.g. {key}: [...].")
        return []
    if not isinstance(value, list):
        value = [value]
    if not value:
        hint = "" if required else " or remove the key"
        raise OptBenchError(f"{where} '{key}' is empty: give at least one value{hint}.")
    if len(set(map(str, value))) != len(value):
        raise OptBenchError(f"{where} '{key}' lists a value twice: {value}. Remove the duplicate.")
    return value


def _distinct(names: list[str], canonical: Any, key: str, noun: str) -> list[str]:
    """``names`` when no two are one ``noun`` by ``canonical`` (the registry's resolution); an unknown name is left
    to each run's validation (which names the run)."""
    seen: dict[str, str] = {}
    for name in names:
        try:
            same = canonical(name)
        except OptBenchError:
            same = name
        if same in seen:
            raise OptBenchError(f"sweep matrix {key} lists '{same}' twice: '{seen[same]}' and '{name}' are the same "
                                f"{noun}. Remove the duplicate.")
        seen[same] = name
    return names


def distinct_optimizers(optimizers: list[str]) -> list[str]:
    """No two the same optimizer by the registry's alias resolution: [adamw, AdamW] ran AdamW as a second copy of
    adamw under another run id."""
    from hf_optbench.optim.registry import resolve_optimizer_name

    return _distinct(optimizers, resolve_optimizer_name, "optimizer", "optimizer")


def distinct_sizes(sizes: list[str]) -> list[str]:
    """No two the same model size by its canonical name: [tiny, TINY] ran the same run twice under two ids, and the
    report pooled them as two samples of one seed."""
    from hf_optbench.models import resolve_size

    return _distinct(sizes, resolve_size, "model_size", "size")


def seed_list(seeds: list[Any], where: str) -> list[int]:
    """Integers in a run's seed range (``config.checks.SEED_RANGE``, numpy's and torch's)."""
    low, high = SEED_RANGE
    if not all(isinstance(s, int) and not isinstance(s, bool) and low <= s <= high for s in seeds):
        raise OptBenchError(f"{where} must be a list of integers in [0, 2**32 - 1], got {seeds}.")
    return [int(s) for s in seeds]


def multiplier_list(mults: list[Any], where: str) -> list[float]:
    """Positive numbers."""
    for m in mults:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
            raise OptBenchError(f"{where} must be positive numbers, got {m!r}. E.g. [0.25, 0.5, 1, 2, 4].")
    return [float(m) for m in mults]


# The matrix fields a run id is made of, with the sweep-file key that gives each (a tuning run's multiplier comes
# from tune:, a ladder run's budget from ladder:).
_ID_FIELDS = (("optimizer", "matrix optimizer"), ("model_size", "matrix model_size"), ("seed", "seed"),
              ("lr_multiplier", "matrix lr_multipliers"), ("budget_multiple", "ladder multiples"),
              ("budget_tpp", "budget tokens_per_param"))


def check_unique_ids(runs: Sequence[Any]) -> None:
    """One run per run id: two matrix points with one id (``lr_multipliers: [0.5, 0.5000001]``: ids show 6
    significant digits) would share one directory, the second moving the first's finished result aside, and the
    manifest would hold two entries under one id. Refused before any run, naming the values that collide.
    ``runs``: the phase's ``sweep_spec.RunSpec``s."""
    seen: dict[str, Any] = {}
    for run in runs:
        first = seen.setdefault(run.run_id, run)
        if first is run:
            continue
        values = [f"{'tune.lr_multipliers' if run.phase == 'tune' and key == 'lr_multiplier' else label} "
                  f"{getattr(first, key)!r} and {getattr(run, key)!r}"
                  for key, label in _ID_FIELDS if getattr(first, key) != getattr(run, key)]
        raise OptBenchError(f"sweep {', '.join(values) or 'values'} give one run id '{run.run_id}' (ids show numbers "
                            "to 6 significant digits): both runs would share one directory. Make the values differ "
                            "in their first 6 digits, or remove one.")
