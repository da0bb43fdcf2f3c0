"""The one reader of the YAML (and JSON) files a user hands hf_optbench: recipes, sweep files, tuned-hyperparameter
files.

PyYAML's ``safe_load`` alone lets through what these files must not hold, silently or far too late: a key given
twice (the last one wins and a recipe runs with a value its author did not mean), an alias bomb (a few lines of
``&a [*b, *b, ...]`` that expand to gigabytes: ``MemoryError`` half a minute later), an empty file (a run on
every default), binary or non-UTF-8 bytes, and a top level that is not a mapping. Nor do they stop a file that is
not a file or too large to be a settings file (a recipe linked to ``/dev/zero`` is read until a ``MemoryError``,
a FIFO nobody writes hangs the run) or nesting deep enough to exhaust Python's recursion (100,000
nested lists: a ``RecursionError`` traceback). :func:`load_yaml_mapping` turns each into one
:class:`~hf_optbench.errors.OptBenchError` line naming the file, the place and the fix, before any work. Anchors
and aliases are refused outright: no shipped file uses them, and a flat recipe never needs them.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError

_JSON_SUFFIXES = (".json",)
# The largest settings file read. A recipe is ~1 KB, a sweep file ~5 KB, and the largest file the project writes
# for a user to read back, a CPU study's tuned file (docs/results/cpu_study/tuned/), ~33 KB; PyYAML's pure-Python
# loader (the strict loader below subclasses it) read a 1.1 MB flat mapping in ~11 s on the shared 2-core machine,
# holding ~86 MB of Python objects at its peak. 1 MiB is 30x the largest real file and answers in seconds.
MAX_SETTINGS_BYTES = 1 << 20
# The deepest nesting of mappings and lists accepted in a settings file or a JSON value such as optimizer_kwargs.
# The deepest the project writes is ~6 (a tuned file: optimizer -> size -> ladder -> rung -> curve -> point); the
# loaders recurse once per level (PyYAML's composer several Python frames a level: 100 levels loaded, 500 exhausted
# the interpreter's 1,000-frame limit; json.loads stops before 1,000), so 32 leaves room and never reaches it.
MAX_NESTING = 32


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
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if self.check_event(yaml.AliasEvent):
                raise _Refused(f"an alias '*{event.anchor}': anchors and aliases (and '<<: *name' merges) are not "
                               "supported, as they can expand to gigabytes. Write the values out",
                               event.start_mark.line + 1, event.start_mark.column + 1)
            if self.depth >= MAX_NESTING:  # refused before the composer recurses any deeper
                raise _Refused(_nesting_problem(), event.start_mark.line + 1, event.start_mark.column + 1)
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

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


def _nesting_problem() -> str:
    return (f"values nested more than {MAX_NESTING} levels deep (mappings and lists inside each other); a settings "
            "file needs a few. Flatten it")


def nesting_depth(value: Any) -> int:
    """How deep mappings and lists nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def loads_json_bounded(text: str, **kwargs: Any) -> Any:
    """``json.loads(text)`` that raises ValueError (a JSONDecodeError's kind, with the reason) instead of a
    RecursionError traceback for nesting past what the reader can hold, or for nesting past :data:`MAX_NESTING`."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise ValueError(_nesting_problem()) from None
    if nesting_depth(value) > MAX_NESTING:
        raise ValueError(_nesting_problem())
    return value


def _file_kind(mode: int) -> str | None:
    """What a path that is not a regular file is, in words; None for a regular file."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character "
             "device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((words for test, words in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def _read_text(p: Path, what: str, fix: str) -> str:
    """The file's text, or an OptBenchError for a missing, unreadable, binary or non-UTF-8 file, for a path that is
    not a regular file (a device such as /dev/zero, a FIFO: checked with stat, which never blocks on a FIFO, through
    symbolic links) and for a file over :data:`MAX_SETTINGS_BYTES` (read no further than that)."""
    try:
        info = p.stat()
    except FileNotFoundError:
        raise OptBenchError(f"{what} not found: '{p}'. {fix}") from None
    except OSError as exc:
        raise OptBenchError(f"{what} '{p}' cannot be read ({exc.strerror or exc}). Check the path.") from None
    kind = _file_kind(info.st_mode)
    if kind is not None:
        target = f" (a link to '{os.path.realpath(p)}')" if p.is_symlink() else ""
        raise OptBenchError(f"{what} '{p}'{target} is {kind}, not a file. {fix}".rstrip())
    if info.st_size > MAX_SETTINGS_BYTES:
        raise OptBenchError(f"{what} '{p}' holds {info.st_size:,} bytes, more than the {MAX_SETTINGS_BYTES:,} a settings "
                            "file may (the largest the project writes is ~33 KB). Pass the recipe, sweep or tuned "
                            "file itself.")
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_SETTINGS_BYTES + 1)  # a file that grew since stat() is read no further
    except OSError as exc:
        raise OptBenchError(f"{what} '{p}' cannot be read ({exc.strerror or exc}). Check its permissions.") from None
    if len(data) > MAX_SETTINGS_BYTES:
        raise OptBenchError(f"{what} '{p}' holds more than the {MAX_SETTINGS_BYTES:,} bytes a settings file may. "
                            "Pass the recipe, sweep or tuned file itself.")
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
        return loads_json_bounded(text, object_pairs_hook=pairs)
    except OptBenchError:
        raise
    except json.JSONDecodeError as exc:
        raise OptBenchError(f"{what} '{p}' is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}. "
                            "Fix the file.") from None
    except ValueError as exc:  # nesting (loads_json_bounded)
        raise OptBenchError(f"{what} '{p}': {exc}.") from None


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
