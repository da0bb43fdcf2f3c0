"""The value lists of a sweep file's matrix (and of its ``tune:`` seeds), checked: an empty list, a value given
twice (an optimizer under two of its aliases too), a seed outside what numpy and torch can seed, a non-positive
multiplier. Each is an OptBenchError naming the key and the fix, raised before any run is expanded."""

from __future__ import annotations

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


def distinct_optimizers(optimizers: list[str]) -> list[str]:
    """No two the same optimizer by the registry's alias resolution: [adamw, AdamW] ran AdamW as a second copy of
    adamw under another run id. An unknown name is left to each run's validation (which names the run)."""
    from hf_optbench.optim.registry import resolve_optimizer_name

    seen: dict[str, str] = {}
    for name in optimizers:
        try:
            canonical = resolve_optimizer_name(name)
        except OptBenchError:
            canonical = name
        if canonical in seen:
            raise OptBenchError(f"sweep matrix optimizer lists '{canonical}' twice: '{seen[canonical]}' and '{name}' "
                                "are the same optimizer. Remove the duplicate.")
        seen[canonical] = name
    return optimizers


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
