"""The packed-data cache: a fingerprint of everything that decides the token ids, and the Arrow files behind it.

Why a cache: the packed DatasetDict is saved under that fingerprint (source identity, tokenizer.json hash, block
size, limits, split) and reloaded memory-mapped, so a second run starts without tokenizing and DataLoader workers
share pages instead of each holding a copy (the ``datasets`` guide "Use with PyTorch", section "Use multiple
workers", recommends save_to_disk + load_from_disk before multi-worker DataLoaders: an in-memory dataset makes
data loading, not the model, dominate step time). Local files are keyed by path, size and mtime; Hub data by
name/config/split (assumed immutable).

Why a checksum: a cache hit is memory-mapped and trained on as is, so a damaged file (bytes overwritten, a file cut
short by a full disk, a lost file) would silently train on other tokens. Each file's size and SHA-256 are recorded
when the entry is written and checked on every hit; a damaged entry raises :class:`CacheCorrupt`, which
:func:`lookup` turns into a warning and a rebuild. SHA-256 rather than BLAKE2b: hashlib's SHA-256 is OpenSSL's,
which uses the CPU's SHA extensions where present (x86 SHA-NI, ARMv8 crypto): 1.7-2x BLAKE2b's throughput on
this machine (benchmarks/bench_cache_verify.py). Verifying a 100 MB entry took 0.1-0.25 s there, 0.2-1.9% of
building it. datasets' own ``verification_mode`` checks only the Hub builders'
download checksums and split sizes, never a saved dataset, hence this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.rundir import write_json_atomic

INFO_FILE = "optbench_data.json"  # the build summary saved next to the Arrow splits
CHECKSUM_ALGORITHM = "sha256"  # see the module docstring for why not blake2b


class CacheCorrupt(Exception):
    """A cache entry that exists but fails its checks (internal: :func:`lookup` rebuilds it with a warning)."""


def make_cache_root(path: str, from_env: bool, *, build: bool = False) -> None:
    """Create the cache directory ``path``, or refuse it in one line naming where it came from (``--data_cache_dir``
    or the ``HF_OPTBENCH_CACHE`` / ``XDG_CACHE_HOME`` default) and the fix: a path naming an existing file was a
    FileExistsError traceback, and a read-only place a PermissionError, after the imports. An existing directory
    that cannot be written (a shared, read-only cache) is refused only when an entry must be built in it
    (``build``): the entry a run needs may be there already, and reading it writes nothing."""
    from hf_optbench.config.checks import check_writable_dir
    from hf_optbench.errors import OptBenchError

    if not build and os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
        return
    key = "data cache directory" if from_env else "data_cache_dir"
    try:
        check_writable_dir(path, key)
    except OptBenchError as exc:
        hint = (" It comes from HF_OPTBENCH_CACHE (else XDG_CACHE_HOME): set HF_OPTBENCH_CACHE to a directory, or "
                "pass --data_cache_dir DIR.") if from_env else ""
        raise OptBenchError(f"{exc}{hint}") from None
    os.makedirs(path, exist_ok=True)
    if build:
        remove_stale_temps(path)


def _owner() -> str:
    """``host@pid`` of this process, in the names of its temporary folders in the cache (:func:`remove_stale_temps`
    tells a stopped build's from a live one by it)."""
    return f"{socket.gethostname().replace('-', '_')}@{os.getpid()}"


_TEMP = re.compile(r"^\.(tmp|work|damaged)-(?:.*-)?([^-@]+)@(\d+)-[^-]+$")


def remove_stale_temps(cache_root: str) -> None:
    """Remove the temporary folders (``.tmp-*``, ``.work-*``, ``.damaged-*``) that builds on this host left when they
    were killed or stopped (their process is gone), and say so in one line. Why: a SIGTERM'd or SIGKILLed build
    skips its own clean-up, and its folders stayed for good (338 MB in one case). A folder of a live process, of
    another host sharing the cache, or of an older hf_optbench (no owner in its name) is left alone."""
    host = socket.gethostname().replace("-", "_")
    removed, size = [], 0
    try:
        names = os.listdir(cache_root)
    except OSError:
        return
    for name in names:
        m = _TEMP.match(name)
        if m is None or m.group(2) != host or _alive(int(m.group(3))):
            continue
        path = os.path.join(cache_root, name)
        size += sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    if removed:
        print(f"[data] removed {len(removed)} temporary folder{'s' if len(removed) > 1 else ''} of stopped cache "
              f"builds from {cache_root} ({size / 2**20:,.1f} MiB)", file=sys.stderr)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def fingerprint(payload: dict[str, Any]) -> str:
    """A stable 20-hex-digit key of ``payload`` (sorted JSON, so key order never changes it)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def file_checksums(root: str) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes": size, "sha256": hex}}`` for every file under ``root`` except the info file."""
    out: dict[str, dict[str, Any]] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel == INFO_FILE:
                continue
            with open(full, "rb") as fh:
                digest = hashlib.file_digest(fh, CHECKSUM_ALGORITHM).hexdigest()
            out[rel] = {"bytes": os.path.getsize(full), CHECKSUM_ALGORITHM: digest}
    return dict(sorted(out.items()))


def verify_entry(path: str, info: dict[str, Any]) -> None:
    """Raise :class:`CacheCorrupt` unless every file recorded in ``info["checksums"]`` is there, whole and unchanged.

    Sizes are checked for all files first (cheap; catches truncation), then the content hashes.
    """
    sums = info.get("checksums")
    if not isinstance(sums, dict) or not sums:
        raise CacheCorrupt("its info file records no checksums")
    for rel, want in sums.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise CacheCorrupt(f"{rel} is missing")
        size = os.path.getsize(full)
        if size != want.get("bytes"):
            raise CacheCorrupt(f"{rel} holds {size} bytes, {want.get('bytes')} were written (truncated or replaced)")
    for rel, want in sums.items():
        with open(os.path.join(path, rel), "rb") as fh:
            digest = hashlib.file_digest(fh, CHECKSUM_ALGORITHM).hexdigest()
        if digest != want.get(CHECKSUM_ALGORITHM):
            raise CacheCorrupt(f"{rel} does not match its {CHECKSUM_ALGORITHM} checksum (its bytes changed)")


def load_cached(path: str, *, verify: bool = True) -> tuple[Any, dict[str, Any]] | None:
    """The cached DatasetDict at ``path`` (memory-mapped) and its info; None when no entry is there.

    Raises :class:`CacheCorrupt` when an entry is there but its info file is missing or unreadable, or (with
    ``verify``) a file fails its size or checksum, or datasets cannot open it.
    """
    import datasets

    if not os.path.isdir(path):
        return None
    meta = os.path.join(path, INFO_FILE)
    if not os.path.isfile(meta):
        raise CacheCorrupt(f"its info file {INFO_FILE} is missing")
    try:
        with open(meta, encoding="utf-8") as fh:
            info = json.load(fh)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CacheCorrupt(f"its info file {INFO_FILE} is unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(info, dict):
        raise CacheCorrupt(f"its info file {INFO_FILE} holds no JSON object")
    if verify:
        verify_entry(path, info)
    try:
        return datasets.load_from_disk(path), info
    except Exception as exc:  # pyarrow/datasets raise many types on a damaged entry
        raise CacheCorrupt(f"datasets cannot open it ({type(exc).__name__}: {exc})") from exc


def lookup(path: str, overwrite: bool) -> tuple[tuple[Any, dict[str, Any]] | None, str | None]:
    """``(cached entry or None, why a damaged entry is rebuilt or None)``; a damaged entry is never returned.

    A damaged entry is rebuilt rather than refused: it holds derived data only, and a fresh build is what
    ``--overwrite_data_cache`` would do anyway. A warning says so, and the reason goes into the new entry's info.
    """
    if overwrite:
        return None, None
    try:
        return load_cached(path), None
    except CacheCorrupt as exc:
        warnings.warn(
            f"the data cache entry {path} is damaged: {exc}. Rebuilding it from the source (the damaged copy is "
            "not used; --overwrite_data_cache true forces a rebuild at any time).",
            UserWarning,
            stacklevel=2,
        )
        return None, str(exc)


def _usable(path: str) -> bool:
    """Whether ``path`` is a complete, verified entry (another process may have published it meanwhile)."""
    try:
        return os.path.isdir(path) and load_cached(path) is not None
    except CacheCorrupt:
        return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def store(ddict: Any, info: dict[str, Any], cache_root: str, fp: str, *, replace: bool = False) -> str:
    """Save ``ddict`` and its info (plus each file's checksum) as the entry ``fp``; returns the entry's directory.

    Safe when several processes build the same entry at once (a sweep running runs in parallel): each builds in a
    private temporary directory and publishes it with one rename (the Arrow files and the info appear together). A
    complete entry is never deleted: if another process published a verified copy first, this one is discarded
    and theirs kept, so a process reading that entry is never pulled from under. Only a damaged entry (or a stray
    file in its place) is moved aside, by an atomic rename, before this one takes its place. The temporary
    directory is removed whatever happens (a full disk leaves no ``.tmp-*`` behind). ``replace``
    (``--overwrite_data_cache``): the existing entry is replaced even when it is whole.
    """
    final = os.path.join(cache_root, fp)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{fp}-{_owner()}-", dir=cache_root)
    try:
        ddict.save_to_disk(tmp)
        write_json_atomic(Path(tmp) / INFO_FILE, {**info, "checksums": file_checksums(tmp)})
        aside = None
        if os.path.lexists(final):
            if not replace and _usable(final):
                return final
            aside = tempfile.mkdtemp(prefix=f".damaged-{fp}-{_owner()}-", dir=cache_root)
            try:
                os.replace(final, os.path.join(aside, "entry"))
            except FileNotFoundError:  # another process moved it first
                pass
        try:
            os.replace(tmp, final)
        except OSError:  # another process published first: keep its copy
            pass
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return final
    finally:
        _remove(tmp)


@contextmanager
def work_dir(cache_root: str) -> Iterator[str]:
    """A scratch directory inside ``cache_root`` (same filesystem as the entry), removed whatever happens."""
    work = tempfile.mkdtemp(prefix=f".work-{_owner()}-", dir=cache_root)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def progress_bars_on_tty() -> Iterator[None]:
    """datasets' progress bars stay on while building only if stderr is a terminal; restored afterwards.

    Why: in logs and captured stderr (sweeps, CI, a CLI error) the bars are noise that lands before the one-line
    error a bad input must produce; on a terminal they show that a long build is moving.
    """
    import datasets

    if sys.stderr.isatty() or datasets.are_progress_bars_disabled():
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()


def block_schema() -> Any:
    """The schema of a packed split: ``input_ids`` and ``labels`` (the same blocks), int32 lists."""
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])


def write_blocks(writer: Any, schema: Any, flat_ids: Any, block_size: int) -> None:
    """Append ``flat_ids`` (a numpy array, a whole number of blocks long) to an Arrow stream ``writer`` of
    :func:`block_schema` as rows of ``block_size`` tokens."""
    import numpy as np
    import pyarrow as pa

    values = pa.array(np.asarray(flat_ids).reshape(-1).astype(np.int32, copy=False))
    offsets = pa.array(np.arange(0, len(values) + 1, block_size, dtype=np.int32))
    col = pa.ListArray.from_arrays(offsets, values)
    writer.write_batch(pa.record_batch([col, col], schema=schema))
