"""Splits: the held-out tuning split (issue 12), .txt files read by line (issue 17.1), and the split-size errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.pipeline import prepare_data
from hf_optbench.data.split import is_eval_document, is_tuning_document
from hf_optbench.data.tokenizers import load_tokenizer
from hf_optbench.errors import OptBenchError

from fixtures.data_fixtures import BUILTIN_TOKENIZER, thai_documents


def _args(tmp_path: Path, **kw) -> DataArguments:
    base = {"tokenizer_name": BUILTIN_TOKENIZER, "data_cache_dir": str(tmp_path / "cache"), "block_size": 32}
    return DataArguments(**{**base, **kw})


def _rows(ds) -> set[tuple[int, ...]]:
    return {tuple(r) for r in ds["input_ids"]}


def _ids(ds) -> np.ndarray:
    return np.asarray(ds["input_ids"], dtype=np.int64)


def _write_lines(path: Path) -> Path:
    """The Thai sample as one plain-text corpus, one sentence-like piece per line (~200 lines)."""
    lines = [piece for doc in thai_documents() for piece in doc.split(" ") if len(piece) > 20]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------- tuning split
def test_tuning_documents_are_disjoint_from_eval_and_spread():
    flags = [(is_eval_document(i, 0.1, 3), is_tuning_document(i, 0.1, 3)) for i in range(2000)]
    assert not any(ev and tu for ev, tu in flags)
    assert sum(ev for ev, _ in flags) == 200 and 150 < sum(tu for _, tu in flags) <= 200
    assert [tu for _, tu in flags] != [is_tuning_document(i, 0.1, 4) for i in range(2000)]


def test_text_tuning_split_is_disjoint_and_leaves_eval_unchanged(tmp_path):
    tok = load_tokenizer(BUILTIN_TOKENIZER)
    kw = {"validation_fraction": 0.2, "validation_blocks": 4}
    plain = prepare_data(_args(tmp_path, **kw), n_positions=128)
    tuned = prepare_data(_args(tmp_path, tuning_blocks=5, **kw), n_positions=128)
    assert plain.tuning is None and plain.info["tuning_blocks"] == 0
    assert tuned.tuning.num_rows == 5 and tuned.info["tuning_blocks"] == 5
    assert tuned.info["fingerprint"] != plain.info["fingerprint"]  # the cache key includes tuning_blocks
    assert np.array_equal(_ids(tuned.eval), _ids(plain.eval))  # the reported eval split does not move
    assert tuned.train.num_rows < plain.train.num_rows
    assert not _rows(tuned.tuning) & _rows(tuned.train) and not _rows(tuned.tuning) & _rows(tuned.eval)
    # document level: the tuning blocks are exactly the first tokens of the tuning documents, in order
    docs = thai_documents()
    stream = []
    for i, text in enumerate(docs):
        if is_tuning_document(i, 0.2, tuned.info["split_seed"]):
            stream += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert np.array_equal(_ids(tuned.tuning).reshape(-1), np.asarray(stream[: 5 * 32]))
    assert np.array_equal(np.asarray(tuned.tuning["labels"]), _ids(tuned.tuning))
    hit = prepare_data(_args(tmp_path, tuning_blocks=5, **kw), n_positions=128)
    assert hit.info["cache_hit"] and np.array_equal(_ids(hit.tuning), _ids(tuned.tuning))


def test_tuning_split_with_a_token_budget(tmp_path):
    bundle = prepare_data(_args(tmp_path, max_train_tokens=320, validation_blocks=2, tuning_blocks=2,
                                validation_fraction=0.2), n_positions=128)
    assert (bundle.train.num_rows, bundle.eval.num_rows, bundle.tuning.num_rows) == (10, 2, 2)


def test_synthetic_tuning_split_has_its_own_stream(tmp_path):
    kw = {"data_source": "synthetic", "synthetic_num_tokens": 64 * 200, "validation_blocks": 8, "block_size": 64}
    plain = prepare_data(_args(tmp_path, **kw), n_positions=128)
    tuned = prepare_data(_args(tmp_path, tuning_blocks=6, **kw), n_positions=128)
    assert plain.tuning is None
    assert tuned.tuning.num_rows == 6 and tuned.info["fingerprint"] != plain.info["fingerprint"]
    assert np.array_equal(_ids(tuned.train), _ids(plain.train)) and np.array_equal(_ids(tuned.eval), _ids(plain.eval))
    assert not _rows(tuned.tuning) & _rows(tuned.train) and not _rows(tuned.tuning) & _rows(tuned.eval)
    again = prepare_data(_args(tmp_path / "b", tuning_blocks=6, **kw), n_positions=128)
    assert np.array_equal(_ids(again.tuning), _ids(tuned.tuning))


def test_tuning_split_larger_than_the_data(tmp_path):
    with pytest.raises(OptBenchError, match="tuning split larger than the data: tuning_blocks=500"):
        prepare_data(_args(tmp_path, tuning_blocks=500), n_positions=128)
    with pytest.raises(OptBenchError, match="tuning_blocks must be an integer >= 0"):
        DataArguments(tuning_blocks=-1)


# ------------------------------------------------------------------------------------------------ .txt corpora
def test_one_txt_file_is_read_by_line_by_default(tmp_path):
    corpus = _write_lines(tmp_path / "corpus.txt")
    n_lines = len(corpus.read_text(encoding="utf-8").splitlines())
    bundle = prepare_data(_args(tmp_path, data_source="local", data_files=[str(corpus)]), n_positions=128)
    assert sum(bundle.info["num_documents"].values()) == n_lines > 100
    assert bundle.train.num_rows > 0 and bundle.eval.num_rows > 0


def test_one_txt_document_names_txt_sample_by(tmp_path):
    corpus = _write_lines(tmp_path / "corpus.txt")
    args = _args(tmp_path, data_source="local", data_files=[str(corpus)], txt_sample_by="document")
    with pytest.raises(OptBenchError, match="txt_sample_by=document, which gives 1 document.*--txt_sample_by line"):
        prepare_data(args, n_positions=128)


def test_block_size_beyond_a_text_source_blames_block_size(tmp_path):
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text('{"text": "สวัสดีครับ"}\n{"text": "ขอบคุณครับ"}\n', encoding="utf-8")
    big = DataArguments(block_size=1 << 21)  # a non-synthetic source: synthetic_num_tokens is not involved
    assert big.synthetic_num_tokens < big.block_size
    with pytest.raises(OptBenchError, match="block_size=512 is larger than all of local") as err:
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tiny)], block_size=512), n_positions=1024)
    assert "synthetic" not in str(err.value)
    with pytest.raises(OptBenchError, match="synthetic_num_tokens"):  # the synthetic source still checks it
        DataArguments(data_source="synthetic", block_size=1 << 21)
