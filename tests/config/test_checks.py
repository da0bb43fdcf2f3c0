"""Paths a filesystem cannot hold are refused before any work (issue 32): a name past NAME_MAX, a path past PATH_MAX,
or a path that leaves no room for what a run creates inside it. The limits are the filesystem's own (os.pathconf),
counted in bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hf_optbench.config.checks import (
    RUN_DIR_LONGEST_INSIDE,
    check_init_from,
    check_path_fits,
    check_writable_dir,
    refused_pickle,
)
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


def _model_dir(root: Path, *, auto_map: bool = False, payload: bool = False, safetensors: bool = False) -> Path:
    """A tiny GPT-2 in ``root``: config.json (with ``auto_map`` asking for custom code), and its weights as
    pytorch_model.bin (a pickle; with ``payload``, one whose unpickling would run a command) or model.safetensors."""
    import json

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    root.mkdir()
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64, n_positions=16))
    model.config.to_json_file(root / "config.json")
    if safetensors:
        model.save_pretrained(root)
    elif payload:
        torch.save({"x": _Payload(str(root / "RAN"))}, root / "pytorch_model.bin")
    else:
        torch.save(model.state_dict(), root / "pytorch_model.bin")
    if auto_map:
        config = json.loads((root / "config.json").read_text())
        config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyLM"}
        (root / "config.json").write_text(json.dumps(config))
    return root


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_init_from_a_pickle_that_would_run_code_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Issue 41: the payload never ran (torch's weights_only loader refused it), but the run ended in a traceback
    after the data was built. It is refused at parse time, naming the file and what the pickle would import."""
    evil = _model_dir(tmp_path / "evil", payload=True)
    with pytest.raises(OptBenchError) as err:
        check_init_from(str(evil))
    assert "pytorch_model.bin is a pickle that torch's safe loader refuses" in str(err.value)
    assert "system" in str(err.value) and not (evil / "RAN").exists()
    assert refused_pickle(_model_dir(tmp_path / "plain") / "pytorch_model.bin") is None
    check_init_from(str(tmp_path / "plain"))  # a plain state dict of tensors loads
    check_init_from(str(_model_dir(tmp_path / "st", safetensors=True)))


def test_init_from_a_config_asking_for_custom_code_is_refused(tmp_path: Path) -> None:
    """Issue 41: a config.json with auto_map was loaded as the stock class of its model_type without a word."""
    with pytest.raises(OptBenchError, match=r"asks for custom modelling code \(auto_map: AutoModelForCausalLM -> "
                                            r"modeling_mine.MyLM\)"):
        check_init_from(str(_model_dir(tmp_path / "custom", auto_map=True, safetensors=True)))
    broken = _model_dir(tmp_path / "broken", safetensors=True)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(OptBenchError, match="config.json is not a readable model config"):
        check_init_from(str(broken))
