"""Data pipeline: sources, packing, the fixed split, the cache, and every bad input named in issue 3."""

from __future__ import annotations

import dataclasses
import gzip
import time
from pathlib import Path

import numpy as np
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data import pipeline as data_mod
from hf_optbench.data.pipeline import check_model_vocab, prepare_data
from hf_optbench.data.sources import iter_documents, resolve_local_files
from hf_optbench.data.split import is_eval_document
from hf_optbench.data.tokenizers import load_tokenizer
from hf_optbench.errors import OptBenchError

from fixtures.data_fixtures import BUILTIN_TOKENIZER, thai_documents, write_c4_layout, write_jsonl


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(BUILTIN_TOKENIZER)


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return thai_documents()


def _args(tmp_path: Path, **kw) -> DataArguments:
    base = {"tokenizer_name": BUILTIN_TOKENIZER, "data_cache_dir": str(tmp_path / "cache"), "block_size": 64}
    return DataArguments(**{**base, **kw})


def _ids(ds) -> np.ndarray:
    return np.asarray(ds["input_ids"], dtype=np.int64)


def _expected_stream(docs, tokenizer, fraction, seed, want_eval):
    out = []
    for i, text in enumerate(docs):
        if is_eval_document(i, fraction, seed) == want_eval:
            out += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return np.asarray(out, dtype=np.int64)


# ------------------------------------------------------------------------------------------------------ sources
def test_local_c4_layout_loads_like_the_hub(tmp_path, monkeypatch, docs):
    root = write_c4_layout(tmp_path / "c4", docs, shards=3, validation=docs[:2])
    local = resolve_local_files([str(root)])
    assert local.c4_layout and len(local.files) == 3 and all("validation" not in f for f in local.files)
    # same documents, same order, despite the malformed timestamps
    assert list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(root)]))) == docs
    assert list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(root)], dataset_split="validation"))) == docs[:2]
    local_bundle = prepare_data(_args(tmp_path, data_source="local", data_files=[str(root)]), n_positions=128)

    # The hub path, with datasets.load_dataset answering from the local copy: same code path after opening.
    import datasets

    real_load = datasets.load_dataset
    calls = []

    def fake_load(name, config=None, **kw):
        calls.append((name, config, kw))
        return real_load("json", data_files={"train": local.files}, split="train", streaming=True, features=kw["features"])

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr("hf_optbench.data.tokenizers.hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub_bundle = prepare_data(_args(tmp_path / "h", data_source="hub"), n_positions=128)
    (name, config, kw), = calls
    assert (name, config, kw["split"], kw["streaming"]) == ("allenai/c4", "th", "train", True)
    assert kw["features"]["timestamp"].dtype == "string"
    assert np.array_equal(_ids(hub_bundle.train), _ids(local_bundle.train))
    assert np.array_equal(_ids(hub_bundle.eval), _ids(local_bundle.eval))
    # offline again: the cached copy is used without touching the Hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = prepare_data(_args(tmp_path / "h", data_source="hub"), n_positions=128)
    assert again.info["cache_hit"] and len(calls) == 1


def test_hub_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(OptBenchError, match="data_source: local"):
        prepare_data(_args(tmp_path, data_source="hub"), n_positions=128)
    assert time.perf_counter() - t0 < 10


def test_txt_paragraphs_and_parquet(tmp_path, docs):
    txt = tmp_path / "corpus.txt"
    txt.write_text("\n\n".join(docs[:5]) + "\n", encoding="utf-8")
    got = list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(txt)], txt_sample_by="paragraph")))
    assert got == docs[:5]
    lines = list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(txt)])))  # default: by line
    assert len(lines) == sum(d.count("\n") + 1 for d in docs[:5])

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": docs[:4], "n": list(range(4))}), tmp_path / "c.parquet")
    got = list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "*.parquet")], text_column="body")))
    assert got == docs[:4]


