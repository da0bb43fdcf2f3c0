"""The one reader of the YAML (and JSON) files a user hands hf_optbench: recipes, sweep files, tuned-hyperparameter
files.

PyYAML's ``safe_load`` alone lets through what these files must not hold, silently or far too late: a key given
twice (the last one wins and a recipe runs with a value its author did not mean), an alias bomb (a few lines of
``&a [*b, *b, ...]`` that expand to gigabytes: ``MemoryError`` half a minute later), an empty file (a run on
every default), binary or non-UTF-8 bytes, and a top level that is not a mapping. :func:`load_yaml_mapping` turns
each into one :class:`~hf_optbench.errors.OptBenchError` line naming the file, the place and the fix, before any
work. Anchors and aliases are refused outright: no shipped file uses them, and a flat recipe never needs them.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError

_JSON_SUFFIXES = (".json",)


class _Refused(Exception):
    """A construct the loader refuses, with the YAML mark (line/column) where it starts."""

    def __init__(self, problem: str, line: int, column: int) -> None:
        super().__init__(problem)
        self.problem, self.line, self.column = problem, line, column


@functools.lru_cache(maxsize=1)
def _strict_loader() -> type:
    """A SafeLoader that refuses aliases and duplicate keys (built lazily: ``yaml`` is imported on first use)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _Refused(f"an alias '*{event.anchor}': anchors and aliases (and '<<: *name' merges) are not "
                               "supported, as they can expand to gigabytes. Write the values out",
                               event.start_mark.line + 1, event.start_mark.column + 1)
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if first is not None:
                    raise _Refused(f"key '{key}' is given twice (first at line {first}); YAML would keep only the last "
                                   "value, silently. Remove one of them",
                                   key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _read_text(p: Path, what: str, fix: str) -> str:
    """The file's text, or an OptBenchError for a missing, unreadable, binary or non-UTF-8 file."""
    if not p.exists():
        raise OptBenchError(f"{what} not found: '{p}'. {fix}")
    if p.is_dir():
        raise OptBenchError(f"{what} '{p}' is a directory, not a file. {fix}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise OptBenchError(f"{what} '{p}' cannot be read ({exc.strerror or exc}). Check its permissions.") from None
    nul = data.find(b"\x00")
    if nul >= 0:
        raise OptBenchError(f"{what} '{p}' is a binary file, not UTF-8 YAML text (a NUL byte at position {nul}). {fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OptBenchError(
            f"{what} '{p}' is not UTF-8 text (byte {exc.object[exc.start]:#04x} at position {exc.start}). Save it "
            "as UTF-8."
        ) from None


def _parse_json(text: str, p: Path, what: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise OptBenchError(f"{what} '{p}' sets '{key}' twice: JSON would keep only the last value, "
                                    "silently. Remove one of them.")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise OptBenchError(f"{what} '{p}' is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}. "
                            "Fix the file.") from None


def _parse_yaml(text: str, p: Path, what: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except _Refused as exc:
        raise OptBenchError(f"{what} '{p}', line {exc.line}, column {exc.column}: {exc.problem}.") from None
    except yaml.YAMLError as exc:  # one line: the problem and where, not PyYAML's multi-line excerpt
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise OptBenchError(f"{what} '{p}' is not valid YAML{where}: {problem}. Fix the file.") from None


def load_yaml_mapping(path: str | os.PathLike[str], what: str, fix: str = "", *,
                      empty_ok: bool = False) -> dict[str, Any]:
    """The top-level mapping of the YAML (or, for ``*.json``, JSON) file ``path``.

    ``what`` names the file in messages ("recipe file", "sweep file"); ``fix`` is the advice appended where the file
    is missing, empty or of the wrong shape. Raises OptBenchError for a missing, unreadable, binary or non-UTF-8
    file, a syntax error (with line and column), a key given twice, an alias, an empty file (unless ``empty_ok``:
    then ``{}``) and a top level that is not a mapping.
    """
    p = Path(path)
    text = _read_text(p, what, fix)
    data = _parse_json(text, p, what) if p.suffix.lower() in _JSON_SUFFIXES else _parse_yaml(text, p, what)
    if data is None:
        if empty_ok:
            return {}
        raise OptBenchError(f"{what} '{p}' is empty (nothing but comments or blank lines). {fix}".rstrip())
    if not isinstance(data, dict):
        raise OptBenchError(f"{what} '{p}' must be a mapping of key: value, got {type(data).__name__}. "
                            f"{fix}".rstrip())
    return data


def read_yaml_or_empty(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A file hf_optbench wrote itself (a run's config.yaml, a tuned file), read by reports that carry on without
    it: its mapping, or {} when it is missing, unreadable or damaged (the same strict loader, errors swallowed)."""
    try:
        return load_yaml_mapping(path, "file", empty_ok=True)
    except OptBenchError:
        return {}


def dump_yaml(data: Any, *, sort_keys: bool = True) -> str:
    """YAML text that :func:`load_yaml_mapping` reads back: a value shared between keys is written out again, never
    as an anchor and alias (which the loader refuses), so every file hf_optbench writes can be read and rerun."""
    import yaml

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(data, Dumper=NoAliases, sort_keys=sort_keys)
