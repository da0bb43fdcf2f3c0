"""gzip difficulty: the ratio's scale, its rise with alpha, the alpha search, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_optbench.cli.data import main as cli_main
from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.difficulty import (
    OFFLINE_TOKENIZER,
    calibrate_alphas,
    gzip_ratio,
    gzip_ratio_bytes,
    source_difficulty,
    synthetic_ratio,
)
from hf_optbench.errors import OptBenchError

from fixtures.data_fixtures import BUILTIN_TOKENIZER


def test_ratio_scale_random_vs_constant():
    rng = np.random.default_rng(0)
    assert 0.98 < gzip_ratio(rng.integers(0, 32, 200_000), 32) < 1.1  # no structure: ~1
    assert gzip_ratio(np.zeros(200_000, dtype=int), 32) < 0.01
    assert 0.98 < gzip_ratio(rng.integers(0, 1000, 100_000), 1000) < 1.3  # uint16 path: gzip pays ~20% more
    with pytest.raises(OptBenchError):
        gzip_ratio([], 32)
    assert gzip_ratio_bytes(b"ab" * 1000) < 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_difficulty_rises_with_alpha(seed):
    alphas = [1e-3, 1e-2, 3e-2, 0.1, 1.0]
    ratios = [synthetic_ratio(a, a, seed=seed, sample_tokens=1 << 16) for a in alphas]
    assert all(x < y for x, y in zip(ratios, ratios[1:], strict=False)), ratios
    hidden = [synthetic_ratio(1e-3, a, seed=seed, sample_tokens=1 << 16) for a in (1e-2, 0.1, 1.0)]
    assert all(x < y for x, y in zip(hidden, hidden[1:], strict=False)), hidden


def test_calibration_hits_the_target():
    res = calibrate_alphas(0.6, sample_tokens=1 << 16, seed=1)
    assert abs(res["ratio"] - 0.6) <= 0.005
    assert res["alpha_x"] == res["alpha_z"]
    again = synthetic_ratio(res["alpha_x"], res["alpha_z"], seed=1, sample_tokens=1 << 16)
    assert again == pytest.approx(res["ratio"])
    with pytest.raises(OptBenchError, match="outside"):
        calibrate_alphas(0.75, tune="alpha_z", alpha_x=1e-4, sample_tokens=1 << 14)


def test_default_synthetic_settings_sit_at_the_target_ratio():
    args = DataArguments(data_source="synthetic")
    ratio = source_difficulty(args, sample_tokens=1 << 18)["token_ratio"]
    assert 0.70 < ratio < 0.80


def test_text_source_difficulty():
    res = source_difficulty(DataArguments(tokenizer_name=BUILTIN_TOKENIZER))
    assert res["documents"] == 20 and 0.1 < res["byte_ratio"] < 0.6
    assert 0.2 < res["token_ratio"] < 1.2
    assert res["tokenizer"] == BUILTIN_TOKENIZER and "tokenizer_note" not in res
    # a tokenizer the user named is loaded exactly or refused with the fix: never a ratio under another one
    with pytest.raises(OptBenchError, match="cannot be loaded.*Fix"):
        source_difficulty(DataArguments(tokenizer_name="hf-optbench-tests/not-a-real-tokenizer"))


@pytest.fixture
def hub_tokenizer_offline(monkeypatch):
    """The default Hub tokenizer cannot be loaded (as offline), whatever this machine's Hugging Face cache holds."""
    from hf_optbench.data import tokenizers

    real = tokenizers.load_tokenizer

    def load(name):
        if name == tokenizers.DEFAULT_HUB_TOKENIZER:
            raise tokenizers._not_available_error(name, "it is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
        return real(name)

    monkeypatch.setattr(tokenizers, "load_tokenizer", load)


def test_defaults_offline_measure_with_the_shipped_tokenizer_and_say_so(hub_tokenizer_offline, capsys):
    res = source_difficulty(DataArguments())  # every default: thai_sample + flax-community/gpt2-base-thai
    assert res["tokenizer"] == OFFLINE_TOKENIZER and 0.2 < res["token_ratio"] < 1.2
    assert "flax-community/gpt2-base-thai" in res["tokenizer_note"] and "HF_HUB_OFFLINE" in res["tokenizer_note"]
    assert cli_main(["difficulty"]) == 0
    out = capsys.readouterr().out
    assert "token_ratio: None" not in out and "measured with builtin:thai-bpe-2k" in out
    assert "(gzip bits per token / log2(vocab): 1 = no structure" in out  # every number says what it is


def test_cli(capsys):
    assert cli_main(["difficulty", "--source", "synthetic", "--sample_tokens", "20000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "synthetic" and 0 < out["token_ratio"] < 1.2
    assert cli_main(["difficulty", "--data_source", "synthetic", "--target-ratio", "0.5", "--sample_tokens", "20000"]) == 0
    assert "synthetic_alpha_x" in capsys.readouterr().out
    with pytest.raises(OptBenchError, match="--data_source synthetic"):
        cli_main(["difficulty", "--target_ratio", "0.7"])
    with pytest.raises(OptBenchError, match="unknown data tool 'nope'"):  # the dispatcher: exit 2, one line
        cli_main(["nope"])