def test_max_documents_takes_the_first_n(tmp_path, docs):
    path = write_jsonl(tmp_path / "d.jsonl", [""] + docs)  # the empty document is skipped, not counted
    got = list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(path)], max_documents=3)))
    assert got == docs[:3]
    bundle = prepare_data(_args(tmp_path, data_source="local", data_files=[str(path)], max_documents=12,
                                validation_fraction=0.25), n_positions=128)
    assert sum(bundle.info["num_documents"].values()) == 12


# ------------------------------------------------------------------------------------------------------ packing
def test_packing_loses_and_duplicates_no_token_but_the_final_partial_block(tmp_path, tokenizer, docs):
    args = _args(tmp_path, validation_fraction=0.2, block_size=48)
    bundle = prepare_data(args, n_positions=128)
    for split, want_eval in (("train", False), ("eval", True)):
        ds = getattr(bundle, split)
        got = _ids(ds)
        assert got.shape[1] == 48
        assert np.array_equal(got, np.asarray(ds["labels"]))
        flat = got.reshape(-1)
        expected = _expected_stream(docs, tokenizer, 0.2, args.split_seed, want_eval)
        assert len(expected) - len(flat) < 48  # only the final partial block is dropped
        assert len(expected) - len(flat) == bundle.info["dropped_tail_tokens"][split]
        assert np.array_equal(flat, expected[: len(flat)])  # in order: nothing lost, nothing repeated
    assert bundle.info["train_tokens"] == bundle.train.num_rows * 48
    assert (_ids(bundle.train) == tokenizer.eos_token_id).sum() >= 15  # EOS between documents


def test_max_train_tokens_is_exact_in_whole_blocks(tmp_path):
    bundle = prepare_data(_args(tmp_path, max_train_tokens=1000, validation_blocks=3), n_positions=128)
    assert bundle.train.num_rows == 1000 // 64 and bundle.eval.num_rows == 3


