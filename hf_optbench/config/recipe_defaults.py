"""A recipe's mapping as the parser's defaults, and the command line parsed on top of it.

This is what TRL's ``TrlParser`` does (``parser.set_defaults(**recipe)``, then ``parse_args``): the recipe's YAML
values keep their types (a list stays a list, a mapping a mapping) instead of being turned back into ``--key
value`` tokens, where ``report_to: [tensorboard, wandb]`` became ``--report_to tensorboard wandb`` for a
one-value option. argparse converts only *string* defaults, so each recipe value is converted and checked here with
the option's own type and choices, with an error naming the recipe. The command line then wins over the recipe as
argparse always lets a parsed value win over a default.

``report_to`` takes several integrations on the command line, space- or comma-separated (``--report_to
tensorboard wandb``, ``--report_to tensorboard,wandb``); TrainingArguments itself types it as one string, so its
``--report_to`` takes one value and a comma list reached the Trainer as one unknown integration name.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from typing import Any

from hf_optbench.errors import OptBenchError, suggest

# Fields of our own dataclasses that take a mapping (a JSON object on the command line).
OWN_DICT_FIELDS = ("optimizer_kwargs", "schedule_kwargs")
LIST_KEYS = ("report_to",)  # one-value options in TrainingArguments that take a list here


def allow_lists(parser: argparse.ArgumentParser) -> None:
    """Let the options of :data:`LIST_KEYS` take several values (argparse reads ``nargs`` at parse time)."""
    for key in LIST_KEYS:
        parser._option_string_actions[f"--{key}"].nargs = "+"


def _dict_fields() -> set[str]:
    from transformers import TrainingArguments

    return set(getattr(TrainingArguments, "_VALID_DICT_FIELDS", ())) | set(OWN_DICT_FIELDS)


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, key: str, value: Any, where: str) -> Any:
    """One scalar recipe value through the option's type and choices, as argparse treats a command-line value."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    try:
        converted = parser._get_value(action, text)
        parser._check_value(action, converted)
    except argparse.ArgumentError as exc:
        raise OptBenchError(f"{key} in {where}: {exc.message}. Fix that value.") from None
    return converted


def recipe_defaults(parser: argparse.ArgumentParser, mapping: dict[str, Any], where: str,
                    dict_fields: Collection[str] | None = None) -> dict[str, Any]:
    """``mapping`` (a recipe, or hf_optbench's own defaults) as typed parser defaults. Keys must be known (checked
    by ``parse.check_keys``); None leaves a key at its default; a key ``parser`` has no option for is left out. A list
    for a one-value key, or a mapping for a key that takes none (``dict_fields``; default: every key that takes one,
    which imports transformers), is an OptBenchError naming the key, ``where`` and the fix."""
    dict_fields = _dict_fields() if dict_fields is None else set(dict_fields)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        action = parser._option_string_actions.get(f"--{key}")
        if value is None or action is None:
            continue
        many = action.nargs in ("+", "*")
        if isinstance(value, dict):
            if key not in dict_fields:
                raise OptBenchError(f"{key} in {where} is a mapping ({value!r}), but {key} takes "
                                    f"{'a list' if many else 'one value'}. Give e.g. {key}: "
                                    f"{action.default if action.default not in (None, []) else '<value>'}.")
            out[key] = dict(value)
        elif isinstance(value, (list, tuple)):
            if not many:
                first = value[0] if value else "<value>"
                raise OptBenchError(f"{key} in {where} is a list ({list(value)!r}), but {key} takes one value. "
                                    f"Give one, e.g. {key}: {first}.")
            if value:  # an empty list keeps the default
                out[key] = [_convert(parser, action, key, v, where) for v in value]
        else:
            converted = _convert(parser, action, key, value, where)
            out[key] = [converted] if many else converted
    return out


def report_to_list(value: Any) -> list[str]:
    """``report_to`` as a list of integration names: a comma list split, each name checked against transformers'
    integrations ("all" and "none" alone), installed ones only. OptBenchError naming the fix otherwise."""
    items = value if isinstance(value, list) else [value]
    names = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not names or names == ["none"]:
        return ["none"]
    if names == ["all"]:
        return names
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    for name in names:
        if name in ("all", "none"):
            raise OptBenchError(f"report_to '{name}' cannot be combined with other integrations ({names}). Give "
                                f"'{name}' alone, or a list such as --report_to tensorboard wandb.")
        if name not in INTEGRATION_TO_CALLBACK:
            raise OptBenchError(f"report_to: unknown integration '{name}'.{suggest(name, INTEGRATION_TO_CALLBACK)} "
                                f"Choose from {', '.join(sorted(INTEGRATION_TO_CALLBACK))}, all or none; several: "
                                "--report_to tensorboard wandb (or tensorboard,wandb).")
    installed = set(get_available_reporting_integrations())
    missing = [n for n in names if n not in installed and n != "kubeflow"]
    if missing:
        raise OptBenchError(f"report_to {missing[0]}: its package is not installed here. Install it (e.g. pip "
                            f"install {missing[0]}), or drop {missing[0]} from report_to.")
    return names


def parse_with_defaults(parser: Any, defaults: dict[str, Any], tokens: list[str]) -> tuple[Any, ...]:
    """The dataclasses of ``parser`` (an HfArgumentParser) from ``tokens`` parsed over ``defaults``."""
    import dataclasses

    parser.set_defaults(**defaults)
    namespace, remaining = parser.parse_known_args(args=tokens)
    if remaining:
        raise OptBenchError(f"unexpected value(s) on the command line: {' '.join(remaining)}. Each --key takes one "
                            f"value (lists: {', '.join(LIST_KEYS)}, data_files, target_losses, ...); quote a value "
                            "that holds spaces.")
    if hasattr(namespace, "report_to"):
        namespace.report_to = report_to_list(namespace.report_to)
    parts = []
    for dtype in parser.dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        parts.append(dtype(**{k: v for k, v in vars(namespace).items() if k in keys}))
    return tuple(parts)
