"""data.sources: a document too long to encode and a damaged Parquet file are one exit-2 line naming the file, before
the tokenizer sees them (issue 41: a 200 MB line aborted the run, rc 134; a truncated Parquet file with its leading
magic bytes was a traceback)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data import sources
from hf_optbench.data.sources import check_local_files, iter_texts, open_source, resolve_local_files
from hf_optbench.errors import OptBenchError

LIMIT = 1000  # the test's MAX_DOCUMENT_CHARS: the rule, not the figure, is what is tested here


@pytest.fixture
def small_limit(monkeypatch) -> int:
    monkeypatch.setattr(sources, "MAX_DOCUMENT_CHARS", LIMIT)
    return LIMIT


def _texts(path: Path, **kw) -> list[str]:
    return list(iter_texts(open_source(DataArguments(data_source="local", data_files=[str(path)], **kw))))


@pytest.mark.parametrize("name, write, where", [
    ("lines.txt", lambda p: p.write_text("short\n" * 3 + "ก" * (LIMIT + 1) + "\nshort\n", encoding="utf-8"),
     "line 4"),
    ("records.jsonl", lambda p: p.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "a" * (LIMIT + 5)})
                                              + "\n", encoding="utf-8"), "line 2"),
    ("lines.txt.gz", lambda p: p.write_bytes(gzip.compress(("x\n" + "b" * (LIMIT + 1)).encode())), "line 2"),
])
def test_a_document_past_the_limit_is_refused_naming_its_file_and_line(small_limit: int, tmp_path: Path, name: str,
                                                                      write, where: str) -> None:
    path = tmp_path / name
    write(path)
    with pytest.raises(OptBenchError) as err:
        _texts(path)
    text = str(err.value)
    assert f"data file '{path}' {where}" in text and f"longer than the {LIMIT:,} a document may have" in text
    assert "\n" not in text


def test_a_document_at_the_limit_is_read(small_limit: int, tmp_path: Path) -> None:
    path = tmp_path / "ok.txt"
    path.write_text("ก" * LIMIT + "\n", encoding="utf-8")  # 1,000 characters, 3,000 bytes: characters count
    assert _texts(path) == ["ก" * LIMIT]


def test_a_whole_file_document_is_named_by_its_source(small_limit: int, tmp_path: Path) -> None:
    """Read as one document per file, no single line is too long: the message names the source and document."""
    path = tmp_path / "book.txt"
    path.write_text("a line of a book\n" * 100, encoding="utf-8")
    with pytest.raises(OptBenchError, match=r"local: 1 text file\(s\) \(document 1, .*book.txt\) holds a document"):
        _texts(path, txt_sample_by="document")


def _parquet(path: Path) -> bytes:
    pq.write_table(pa.table({"text": [f"สวัสดีครับ ทดสอบ {i} " * 20 for i in range(500)]}), path)
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "footer-points-past-the-end"])
def test_a_damaged_parquet_file_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "data.parquet"
    data = _parquet(path)
    if damage == "truncated":  # its leading magic bytes survive
        path.write_bytes(data[: len(data) // 2])
    else:  # the footer kept, the data before it cut away: the footer lists bytes the file no longer holds
        footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
        path.write_bytes(data[:4] + data[footer:])
    with pytest.raises(OptBenchError) as err:
        check_local_files(resolve_local_files([str(path)]))
    assert f"data file '{path}' is a damaged Parquet file" in str(err.value)
    _parquet(path)
    check_local_files(resolve_local_files([str(path)]))  # whole again: accepted