def test_default_collator_and_torch_format(tmp_path):
    import torch
    from transformers import default_data_collator

    bundle = prepare_data(_args(tmp_path), n_positions=128)
    batch = default_data_collator([bundle.train[i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 64) and batch["input_ids"].dtype == torch.int64
    torch_ds = bundle.train.with_format("torch")
    batch = default_data_collator([torch_ds[i] for i in range(2)])
    assert batch["labels"].dtype == torch.int64
    assert bundle.vocab_size == len(bundle.tokenizer) and bundle.eos_token_id == bundle.tokenizer.eos_token_id
    assert bundle.pad_token_id is None  # GPT-2 style: no pad token


# ------------------------------------------------------------------------------------------------------ split
def test_split_fraction_is_exact_and_seeded():
    flags = [is_eval_document(i, 0.1, 7) for i in range(1000)]
    assert sum(flags) == 100
    assert flags != [is_eval_document(i, 0.1, 8) for i in range(1000)]


def test_validation_split_identical_across_runs_and_budgets(tmp_path):
    a = prepare_data(_args(tmp_path / "a", validation_blocks=4, max_train_tokens=640), n_positions=128)
    b = prepare_data(_args(tmp_path / "b", validation_blocks=4, max_train_tokens=2048), n_positions=128)
    c = prepare_data(_args(tmp_path / "c", validation_blocks=4), n_positions=128)
    assert not a.info["cache_hit"] and not b.info["cache_hit"]
    assert np.array_equal(_ids(a.eval), _ids(b.eval)) and np.array_equal(_ids(a.eval), _ids(c.eval))
    assert a.train.num_rows == 10 and b.train.num_rows == 32
    assert np.array_equal(_ids(a.train), _ids(b.train)[:10])  # a shorter budget is a prefix of a longer one
    train_rows = {tuple(r) for r in _ids(c.train)}
    assert not any(tuple(r) in train_rows for r in _ids(c.eval))  # held-out documents never reach training
    other = prepare_data(_args(tmp_path / "d", validation_blocks=4, split_seed=99), n_positions=128)
    assert not np.array_equal(_ids(other.eval), _ids(c.eval))


def test_worker_count_does_not_change_the_data(tmp_path):
    one = prepare_data(_args(tmp_path / "1", preprocessing_num_workers=1), n_positions=128)
    two = prepare_data(_args(tmp_path / "2", preprocessing_num_workers=2), n_positions=128)
    assert one.info["fingerprint"] == two.info["fingerprint"]
    assert np.array_equal(_ids(one.train), _ids(two.train)) and np.array_equal(_ids(one.eval), _ids(two.eval))


# ------------------------------------------------------------------------------------------------------ cache
def test_cache_is_reused_without_tokenizing(tmp_path, monkeypatch):
    args = _args(tmp_path)
    first = prepare_data(args, n_positions=128)
    assert first.info["cache_hit"] is False

    def boom(*a, **k):
        raise AssertionError("tokenized again despite a cached copy")

    monkeypatch.setattr(data_mod, "_tokenize_batch", boom)
    second = prepare_data(args, n_positions=128)
    assert second.info["cache_hit"] is True and second.info["fingerprint"] == first.info["fingerprint"]
    assert np.array_equal(_ids(second.train), _ids(first.train))
    assert second.train.cache_files and second.train.cache_files[0]["filename"].startswith(str(tmp_path / "cache"))
    with pytest.raises(AssertionError, match="tokenized again"):  # other settings -> another fingerprint
        prepare_data(dataclasses.replace(args, block_size=32), n_positions=128)


def test_local_file_change_invalidates_the_cache(tmp_path, docs):
    path = write_jsonl(tmp_path / "d.jsonl", docs[:10])
    args = _args(tmp_path, data_source="local", data_files=[str(path)], validation_fraction=0.2)
    first = prepare_data(args, n_positions=128)
    write_jsonl(path, docs[5:15])
    second = prepare_data(args, n_positions=128)
    assert second.info["cache_hit"] is False and second.info["fingerprint"] != first.info["fingerprint"]


# ------------------------------------------------------------------------------------------------------ synthetic
def test_synthetic_source_needs_no_tokenizer_and_is_deterministic(tmp_path):
    kw = {"data_source": "synthetic", "synthetic_num_tokens": 64 * 200, "validation_blocks": 8}
    a = prepare_data(_args(tmp_path / "a", **kw), n_positions=128)
    b = prepare_data(_args(tmp_path / "b", **kw), n_positions=128)
    assert a.tokenizer is None and a.vocab_size == 32 and a.eos_token_id is None
    assert a.train.num_rows == 200 and a.eval.num_rows == 8
    assert np.array_equal(_ids(a.train), _ids(b.train)) and np.array_equal(_ids(a.eval), _ids(b.eval))
    assert _ids(a.train).max() < 32
    bigger = prepare_data(_args(tmp_path / "a", **{**kw, "synthetic_num_tokens": 64 * 400}), n_positions=128)
    assert np.array_equal(_ids(bigger.eval), _ids(a.eval))  # eval does not depend on the training budget
    assert not np.array_equal(_ids(a.eval), _ids(a.train)[:8])


def test_synthetic_topics_enter_the_fingerprint_only_when_set(tmp_path):
    kw = {"data_source": "synthetic", "synthetic_num_tokens": 64 * 200, "validation_blocks": 8}
    plain = prepare_data(_args(tmp_path, **kw), n_positions=128)
    # the default source's fingerprint from before the topic knob existed (commit 497d4ab): caches stay valid
    assert plain.info["fingerprint"] == "c50593730996b6bab89c"
    weight_only = prepare_data(_args(tmp_path, **kw, synthetic_topic_weight=0.9), n_positions=128)
    assert weight_only.info["cache_hit"] and weight_only.info["fingerprint"] == plain.info["fingerprint"]
    topical = prepare_data(_args(tmp_path, **kw, synthetic_topics=4), n_positions=128)
    assert topical.info["fingerprint"] != plain.info["fingerprint"] and "topics=4" in topical.info["source"]
    assert not np.array_equal(_ids(topical.train), _ids(plain.train))


# ------------------------------------------------------------------------------------------------------ bad input
def test_block_size_larger_than_n_positions(tmp_path):
    with pytest.raises(OptBenchError, match="n_positions"):
        prepare_data(_args(tmp_path, block_size=256), n_positions=128)


def test_empty_file(tmp_path):
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(OptBenchError, match="empty"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "e.txt")]), n_positions=128)
    (tmp_path / "w.txt").write_text("\n\n  \n")
    with pytest.raises(OptBenchError, match="empty"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "w.txt")]), n_positions=128)


