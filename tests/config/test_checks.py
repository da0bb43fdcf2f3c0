"""Paths a filesystem cannot hold are refused before any work (issue 32): a name past NAME_MAX, a path past PATH_MAX,
or a path that leaves no room for what a run creates inside it. The limits are the filesystem's own (os.pathconf),
counted in bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hf_optbench.config.checks import RUN_DIR_LONGEST_INSIDE, check_path_fits, check_writable_dir
from hf_optbench.errors import OptBenchError


def _fill_to(root: Path, total: int) -> Path:
    """A path under ``root`` of exactly ``total`` bytes, in names of 200 bytes at most."""
    parts, left = [], total - len(os.fsencode(str(root)))
    while left > 0:
        n = min(200, left - 1)  # one byte for the separator
        parts.append("c" * n)
        left -= n + 1
    path = root.joinpath(*parts)
    assert len(os.fsencode(str(path))) == total
    return path


def test_a_name_past_name_max_is_refused_in_bytes(tmp_path: Path) -> None:
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    check_path_fits(tmp_path / ("a" * name_max), "output_dir")
    with pytest.raises(OptBenchError, match=rf"name of {name_max + 1} bytes .*\(NAME_MAX\)"):
        check_path_fits(tmp_path / ("a" * (name_max + 1)), "output_dir")
    thai = "ก" * (name_max // 3 + 1)  # fewer characters than NAME_MAX, more bytes
    assert len(thai) < name_max
    with pytest.raises(OptBenchError, match="NAME_MAX"):
        check_writable_dir(tmp_path / thai, "output_dir")
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_path_leaving_no_room_for_the_runs_own_files_is_refused(tmp_path: Path) -> None:
    path_max = os.pathconf(tmp_path, "PC_PATH_MAX")
    inside = len(os.fsencode(RUN_DIR_LONGEST_INSIDE)) + 1
    fits = _fill_to(tmp_path, path_max - 1 - inside)
    check_path_fits(fits, "output_dir", RUN_DIR_LONGEST_INSIDE)
    no_room = _fill_to(tmp_path, path_max - inside)
    check_path_fits(no_room, "output_dir")  # alone it fits
    with pytest.raises(OptBenchError, match="the longest path created inside it makes .*PATH_MAX"):
        check_path_fits(no_room, "output_dir", RUN_DIR_LONGEST_INSIDE)
    with pytest.raises(OptBenchError, match=rf"is {path_max} bytes long, past the {path_max - 1} bytes"):
        check_writable_dir(_fill_to(tmp_path, path_max), "output_dir")


def test_the_error_line_stays_short(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError) as caught:
        check_path_fits(tmp_path / ("a" * 5000), "output_dir")
    assert len(str(caught.value)) < 400 and "\n" not in str(caught.value)
