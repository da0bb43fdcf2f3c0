"""The pickle check of publish/content.py on archives: every member of every archive inspected however many there
are (issue 43: members past the 256th were not), a tar (torch.load's legacy format) as well as a zip, and what the
check cannot see whole (too many members, containers nested too deep, a member it cannot read) refused by name."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
import zipfile
from pathlib import Path

import pytest

from hf_optbench.publish.content import (
    MAX_ARCHIVE_MEMBERS,
    MAX_NESTING,
    Uninspectable,
    pickle_in,
    upload_file_problems,
)

BLOB = pickle.dumps({"lr": 3e-4})


def _zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            z.writestr(name, data)
    return path


def test_every_member_of_a_zip_is_inspected(tmp_path: Path) -> None:
    """The issue's case: a tokenizer.model that is a zip of 300 members, a pickle (not named .pkl) as member 300."""
    members = [(f"piece{i}.txt", b"plain text %d" % i) for i in range(299)] + [("piece299.txt", BLOB)]
    path = _zip(tmp_path / "tokenizer.model", members)
    assert pickle_in(path) == "zip member piece299.txt"
    problems = upload_file_problems(path, Path("tokenizer.model"), None)
    assert problems == ["tokenizer.model: holds a pickle in zip member piece299.txt (torch.save/pickle content under "
                        "another name); not uploaded"]


def test_a_zip_at_the_member_bound_is_inspected_and_one_past_it_refused(tmp_path: Path) -> None:
    at_bound = [(f"m{i}", b"x") for i in range(MAX_ARCHIVE_MEMBERS - 1)] + [("last", BLOB)]
    assert pickle_in(_zip(tmp_path / "a.model", at_bound)) == "zip member last"
    clean = _zip(tmp_path / "b.model", [(f"m{i}", b"x") for i in range(MAX_ARCHIVE_MEMBERS)])
    assert pickle_in(clean) is None
    past = _zip(tmp_path / "c.model", [(f"m{i}", b"x") for i in range(MAX_ARCHIVE_MEMBERS + 1)])
    with pytest.raises(Uninspectable, match=f"zip archive of {MAX_ARCHIVE_MEMBERS + 1:,} members"):
        pickle_in(past)
    assert upload_file_problems(past, Path("c.model"), None)[0].startswith(
        f"c.model: a zip archive of {MAX_ARCHIVE_MEMBERS + 1:,} members, more than the {MAX_ARCHIVE_MEMBERS:,}")


def _tar(path: Path | io.BytesIO, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(fileobj=path, mode="w") if isinstance(path, io.BytesIO) else tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_tar_is_inspected_member_by_member_and_past_its_bound_refused(tmp_path: Path) -> None:
    """torch.load reads a tar holding a pickle (its legacy format) whatever the file is named."""
    _tar(tmp_path / "vocab.model", [("storages", b"\x00" * 600), ("tensors", b"\x00" * 10), ("pickle", BLOB)])
    assert pickle_in(tmp_path / "vocab.model") == "tar member pickle"
    _tar(tmp_path / "many.model", [(f"m{i}", b"x") for i in range(MAX_ARCHIVE_MEMBERS + 1)])
    with pytest.raises(Uninspectable, match="tar archive of more than"):
        pickle_in(tmp_path / "many.model")
    _tar(tmp_path / "clean.model", [("a.txt", b"hello"), ("b.txt", b"world" * 300)])
    assert pickle_in(tmp_path / "clean.model") is None


def test_containers_nested_deeper_than_the_bound_are_refused_by_name(tmp_path: Path) -> None:
    data = BLOB
    for _ in range(MAX_NESTING):
        data = gzip.compress(data)
    (tmp_path / "ok.model").write_bytes(data)  # MAX_NESTING containers: looked through to the pickle
    assert pickle_in(tmp_path / "ok.model").startswith("gzip-compressed content")
    (tmp_path / "deep.model").write_bytes(gzip.compress(data))
    with pytest.raises(Uninspectable, match=f"nested more than {MAX_NESTING} deep"):
        pickle_in(tmp_path / "deep.model")
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("x", gzip.compress(gzip.compress(b"just text")))
    _zip(tmp_path / "mixed.model", [("inner.zip", inner.getvalue())])
    with pytest.raises(Uninspectable, match="nested more than"):
        pickle_in(tmp_path / "mixed.model")


def test_a_member_the_check_cannot_read_is_refused(tmp_path: Path) -> None:
    """A member whose bytes fail their CRC (as a damaged or doctored archive's do): what it holds is unknown, so the
    file does not go, and the members after it are not skipped silently."""
    path = tmp_path / "tokenizer.model"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("notes.txt", b"A" * 100)
        z.writestr("after", BLOB)
    path.write_bytes(path.read_bytes().replace(b"A" * 100, b"A" * 99 + b"B", 1))
    with pytest.raises(Uninspectable, match="zip member notes.txt cannot be read"):
        pickle_in(path)


def test_a_large_archive_inside_an_archive_is_refused_not_passed(tmp_path: Path) -> None:
    import os

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as z:
        z.writestr("noise", os.urandom(2 << 20))
        z.writestr("data.pkl", BLOB)
    _zip(tmp_path / "outer.model", [("inner", inner.getvalue())])
    with pytest.raises(Uninspectable, match="zip archive inside another, larger than"):
        pickle_in(tmp_path / "outer.model")


TOKEN = b"HF_TOKEN=hf_" + b"Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"  # the shape of a Hub token, made up


@pytest.mark.parametrize("pack", ["gzip", "bz2", "xz", "zip", "gzip-in-zip"])
def test_a_secret_in_compressed_content_or_a_zip_member_is_found(tmp_path: Path, pack: str) -> None:
    """The byte scan sees compressed bytes only: a gzip'd token saved as tokenizer.model was staged."""
    import bz2
    import lzma

    path = tmp_path / "tokenizer.model"
    if pack in ("zip", "gzip-in-zip"):
        _zip(path, [("notes", b"x"), ("env", gzip.compress(TOKEN) if pack == "gzip-in-zip" else TOKEN)])
    else:
        path.write_bytes({"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[pack](TOKEN))
    problems = upload_file_problems(path, Path("tokenizer.model"), None)
    assert any("contains a Hugging Face token (in " in p for p in problems), problems
    assert not any("Ab3dEf" in p for p in problems)


def test_a_base64_wrapped_secret_is_a_known_limit(tmp_path: Path) -> None:
    """Encodings are not decoded (docs/RELIABILITY.md, Not yet): base64 of a token inside gzip passes."""
    import base64

    path = tmp_path / "tokenizer.model"
    path.write_bytes(gzip.compress(base64.b64encode(TOKEN)))
    assert not [p for p in upload_file_problems(path, Path("tokenizer.model"), None) if "token" in p]
