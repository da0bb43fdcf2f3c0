"""Values of a run's keys read before transformers is imported, typed and refused as ``parse_args`` types them.

Why: a value of the wrong type (``--max_steps ten``, ``--tuning_blocks 1e12``, ``max_steps: 1e3`` in a recipe) was
refused by HfArgumentParser only after transformers, and with it torch, was imported: 5-7 s on a loaded 2-core
machine for a one-line answer. HfArgumentParser gives a field annotated ``int`` or ``float`` (``| None`` or not)
argparse's ``type=int`` / ``type=float``, so an argparse parser of those keys alone, with the same option strings,
says the same words about the same value; the recipe's values go through the parser's own converter
(:func:`hf_optbench.config.recipe_defaults.recipe_defaults`) and a command-line error through the parser's own
wording (:func:`hf_optbench.config.parse.value_error`). ``run.preflight`` reads them; parse_args still parses
every key afterwards.

Standard library only (the annotations of TrainingArguments are read from transformers' source).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from hf_optbench.config.parse import _OWN_DATACLASSES, training_annotations, value_error
from hf_optbench.config.recipe_defaults import recipe_defaults

NUMBER_TYPES: dict[str, type] = {"int": int, "float": float}
# HfArgumentParser's string_to_bool spellings (transformers.hf_argparser): anything else is refused there.
TRUE_WORDS = ("yes", "true", "t", "y", "1")
FALSE_WORDS = ("no", "false", "f", "n", "0")


def number_type(annotation: Any) -> type | None:
    """int or float for an annotation HfArgumentParser parses with that type (``int``, ``float | None``,
    ``Optional[int]``), else None. A dataclass field's annotation is its source text until an HfArgumentParser is
    built over the class, which replaces it with the type it resolved (``int | None`` becomes ``int``): both are
    read."""
    if isinstance(annotation, type):
        return annotation if annotation in (int, float) else None
    text = str(annotation).replace("typing.", "").replace(" ", "").replace("|None", "").replace("None|", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1]
    return NUMBER_TYPES.get(text)


@functools.cache
def number_keys() -> dict[str, type]:
    """{key: int or float} of every key whose value HfArgumentParser converts with that type: the fields of
    TrainingArguments and of hf_optbench's own dataclasses annotated so, without argparse settings of their own
    (metadata beyond ``help``)."""
    found = {name: kind for name, annotation in training_annotations().items()
             if (kind := number_type(annotation)) is not None}
    for cls in _OWN_DATACLASSES:
        for f in dataclasses.fields(cls):
            kind = number_type(f.type)
            if kind is not None and set(f.metadata) <= {"help"}:
                found[f.name] = kind
    return found


def light_parser(keys: Mapping[str, type | None]) -> argparse.ArgumentParser:
    """argparse for ``keys`` only, with HfArgumentParser's spellings (``--key value``, ``--key=value``,
    ``--key-with-hyphens``): a key typed ``int``/``float``/``str`` takes one value converted with that type, a key
    typed None is a flag (a bare ``--flag`` reads "true"; the value is left as written). Every other token is left
    for parse_args."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for key, kind in keys.items():
        names = [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
        if kind is None:
            parser.add_argument(*names, dest=key, nargs="?", const="true", default=None)
        else:
            parser.add_argument(*names, dest=key, type=kind, default=None)
    return parser


def typed_values(recipe: dict[str, Any], tokens: list[str], recipe_path: str | None,
                 keys: Mapping[str, type | None]) -> dict[str, Any]:
    """{key: value} of ``keys`` the recipe or the command line set (the command line on top, as in parse_args),
    converted as HfArgumentParser converts them. ``recipe`` and ``tokens`` are the translated ones parse_args parses
    (``config.parse.read_keys``; negative numbers attached). A value of the wrong type is an OptBenchError in
    parse_args' words."""
    parser = light_parser(keys)
    # none of these keys takes a mapping (TrainingArguments' dict fields are typed dict | str), so no dict is allowed
    values = recipe_defaults(parser, recipe, f"recipe '{recipe_path}'", dict_fields=())
    try:
        namespace, _ = parser.parse_known_args(tokens)
    except argparse.ArgumentError as exc:
        raise value_error(str(exc)) from None
    values.update({k: v for k, v in vars(namespace).items() if v is not None})
    return values


def read_flag(value: Any) -> bool | None:
    """A bool key's value as HfArgumentParser's string_to_bool reads it, or None for a spelling it refuses (left to
    parse_args to name)."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    return True if text in TRUE_WORDS else False if text in FALSE_WORDS else None
