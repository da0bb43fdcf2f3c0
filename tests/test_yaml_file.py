"""The one YAML loader: every file it refuses gives one OptBenchError line (exit 2) naming the file, the place and
the fix, fast and before anything is written; recipes, sweep files and tuned files all go through it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hf_optbench import cli
from hf_optbench.errors import OptBenchError
from hf_optbench.yaml_file import MAX_NESTING, MAX_SETTINGS_BYTES, load_yaml_mapping, nesting_depth

ROOT = Path(__file__).resolve().parents[1]
# Nine levels of nine aliases: 9**9 (387 million) strings once expanded.
BOMB = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))

BAD_FILES = [
    # (file name, bytes, the words the message must hold)
    ("dup.yaml", b"model_size: tiny\nmax_steps: 5\nmax_steps: 50\n", ["'max_steps' is given twice", "line 3",
                                                                    "first at line 2"]),
    ("dup_nested.yaml", b"optimizer_kwargs:\n  eps: 1.0e-8\n  eps: 1.0e-6\n", ["'eps' is given twice", "line 3"]),
    ("dup.json", b'{"max_steps": 5, "max_steps": 50}', ["'max_steps' twice"]),
    ("bomb.yaml", BOMB.encode(), ["alias '*a0'", "line 2", "Write the values out"]),
    ("merge.yaml", b"base: &b {max_steps: 5}\nrun:\n  <<: *b\n", ["alias '*b'"]),
    ("empty.yaml", b"# only a comment\n\n", ["is empty", "recipes/quickstart_cpu.yaml"]),
    ("zero.yaml", b"", ["is empty"]),
    ("list.yaml", b"- model_size\n- tiny\n", ["must be a mapping", "got list"]),
    ("scalar.yaml", b"tiny\n", ["must be a mapping", "got str"]),
    ("syntax.yaml", b"model_size: tiny\nmax_steps: [5\n", ["not valid YAML at line 3, column 1"]),
    ("syntax.json", b'{"max_steps": 5,}', ["not valid JSON at line 1, column 17"]),
    ("latin1.yaml", "model_size: tiny\n# caf\xe9\n".encode("latin-1"), ["not UTF-8", "0xe9"]),
    ("binary.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["binary file", "NUL byte"]),
    # issue 41: 100,000 nested lists were a RecursionError traceback; one level past the limit is refused too
    ("nested.yaml", b"a: " + b"[" * 100_000 + b"]" * 100_000, ["nested more than 32 levels", "line 1, column 35"]),
    ("nested33.yaml", b"a: " + b"[" * 32 + b"]" * 32, ["nested more than 32 levels"]),
    ("nested_block.yaml", "".join(f"{'  ' * i}k{i}:\n" for i in range(40)).encode() + b"  " * 40 + b"v: 1\n",
     ["nested more than 32 levels", "line 32"]),
    ("nested.json", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ["nested more than 32 levels"]),
    ("nested33.json", b'{"a": ' + b"[" * 32 + b"]" * 32 + b"}", ["nested more than 32 levels"]),
    ("big.yaml", b"# padding\n" * (MAX_SETTINGS_BYTES // 10 + 1), ["more than the 1,048,576 a settings file may"]),
]


@pytest.mark.parametrize("name, data, needles", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file_is_one_clear_error(name: str, data: bytes, needles: list[str], tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(OptBenchError) as info:
        load_yaml_mapping(path, "recipe file", "Pass key: value lines (see recipes/quickstart_cpu.yaml).")
    assert time.perf_counter() - start < 2.0  # the alias bomb used to end in MemoryError after 29-72 s
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_missing_directory_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match="recipe file not found: '.*nope.yaml'"):
        load_yaml_mapping(tmp_path / "nope.yaml", "recipe file")
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(OptBenchError, match="is a directory"):
        load_yaml_mapping(tmp_path / "dir.yaml", "recipe file")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return  # root reads a mode-000 file
    locked = tmp_path / "locked.yaml"
    locked.write_text("a: 1\n")
    locked.chmod(0)
    try:
        with pytest.raises(OptBenchError, match="cannot be read"):
            load_yaml_mapping(locked, "recipe file")
    finally:
        locked.chmod(0o600)


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero", "dev-null"])
def test_a_path_that_is_not_a_regular_file_is_refused_without_reading_it(kind: str, tmp_path: Path) -> None:
    """Issue 41: a recipe linked to /dev/zero was read until a MemoryError, a FIFO nobody writes hung the run."""
    path = tmp_path / "recipe.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path = Path("/dev/null")
    words = {"fifo": "is a FIFO (named pipe), not a file", "link-to-dev-zero": "(a link to '/dev/zero') is a "
             "character device", "dev-null": "is a character device, not a file"}[kind]
    with pytest.raises(OptBenchError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_yaml_mapping(path, "recipe file")


def test_the_limits_leave_room_for_every_file_the_project_writes_or_ships() -> None:
    """The largest settings files the project holds (a CPU study's tuned files, the shipped recipes and sweeps) are
    well inside the size and nesting limits."""
    files = [*ROOT.joinpath("recipes").rglob("*.yaml"), *ROOT.joinpath("docs", "results").rglob("*.yaml")]
    assert files
    for path in files:
        assert path.stat().st_size * 10 < MAX_SETTINGS_BYTES, path
        assert nesting_depth(load_yaml_mapping(path, "file")) * 2 < MAX_NESTING, path


def test_nesting_is_counted_without_recursion() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert nesting_depth(deep) == 100_001
    assert nesting_depth({"a": [1, {"b": 2}]}) == 3 and nesting_depth(5) == 0


def test_what_is_allowed_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("a: 1\nb: {a: 2}\nc: [a, a]\nd: &anchor_without_alias 3\n")
    assert load_yaml_mapping(path, "recipe file") == {"a": 1, "b": {"a": 2}, "c": ["a", "a"], "d": 3}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml_mapping(empty, "tuned file", empty_ok=True) == {}
    deepest = tmp_path / "deepest.yaml"  # nesting up to the limit loads, in YAML and JSON alike
    deepest.write_text("a: " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))
    assert nesting_depth(load_yaml_mapping(deepest, "recipe file")) == MAX_NESTING
    deepest.with_suffix(".json").write_text('{"a": ' + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1) + "}")
    assert nesting_depth(load_yaml_mapping(deepest.with_suffix(".json"), "recipe file")) == MAX_NESTING


def test_every_shipped_yaml_loads() -> None:
    """No recipe, sweep or accelerate config uses aliases or repeats a key (the loader refuses both)."""
    files = sorted(ROOT.joinpath("recipes").rglob("*.yaml"))
    files += sorted(ROOT.joinpath("accelerate_configs").glob("*.yaml"))
    assert files
    for path in files:
        assert load_yaml_mapping(path, "shipped file")


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("argv, needle", [
    (["run", "{T}/dup.yaml"], "'max_steps' is given twice"),
    (["validate", "{T}/dup.yaml", "--full"], "'max_steps' is given twice"),  # said "ok (full check)" before
    (["run", "{T}/empty.yaml"], "is empty"),
    (["run", "{T}/bomb.yaml"], "alias"),
    (["sweep", "{T}/sweep_dup.yaml", "--dry-run"], "'seed' is given twice"),
    (["run", "{Q}", "--tuned_hparams_file", "{T}/tuned_dup.yaml", "--output_dir", "{T}/out"],
     "'learning_rate' is given twice"),
])
def test_cli_refuses_before_writing(argv: list[str], needle: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup.yaml").write_text("model_size: tiny\nmax_steps: 5\nmax_steps: 50\nuse_cpu: true\n")
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "sweep_dup.yaml").write_text(
        f"base: {ROOT / 'recipes' / 'quickstart_cpu.yaml'}\noutput_dir: {tmp_path / 'sw'}\n"
        "matrix:\n  optimizer: [adamw]\n  model_size: [tiny]\n  seed: [0]\n  seed: [1]\n")
    (tmp_path / "tuned_dup.yaml").write_text("adamw:\n  tiny:\n    learning_rate: 0.001\n    learning_rate: 0.1\n")
    before = _snapshot(tmp_path)
    quick = str(ROOT / "recipes" / "quickstart_cpu.yaml")
    rc = cli.main([a.replace("{T}", str(tmp_path)).replace("{Q}", quick) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert _snapshot(tmp_path) == before  # no runs/ directory, no sweep directory


def test_a_tuned_file_with_a_shared_value_loads_back(tmp_path: Path) -> None:
    """safe_dump writes a list shared by two keys as an anchor and an alias, which the loader refuses: the tuned
    file is written without them."""
    from hf_optbench.optim.tuned import lookup_tuned
    from hf_optbench.study.tuning_phase import write_tuned

    grid = [0.5, 1.0, 2.0]
    path = write_tuned({"adamw": {"tiny": {"learning_rate": 1e-3, "grid": grid, "wd_grid": grid}}},
                       tmp_path / "tuned.yaml", "a test", merge=False)
    assert "*id" not in path.read_text()
    assert lookup_tuned(str(path), "adamw", "tiny")["learning_rate"] == 1e-3