def test_binary_files(tmp_path):
    (tmp_path / "b.txt").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(OptBenchError, match="binary"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "b.txt")]), n_positions=128)
    (tmp_path / "l.txt").write_bytes(b"caf\xe9 au lait " * 50)  # latin-1, not UTF-8
    with pytest.raises(OptBenchError, match="UTF-8"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "l.txt")]), n_positions=128)
    (tmp_path / "x.json.gz").write_bytes(b"this is not gzip")
    with pytest.raises(OptBenchError, match="cannot be read"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "x.json.gz")]), n_positions=128)
    (tmp_path / "p.parquet").write_bytes(b"nope" * 10)
    with pytest.raises(OptBenchError, match="Parquet"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "p.parquet")]), n_positions=128)


def test_missing_text_column(tmp_path, docs):
    path = write_jsonl(tmp_path / "d.jsonl", docs[:3], column="content")
    with pytest.raises(OptBenchError, match="text_column 'text' not found.*content"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(path)]), n_positions=128)
    with gzip.open(tmp_path / "n.jsonl.gz", "wt") as fh:
        fh.write('{"text": [1, 2]}\n')
    with pytest.raises(OptBenchError, match="not text"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "n.jsonl.gz")]), n_positions=128)


def test_missing_and_mixed_files(tmp_path, docs):
    with pytest.raises(OptBenchError, match="not found"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "nope.jsonl")]), n_positions=128)
    with pytest.raises(OptBenchError, match="matches no file"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path / "*.jsonl")]), n_positions=128)
    write_jsonl(tmp_path / "a.jsonl", docs[:2])
    (tmp_path / "b.txt").write_text("hello\n")
    with pytest.raises(OptBenchError, match="mix formats"):
        prepare_data(_args(tmp_path, data_source="local", data_files=[str(tmp_path)]), n_positions=128)


def test_validation_split_larger_than_the_data(tmp_path):
    with pytest.raises(OptBenchError, match="validation split larger than the data"):
        prepare_data(_args(tmp_path, validation_blocks=500), n_positions=128)
    with pytest.raises(OptBenchError, match="validation split larger than the data"):
        prepare_data(_args(tmp_path, data_source="synthetic", synthetic_num_tokens=640, validation_blocks=20),
                     n_positions=128)
    with pytest.raises(OptBenchError, match="max_train_tokens"):
        prepare_data(_args(tmp_path, max_train_tokens=10**7), n_positions=128)


def test_tokenizer_vocabulary_mismatch(tmp_path, monkeypatch):
    bundle = prepare_data(_args(tmp_path), n_positions=128)
    check_model_vocab(bundle, bundle.vocab_size + 13)  # a padded embedding is fine
    with pytest.raises(OptBenchError, match="tokenizer/vocabulary mismatch"):
        check_model_vocab(bundle, 1000)

    # ids beyond the tokenizer's vocabulary (e.g. data tokenized by another tokenizer) are caught before training
    real = data_mod._tokenize_batch

    def wrong_vocab(batch, tokenizer, eos_id):
        out = real(batch, tokenizer, eos_id)
        return {"input_ids": [[i + 5000 for i in ids] for ids in out["input_ids"]]}

    monkeypatch.setattr(data_mod, "_tokenize_batch", wrong_vocab)
    with pytest.raises(OptBenchError, match="tokenizer/vocabulary mismatch"):
        prepare_data(_args(tmp_path / "w"), n_positions=128)


