"""The step measurement builds the vocabulary the runs will train with: the LM head is most of a small model's step,
so GPT-2's 50,257 rows in place of a 2,000-token tokenizer made the ETA's estimate (and every sweep's start) slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_optbench.config.parse import parse_args
from hf_optbench.data.tokenizers import load_tokenizer
from hf_optbench.study import calibration as cal

QUICK = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart_cpu.yaml")


def _cfg(tmp_path: Path, *extra: str):
    return parse_args([QUICK, "--output_dir", str(tmp_path / "never"), *extra])


def test_a_shipped_tokenizer_gives_its_own_vocabulary(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert cfg.data.tokenizer_name.startswith("builtin:")
    expected = len(load_tokenizer(cfg.data.tokenizer_name))
    assert expected != cal.DEFAULT_VOCAB
    assert cal._vocab(cfg, cal.Entry("adamw", "tiny", ())) == expected


def test_a_recorded_vocabulary_and_the_synthetic_setting_come_first(tmp_path: Path) -> None:
    assert cal._vocab(_cfg(tmp_path), cal.Entry("adamw", "tiny", (), vocab_size=321)) == 321
    synthetic = _cfg(tmp_path, "--data_source", "synthetic", "--synthetic_vocab_size", "97")
    assert cal._vocab(synthetic, cal.Entry("adamw", "tiny", ())) == 97


def test_a_hub_tokenizer_not_on_this_machine_falls_back_to_gpt2s_without_the_network(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-home" / "hub"))
    cfg = _cfg(tmp_path, "--tokenizer_name", "nobody-here/no-such-tokenizer")
    called = []
    monkeypatch.setattr("hf_optbench.data.tokenizers.load_tokenizer", lambda name: called.append(name))
    assert cal._vocab(cfg, cal.Entry("adamw", "tiny", ())) == cal.DEFAULT_VOCAB
    assert called == []  # not even tried: nothing of it is here


@pytest.mark.parametrize("name", ["/no/such/tokenizer/dir"])
def test_a_missing_local_directory_falls_back(tmp_path: Path, name: str) -> None:
    assert cal._local_tokenizer_vocab(name) is None
