"""The pre-flight's typed reading (config.light_args) against HfArgumentParser itself: every key it reads as a number
is one HfArgumentParser converts with that type under the same option strings, and every number HfArgumentParser
reads is read, so the pre-flight's refusal of a value is parse_args' refusal of it, in its words."""

from __future__ import annotations

from typing import Optional

import pytest

from hf_optbench.config.light_args import light_parser, number_keys, number_type, read_flag, typed_values
from hf_optbench.errors import OptBenchError


@pytest.mark.parametrize(("annotation", "kind"), [
    ("int", int), ("float", float), ("int | None", int), ("None | float", float), ("Optional[int]", int),
    ("bool", None), ("str | None", None), ("int | float", None), ("list[int]", None), ("float | str", None),
    (int, int), (float, float), (bool, None), (str, None), (int | None, int), (Optional[float], float),  # noqa: UP045
])
def test_number_type_reads_what_hfargumentparser_converts(annotation: object, kind: type | None) -> None:
    """Source text, and the types an HfArgumentParser writes into a dataclass's fields once built over it."""
    assert number_type(annotation) is kind


def test_number_keys_are_the_same_after_a_parser_was_built() -> None:
    from hf_optbench.config.parse import _make_parser

    before = dict(number_keys())
    _make_parser()  # resolves and rewrites our dataclasses' field types
    number_keys.cache_clear()
    assert number_keys() == before and "max_train_tokens" in before


def test_every_number_key_is_typed_as_hfargumentparser_types_it() -> None:
    from transformers import TrainingArguments

    from hf_optbench.config.parse import _make_parser
    from hf_optbench.config.recipe_defaults import OWN_DICT_FIELDS
    from hf_optbench.run.preflight import TYPED_KEYS

    full = _make_parser()
    actions = {a.dest: a for a in full._actions if a.option_strings and a.dest != "help"}
    light = {a.dest: a for a in light_parser({**number_keys(), **TYPED_KEYS})._actions}
    numbers = {k for k, a in actions.items() if a.type in (int, float) and a.nargs is None}
    assert set(number_keys()) == numbers  # none left to parse_args, none read that it reads otherwise
    assert {"max_steps", "weight_decay", "synthetic_num_tokens", "tuning_blocks", "num_processes"} <= numbers
    for key in {**number_keys(), **{k: t for k, t in TYPED_KEYS.items() if t is not None}}:
        if key in number_keys():
            assert light[key].type is actions[key].type, key
        else:  # read as written: a string, or one of the choices (every choice a string) it is checked against
            assert actions[key].type is str or all(isinstance(c, str) for c in actions[key].choices), key
        assert light[key].option_strings == actions[key].option_strings[:len(light[key].option_strings)], key
        assert light[key].nargs == actions[key].nargs, key
    dict_fields = set(getattr(TrainingArguments, "_VALID_DICT_FIELDS", ())) | set(OWN_DICT_FIELDS)
    assert not dict_fields & (set(number_keys()) | set(TYPED_KEYS))  # typed_values allows no mapping for them


def test_the_command_line_beats_the_recipe_and_a_bad_value_is_refused_in_the_parsers_words() -> None:
    keys = {"max_steps": int, "weight_decay": float, "overwrite_output_dir": None}
    values = typed_values({"max_steps": 20, "weight_decay": 0}, ["--max-steps", "30", "--overwrite_output_dir"],
                          "r.yaml", keys)
    assert values == {"max_steps": 30, "weight_decay": 0.0, "overwrite_output_dir": "true"}
    with pytest.raises(OptBenchError, match=r"^argument --max_steps/--max-steps: invalid int value: 'ten'\. Fix "):
        typed_values({}, ["--max_steps", "ten"], None, keys)
    with pytest.raises(OptBenchError, match=r"^max_steps in recipe 'r.yaml': invalid int value: '1.5'\. Fix "):
        typed_values({"max_steps": 1.5}, [], "r.yaml", keys)
    with pytest.raises(OptBenchError, match=r"^weight_decay in recipe 'r.yaml' is a mapping"):
        typed_values({"weight_decay": {"a": 1}}, [], "r.yaml", keys)


@pytest.mark.parametrize(("value", "flag"), [(True, True), ("true", True), ("Y", True), ("0", False), ("no", False),
                                             ("maybe", None), (" true", None)])
def test_read_flag_takes_the_spellings_string_to_bool_takes(value: object, flag: bool | None) -> None:
    from transformers.hf_argparser import string_to_bool

    assert read_flag(value) is flag
    if flag is not None:
        assert string_to_bool(value) is flag
    else:
        with pytest.raises(Exception, match="Truthy value expected"):
            string_to_bool(value)