def test_tokenizer_without_eos(tmp_path, monkeypatch):
    tok = load_tokenizer(BUILTIN_TOKENIZER)
    tok.eos_token = None
    monkeypatch.setattr("hf_optbench.data.tokenizers.load_tokenizer", lambda name: tok)
    with pytest.raises(OptBenchError, match="no eos_token"):
        prepare_data(_args(tmp_path), n_positions=128)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"data_source": "local"}, "data_files is empty"),
        ({"data_files": ["x.txt"]}, "data_source: local"),
        ({"block_size": 1}, "block_size"),
        ({"validation_fraction": 0.0}, "validation_fraction"),
        ({"validation_blocks": 0}, "validation_blocks"),
        ({"max_train_tokens": 10}, "max_train_tokens"),
        ({"synthetic_alpha_x": 0.0}, "synthetic_alpha_x"),
        ({"synthetic_topics": -1}, "synthetic_topics"),
        ({"synthetic_topic_weight": 1.5}, "synthetic_topic_weight"),
        ({"data_source": "nope"}, "data_source"),
    ],
)
def test_data_arguments_validation(kw, match):
    with pytest.raises(OptBenchError, match=match):
        DataArguments(**kw)


def test_data_config_imports_only_the_standard_library():
    import subprocess
    import sys

    code = (
        "import sys, hf_optbench.config.data_args as m; "
        "bad = [x for x in ('torch', 'transformers', 'datasets', 'numpy') if x in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_utf8_check_tolerates_a_character_cut_at_the_sample_edge(tmp_path):
    # 3-byte Thai characters straddle the 64 KiB sample boundary of the binary/UTF-8 check
    text = ("ก" * 70_000) + "\n"
    for offset in range(3):
        path = tmp_path / f"t{offset}.txt"
        path.write_text("a" * offset + text, encoding="utf-8")
        assert len(list(iter_documents(_args(tmp_path, data_source="local", data_files=[str(path)])))) == 1


def test_no_progress_bars_off_a_terminal(tmp_path, capfd):
    """A build writes no datasets progress bar to a non-terminal stderr (a CLI error must stay one line)."""
    import datasets

    datasets.enable_progress_bars()
    try:
        bundle = prepare_data(_args(tmp_path, validation_fraction=0.2), n_positions=128)
        assert bundle.info["cache_hit"] is False
        err = capfd.readouterr().err
        assert "Generating" not in err and "tokenize" not in err and "Saving the dataset" not in err
        assert not datasets.are_progress_bars_disabled()  # restored for the caller
    finally:
        datasets.enable_progress_bars()


def test_each_split_says_what_prepare_data_read_and_keeps_it_through_a_trainer_s_copies(tmp_path):
    """The Python API's record names the data a Trainer was given when prepare_data made it: the description
    travels with the split through remove_columns / select / with_format (the Trainer's own copies)."""
    import torch

    from hf_optbench.measure.recorder import _loader_sizes

    bundle = prepare_data(_args(tmp_path), n_positions=128)
    for split in (bundle.train, bundle.eval):
        assert data_mod.described_source(split) == {"data_source": "thai_sample", "source": bundle.info["source"]}
    copied = bundle.train.remove_columns(["labels"]).select(range(4)).with_format("torch")
    assert data_mod.described_source(copied)["data_source"] == "thai_sample"
    loader = torch.utils.data.DataLoader(copied, batch_size=2)
    data = _loader_sizes(loader, None)
    assert data["data_source"] == "thai_sample" and data["source"].startswith(bundle.info["source"])
    plain = torch.utils.data.DataLoader([{"input_ids": [1, 2]}], batch_size=1)  # not prepare_data's: as before
    assert _loader_sizes(plain, None)["source"] == "the Trainer's train_dataset and eval_dataset (Python API)"
