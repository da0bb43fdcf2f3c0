"""The verified data cache (issue 13.3): every damaged entry is detected and rebuilt, never trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data import cache as cache_mod
from hf_optbench.data.cache import INFO_FILE, CacheCorrupt, load_cached
from hf_optbench.data.pipeline import prepare_data
from hf_optbench.errors import OptBenchError

from fixtures.data_fixtures import BUILTIN_TOKENIZER

SYNTH = {"data_source": "synthetic", "synthetic_num_tokens": 64 * 400, "validation_blocks": 8, "block_size": 64}


def _args(tmp_path: Path, **kw) -> DataArguments:
    return DataArguments(**{"data_cache_dir": str(tmp_path / "cache"), **SYNTH, **kw})


def _ids(ds) -> np.ndarray:
    return np.asarray(ds["input_ids"], dtype=np.int64)


def _arrow(entry: str, split: str) -> Path:
    (path,) = Path(entry, split).glob("*.arrow")
    return path


def _zero_8k(entry: str) -> None:
    path = _arrow(entry, "train")
    size = path.stat().st_size
    assert size > 3 * 8192
    with open(path, "r+b") as fh:  # 8 KB of token ids in the middle of the file: still a valid Arrow file
        fh.seek(size // 2)
        fh.write(b"\0" * 8192)


def _truncate(entry: str) -> None:
    path = _arrow(entry, "train")
    os.truncate(path, path.stat().st_size // 2)


def _corrupt_info(entry: str) -> None:
    Path(entry, INFO_FILE).write_text('{"vocab_size": 32, "checks', encoding="utf-8")


def _missing_file(entry: str) -> None:
    _arrow(entry, "eval").unlink()


def _missing_info(entry: str) -> None:
    Path(entry, INFO_FILE).unlink()


DAMAGE = {
    "zeroed_bytes": (_zero_8k, "checksum"),
    "truncated": (_truncate, "truncated"),
    "corrupt_info_json": (_corrupt_info, "unreadable"),
    "missing_file": (_missing_file, "missing"),
    "missing_info": (_missing_info, "missing"),
}


def test_an_intact_entry_is_a_verified_hit(tmp_path):
    first = prepare_data(_args(tmp_path), n_positions=128)
    entry = first.info["cache_path"]
    info = json.loads(Path(entry, INFO_FILE).read_text())
    assert set(info["checksums"]) >= {"train/data-00000-of-00001.arrow", "eval/data-00000-of-00001.arrow"}
    assert all(len(v["sha256"]) == 64 and v["bytes"] > 0 for v in info["checksums"].values())
    second = prepare_data(_args(tmp_path), n_positions=128)
    assert second.info["cache_hit"] is True and "checksums" not in second.info
    assert np.array_equal(_ids(second.train), _ids(first.train))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_detected_and_rebuilt_never_trained_on(tmp_path, damage):
    pristine = prepare_data(_args(tmp_path), n_positions=128)
    want_train, want_eval = _ids(pristine.train), _ids(pristine.eval)
    entry = pristine.info["cache_path"]
    del pristine  # release the memory maps before the files are damaged
    harm, reason = DAMAGE[damage]
    harm(entry)
    with pytest.raises(CacheCorrupt, match=reason):
        load_cached(entry)
    with pytest.warns(UserWarning, match=f"data cache entry .* is damaged: .*{reason}.*Rebuilding"):
        bundle = prepare_data(_args(tmp_path), n_positions=128)
    assert bundle.info["cache_hit"] is False and reason in bundle.info["cache_rebuilt_because"]
    assert np.array_equal(_ids(bundle.train), want_train) and np.array_equal(_ids(bundle.eval), want_eval)
    again = prepare_data(_args(tmp_path), n_positions=128)  # the rebuilt entry is whole again
    assert again.info["cache_hit"] is True and np.array_equal(_ids(again.train), want_train)


def test_zeroed_bytes_in_a_text_entry_are_caught(tmp_path):
    args = DataArguments(tokenizer_name=BUILTIN_TOKENIZER, data_cache_dir=str(tmp_path / "cache"), block_size=32)
    pristine = prepare_data(args, n_positions=128)
    want = _ids(pristine.train)
    entry = pristine.info["cache_path"]
    del pristine
    path = _arrow(entry, "train")
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        fh.write(b"\0" * 1024)
    with pytest.warns(UserWarning, match="checksum"):
        bundle = prepare_data(args, n_positions=128)
    assert bundle.info["cache_hit"] is False and np.array_equal(_ids(bundle.train), want)


def test_failed_rebuild_of_a_damaged_entry_says_it_was_damaged(tmp_path, monkeypatch):
    entry = prepare_data(_args(tmp_path), n_positions=128).info["cache_path"]
    _truncate(entry)

    def offline(*a, **k):
        raise OptBenchError("the source cannot be read offline. Fix: go online.")

    monkeypatch.setattr("hf_optbench.data.synthetic.build_synthetic_entry", offline)
    with pytest.warns(UserWarning), pytest.raises(OptBenchError, match="is damaged .*truncated.* rebuilding it failed: .*Fix"):
        prepare_data(_args(tmp_path), n_positions=128)


def test_overwrite_skips_the_check_and_rebuilds(tmp_path, monkeypatch):
    entry = prepare_data(_args(tmp_path), n_positions=128).info["cache_path"]
    _corrupt_info(entry)
    monkeypatch.setattr(cache_mod, "load_cached", lambda *a, **k: pytest.fail("looked up despite overwrite"))
    bundle = prepare_data(_args(tmp_path, overwrite_data_cache=True), n_positions=128)
    assert bundle.info["cache_hit"] is False and "cache_rebuilt_because" not in bundle.info


def test_an_entry_without_checksums_is_not_trusted(tmp_path):
    entry = prepare_data(_args(tmp_path), n_positions=128).info["cache_path"]
    info = json.loads(Path(entry, INFO_FILE).read_text())
    del info["checksums"]
    Path(entry, INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(CacheCorrupt, match="no checksums"):
        load_cached(entry)


def _leftovers(root: Path) -> list[str]:
    assert root.is_dir()
    return sorted(p.name for p in root.rglob("*") if p.name.startswith((".tmp-", ".damaged-", ".work-")))


def test_a_second_build_keeps_the_published_entry_instead_of_deleting_it(tmp_path, monkeypatch):
    """Two processes building one entry at once (a parallel sweep): the later store keeps the earlier, verified
    copy, so a process already reading it is never pulled from under."""
    first = prepare_data(_args(tmp_path), n_positions=128)
    entry = first.info["cache_path"]
    inode = Path(entry, "train").stat().st_ino
    import hf_optbench.data.pipeline as pipeline

    monkeypatch.setattr(pipeline, "lookup", lambda path, overwrite: (None, None))  # as if it had not been there yet
    second = prepare_data(_args(tmp_path), n_positions=128)
    assert second.info["cache_path"] == entry and Path(entry, "train").stat().st_ino == inode
    assert np.array_equal(_ids(second.train), _ids(first.train))
    assert _leftovers(Path(entry).parent) == []


def test_an_empty_file_in_place_of_an_entry_is_rebuilt(tmp_path):
    entry = prepare_data(_args(tmp_path), n_positions=128).info["cache_path"]
    import shutil

    shutil.rmtree(entry)
    Path(entry).write_bytes(b"")
    bundle = prepare_data(_args(tmp_path), n_positions=128)
    assert Path(entry).is_dir() and len(bundle.train) > 0
    assert _leftovers(Path(entry).parent) == []


def test_a_failed_store_leaves_no_temporary_directory(tmp_path, monkeypatch):
    root = tmp_path / "c"
    root.mkdir()

    class Boom:
        def save_to_disk(self, path: str) -> None:
            Path(path, "partial.arrow").write_bytes(b"x" * 10)
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        cache_mod.store(Boom(), {}, str(root), "abc")
    assert list(root.iterdir()) == []


@pytest.mark.slow
def test_concurrent_builds_of_one_entry_all_succeed(tmp_path):
    """Six processes build the same entry at the same moment: every one gets the data, none crashes."""
    import subprocess
    import sys

    code = ("import sys; from hf_optbench.config.data_args import DataArguments; "
            "from hf_optbench.data.pipeline import prepare_data; "
            f"a = DataArguments(data_cache_dir={str(tmp_path / 'cache')!r}, **{SYNTH!r}); "
            "b = prepare_data(a, n_positions=128); print(len(b.train))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [e[-800:] for _, e in outs]
    assert len({o.strip() for o, _ in outs}) == 1
    assert _leftovers(tmp_path / "cache") == []


def test_a_cache_root_that_is_a_file_is_refused_naming_where_it_came_from(tmp_path: Path) -> None:
    """Issue 32: ``--data_cache_dir`` naming an existing file was a FileExistsError traceback after the imports."""
    from hf_optbench.data.cache import make_cache_root
    from hf_optbench.errors import OptBenchError

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OptBenchError, match="data_cache_dir .* is a file"):
        make_cache_root(str(afile), from_env=False)
    with pytest.raises(OptBenchError, match="cannot be created.*set HF_OPTBENCH_CACHE to a directory"):
        make_cache_root(str(afile / "data"), from_env=True)
    make_cache_root(str(tmp_path / "new" / "data"), from_env=True)
    assert (tmp_path / "new" / "data").is_dir() and afile.read_text() == "x"


def test_a_read_only_cache_holding_the_entry_is_read_and_one_without_it_refused(tmp_path: Path) -> None:
    """A shared cache mounted read-only was refused as "not writable" even when it held the entry a run needs:
    reading it writes nothing. Needs root and mount(8) (a read-only tmpfs refuses even root)."""
    import shutil
    import subprocess

    if not (hasattr(os, "geteuid") and os.geteuid() == 0) or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a read-only tmpfs")
    cache = tmp_path / "cache"
    cache.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(cache)]).returncode != 0:
        pytest.skip("mount failed")
    try:
        built = prepare_data(_args(tmp_path), n_positions=64)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        again = prepare_data(_args(tmp_path), n_positions=64)  # the entry is there: read, nothing written
        assert (_ids(again.train) == _ids(built.train)).all()
        with pytest.raises(OptBenchError, match="not writable"):  # another entry must be built: refused
            prepare_data(_args(tmp_path, synthetic_num_tokens=64 * 300), n_positions=64)
    finally:  # lazily: the datasets above still map the entry's files
        subprocess.run(["umount", "-l", str(cache)])


def test_a_stopped_builds_temporary_folders_are_removed_at_the_next_build(tmp_path: Path, capsys) -> None:
    """A SIGTERM'd or killed build left its .tmp-*/.work-* folders for good; the next build removes those of
    processes that are gone on this host, and keeps a live one's and an unknown one's."""
    import socket
    import subprocess
    import sys

    cache = tmp_path / "cache"
    host = socket.gethostname().replace("-", "_")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, live = int(gone.stdout), os.getpid()
    names = {f".tmp-abc123-{host}@{dead}-x1y2z3": True, f".work-{host}@{dead}-q9w8e7": True,
             f".work-{host}@{live}-a1b2c3": False, f".work-otherhost@{dead}-d4e5f6": False, ".tmp-old-abcdef": False}
    for name in names:
        (cache / name).mkdir(parents=True)
        (cache / name / "part.arrow").write_bytes(b"x" * 1000)
    prepare_data(_args(tmp_path), n_positions=64)
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == \
        sorted(n for n, stale in names.items() if not stale)
    assert "removed 2 temporary folders of stopped cache builds" in capsys.readouterr().err
