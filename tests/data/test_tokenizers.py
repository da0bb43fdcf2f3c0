"""Tokenizers: offline training round-trips through AutoTokenizer, Thai marks, char level, and clear load errors."""

from __future__ import annotations

import json
import time

import pytest

from hf_optbench.cli.tokenizer import main as cli_main
from hf_optbench.data.tokenizers import (
    EOS_TOKEN,
    builtin_tokenizers,
    load_tokenizer,
    tokenizer_fingerprint,
    tokens_per_char,
    train_tokenizer,
)
from hf_optbench.errors import OptBenchError

from fixtures.data_fixtures import BUILTIN_TOKENIZER, thai_documents, write_c4_layout, write_jsonl

SAMPLE = "ฝนตกหนักมาก น้ำในคลองเต็มแล้ว 123 ๑๒๓ ok!\nพรุ่งนี้ไปตลาดกัน"


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return thai_documents()


def test_train_save_autotokenizer_round_trip(tmp_path, docs):
    from transformers import AutoTokenizer

    trained = train_tokenizer(docs, 600, tmp_path / "tok", keep_thai_marks=True)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(loaded) == len(trained) == 600
    assert loaded.eos_token == loaded.bos_token == EOS_TOKEN and loaded.pad_token is None
    for text in (SAMPLE, docs[3]):
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == trained(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text  # byte-level: lossless, also for text it never saw
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(trained)
    meta = json.loads((tmp_path / "tok" / "optbench_tokenizer.json").read_text())
    assert meta["keep_thai_marks"] is True and meta["min_frequency"] == 2


def test_keeping_thai_marks_cuts_tokens_per_thai_character(tmp_path, docs):
    keep = train_tokenizer(docs, 1024, tmp_path / "keep", keep_thai_marks=True)
    split = train_tokenizer(docs, 1024, tmp_path / "split", keep_thai_marks=False)
    assert len(keep) == len(split) == 1024  # same vocabulary size: a fair comparison
    k = tokens_per_char(keep, docs)["tokens_per_thai_char"]
    s = tokens_per_char(split, docs)["tokens_per_thai_char"]
    assert k < 0.9 * s
    # GPT-2's pre-tokenizer cuts the tone mark off "น้ำ"; ours keeps the syllable whole
    split_pieces = split.backend_tokenizer.pre_tokenizer.pre_tokenize_str("น้ำ")
    keep_pieces = keep.backend_tokenizer.pre_tokenizer.pre_tokenize_str("น้ำ")
    assert len(split_pieces) > 1 and len(keep_pieces) == 1


def test_char_level_is_deterministic_and_lossless(tmp_path, docs):
    a = train_tokenizer(docs, 5000, tmp_path / "a", char_level=True, keep_thai_marks=False)
    b = train_tokenizer(list(reversed(docs)), 5000, tmp_path / "b", char_level=True, keep_thai_marks=False)
    assert a.get_vocab() == b.get_vocab()  # ids never depend on document order (a cached dataset must keep its meaning)
    text = docs[0][:200]
    ids = a(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and a.decode(ids) == text
    unk = a("☃", add_special_tokens=False)["input_ids"]
    assert unk == [a.unk_token_id] and a.unk_token_id != a.eos_token_id
    graphemes = train_tokenizer(docs, 5000, tmp_path / "g", char_level=True, keep_thai_marks=True)
    g_ids = graphemes(text, add_special_tokens=False)["input_ids"]
    assert len(g_ids) < len(ids) and graphemes.decode(g_ids) == text


def test_builtin_tokenizer_loads_offline(docs):
    assert "thai-bpe-2k" in builtin_tokenizers()
    tok = load_tokenizer(BUILTIN_TOKENIZER)
    assert tok.eos_token == EOS_TOKEN and len(tok) > 1000
    assert tok.decode(tok(docs[0])["input_ids"]) == docs[0]
    assert tokens_per_char(tok, docs)["tokens_per_thai_char"] < 0.5


def test_unknown_builtin_and_missing_paths(tmp_path):
    with pytest.raises(OptBenchError, match="builtin:thai-bpe-2k"):
        load_tokenizer("builtin:nope")
    with pytest.raises(OptBenchError, match="not found"):
        load_tokenizer(str(tmp_path / "missing" / "dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptBenchError, match="without tokenizer files"):
        load_tokenizer(str(tmp_path / "empty"))
    with pytest.raises(OptBenchError, match="empty"):
        load_tokenizer("  ")


def test_uncached_hub_id_offline_fails_fast_with_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(OptBenchError) as err:
        load_tokenizer("hf-optbench-tests/not-a-real-tokenizer")
    assert time.perf_counter() - t0 < 5
    msg = str(err.value)
    assert "HF_HUB_OFFLINE" in msg and "builtin:" in msg and "hf-optbench tokenizer train" in msg


def test_uncached_hub_id_unreachable_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("hf_optbench.data.tokenizers.hub_reachable", lambda *a, **k: False)
    t0 = time.perf_counter()
    with pytest.raises(OptBenchError, match="cannot be reached"):
        load_tokenizer("hf-optbench-tests/not-a-real-tokenizer")
    assert time.perf_counter() - t0 < 5


def test_hub_probe_is_bounded(monkeypatch):
    from hf_optbench.data.tokenizers import hub_reachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    t0 = time.perf_counter()
    assert hub_reachable(timeout=2) is False
    assert time.perf_counter() - t0 < 3


def test_bad_training_input(tmp_path):
    with pytest.raises(OptBenchError, match="too small"):
        train_tokenizer(["abc"], 100, tmp_path / "t")
    with pytest.raises(OptBenchError, match="no text"):
        train_tokenizer(["", ""], 300, tmp_path / "t")


def test_cli_train_from_c4_layout_then_stats(tmp_path, docs, capsys):
    from transformers import AutoTokenizer

    root = write_c4_layout(tmp_path / "c4", docs)
    out = tmp_path / "tok"
    assert cli_main(["train", "--input", str(root), "--vocab-size", "512", "--output", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == 512 and tok.decode(tok(SAMPLE)["input_ids"]) == SAMPLE
    meta = json.loads((out / "optbench_tokenizer.json").read_text())
    assert len(meta["input_files_sha256"]) == 2 and meta["documents"] == len(docs)

    path = write_jsonl(tmp_path / "d.jsonl", docs[:3])
    assert cli_main(["stats", "--tokenizer", str(out), "--input", str(path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tokens"] > 0 and 0 < stats["tokens_per_thai_char"] < 2

    assert cli_main(["train", "--input", str(path), "--vocab-size", "300", "--output", str(tmp_path / "c"),
                     "--char-level", "--no-keep-thai-marks"]) == 0
    assert json.loads((tmp_path / "c" / "optbench_tokenizer.json").read_text())["units"] == "code points"


def test_a_tokenizer_directory_asking_for_custom_code_is_refused_and_its_code_never_runs(tmp_path) -> None:
    """auto_map in tokenizer_config.json names the directory's own Python; loading it would run that file."""
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(builtin_tokenizers()["thai-bpe-2k"], tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "mine.MyTokenizer"]}
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    (tok / "mine.py").write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').close()\n"
                                 "from transformers import PreTrainedTokenizerFast as MyTokenizer\n")
    with pytest.raises(OptBenchError, match="tokenizer_config.json asks for custom tokenizer code"):
        load_tokenizer(str(tok))
    assert not (tmp_path / "RAN").exists()
