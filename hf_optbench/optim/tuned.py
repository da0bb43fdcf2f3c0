"""The tuned-values file the tuning step writes ({optimizer: {model_size: {learning_rate, weight_decay, ...}}}):
reading one entry (:func:`lookup_tuned`, as a run resolves its hyperparameters) and the rule its numbers follow
(:func:`tuned_number_ok`, which the whole-file check before a run, ``config.checks.check_tuned_file``, applies too).
"""

from __future__ import annotations

import math
import os
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import resolve_optimizer_name
from hf_optbench.yaml_file import load_yaml_mapping

# Tuned values that are constructor arguments of the families that take them, not TrainingArguments: a parameter
# group's learning rate as a ratio to learning_rate (optim.adamw.NONMATRIX_KEY). run.plan hands them to the
# optimizer with the source "tuned: <file>".
CONSTRUCTOR_KEYS = ("nonmatrix_lr_ratio",)
# An entry's tuned ladder rungs (the baseline's other budgets, each with its own learning rate): a list of
# {budget_multiple, max_steps, learning_rate, ...}; a run whose max_steps is a rung's takes that rung's values.
LADDER_KEY = "ladder"
RUNG_KEYS = ("learning_rate",) + CONSTRUCTOR_KEYS


def lookup_tuned(path: str, optimizer: str, model_size: str, max_steps: int | None = None) -> dict[str, Any]:
    """The tuned values for (optimizer, model_size) in a YAML/JSON file {optimizer: {model_size: {...}}}, as
    written by the tuning step (learning_rate; weight_decay where tuned: specs with ``tune_weight_decay``; a group's
    learning-rate ratio, :data:`CONSTRUCTOR_KEYS`); {} when the file has no entry for them. With ``max_steps`` equal
    to a tuned ladder rung's (:data:`LADDER_KEY`), that rung's learning rate (and ratio) replace the entry's: every
    rung of the baseline's ladder runs at its own tuned rate. Names and sizes may be aliases; a value < 0 (lr <= 0)
    is an OptBenchError."""
    if not os.path.isfile(path):
        raise OptBenchError(f"tuned_hparams_file '{path}' does not exist. Write it with `hf-optbench tune`.")
    data = load_yaml_mapping(path, "tuned_hparams_file", "It must map optimizer -> size -> values, as "
                             "`hf-optbench tune` writes it.")
    check_named_once(data, path)
    want_opt = resolve_optimizer_name(optimizer)
    want_size = _canonical_size(model_size)
    for opt_name, by_size in data.items():
        try:
            if resolve_optimizer_name(str(opt_name)) != want_opt:
                continue
        except OptBenchError:
            continue
        if not isinstance(by_size, dict):
            raise OptBenchError(f"tuned_hparams_file '{path}': entry '{opt_name}' must map model_size -> values.")
        for size, values in by_size.items():
            if _canonical_size(str(size)) == want_size:
                if not isinstance(values, dict):
                    raise OptBenchError(f"tuned_hparams_file '{path}': {opt_name}/{size} must be a mapping.")
                out = {k: _number(v) for k, v in values.items()}
                out.update(_rung(values, max_steps))
                for key in ("learning_rate", "weight_decay", *CONSTRUCTOR_KEYS):
                    v = out.get(key, 1.0)
                    if not tuned_number_ok(key, v):
                        raise OptBenchError(f"tuned_hparams_file '{path}': {opt_name}/{size} {key} is {v!r}: not a "
                                            "finite number >= 0 (> 0 for the learning rate). Tune again or fix it.")
                return out
    return {}


def check_named_once(data: dict[str, Any], path: str) -> None:
    """Each optimizer once, and each size once under it, by their canonical names: a file holding ``adamw:`` and
    ``AdamW:`` (or ``tiny:`` and ``TINY:``) gave the first one's values silently, whichever the user meant. The
    YAML loader refuses a key written twice; this is the same rule through the registry's aliases."""
    seen: dict[str, str] = {}
    for name, by_size in data.items():
        try:
            canonical = resolve_optimizer_name(str(name))
        except OptBenchError:
            continue  # an unknown name: config.checks.check_tuned_file names it
        if canonical in seen:
            raise OptBenchError(f"tuned_hparams_file '{path}' holds '{seen[canonical]}' and '{name}', the same "
                                f"optimizer ({canonical}) twice: keep one of the two entries.")
        seen[canonical] = str(name)
        sizes: dict[str, str] = {}
        for size in by_size if isinstance(by_size, dict) else ():
            key = _canonical_size(str(size))
            if key in sizes:
                raise OptBenchError(f"tuned_hparams_file '{path}': {name} holds '{sizes[key]}' and '{size}', the "
                                    f"same model size ({key}) twice: keep one of the two entries.")
            sizes[key] = str(size)


def _rung(values: dict[str, Any], max_steps: int | None) -> dict[str, Any]:
    """The tuned values of the ladder rung run at ``max_steps`` ({} when no rung has that many steps)."""
    rungs = values.get(LADDER_KEY)
    if max_steps is None or not isinstance(rungs, list):
        return {}
    for rung in rungs:
        if isinstance(rung, dict) and rung.get("max_steps") == max_steps and "learning_rate" in rung:
            return {k: _number(rung[k]) for k in RUNG_KEYS if k in rung}
    return {}


def tuned_number_ok(key: str, value: Any) -> bool:
    """The rule for a tuned ``learning_rate`` or group ratio (finite, > 0) or ``weight_decay`` (finite, >= 0); a
    numeric string counts as its number (YAML 1.1 reads 3e-4, without a dot, as a string)."""
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return False
    return value > 0 or key not in ("learning_rate", *CONSTRUCTOR_KEYS)


def _number(value: Any) -> Any:
    """YAML 1.1 reads 3e-4 (no dot) as a string: take numeric strings as floats."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _canonical_size(size: str) -> str:
    from hf_optbench.models import resolve_size

    try:
        return resolve_size(size)
    except OptBenchError:
        return str(size)
