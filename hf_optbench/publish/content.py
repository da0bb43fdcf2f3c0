"""What a staged file's bytes must not be: a pickle under any name (also inside a zip or tar archive, a gzip, bz2
or xz stream, or an object-dtype numpy array), binary content under a text file's name, or content the check cannot
see all of; and every problem of one staged file (:func:`upload_file_problems`, with the secrets of
:mod:`hf_optbench.publish.redact`).

Why archives are opened at all: ``torch.load`` reads a zip (``torch.save``'s format holds ``data.pkl``) or a tar
(its legacy format), ``np.load`` a zip of ``.npy`` arrays, ``joblib`` compressed pickles, each under any name. So
every member of every archive is inspected. An archive of more than :data:`MAX_ARCHIVE_MEMBERS` members, containers
nested more than :data:`MAX_NESTING` deep, a member that cannot be read (encrypted, an unknown compression) and an
archive inside an archive larger than :data:`PICKLE_SCAN_BYTES` are refused by name (:class:`Uninspectable`) rather
than passed: a check that stops early would pass what it did not see.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hf_optbench.publish.redact import secret_kinds, secret_problems

# Suffixes of files that torch/pickle would deserialise by executing code: never part of an upload.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# How much of a file (or of a compressed or archived member) the pickle check parses: a pickle's opcodes, not its
# payload, are what it recognises.
PICKLE_SCAN_BYTES = 1 << 20
# Members of one archive inspected, every one of them; an archive with more is refused by name. No file an upload
# carries is an archive (safetensors weights, JSON, text, a SentencePiece model), so the bound only caps the time a
# hostile file costs: 4,096 members of 1 MiB each decompress in well under a minute.
MAX_ARCHIVE_MEMBERS = 4096
# Containers inside containers looked into (a gzip in a zip in a gzip); deeper is refused by name.
MAX_NESTING = 3
# pickletools' messages when the scanned bytes end inside a valid opcode (a larger pickle than the scan).
_TRUNCATED = ("but only", "exhausted before seeing STOP", "no newline found")


# How much decompressed content of one compressed stream or archive member the secret check reads, whole; more is
# refused by name (no file an upload carries is compressed: the bound caps what a decompression bomb costs).
SECRET_SCAN_BYTES = 64 << 20


class Uninspectable(Exception):
    """Content the pickle check cannot see all of (the message says what and where): refused, never passed."""


def pickle_in(path: Path) -> str | None:
    """Where the file's content holds a pickle ("" for the file itself, else e.g. "gzip-compressed content", "zip
    member data.pkl"); None when it holds none; :class:`Uninspectable` when it cannot be seen whole.

    Protocols 0-5: the first bytes parse as a pickle opcode stream (``pickletools.genops``) up to STOP, or up to the
    end of the scanned bytes of a larger file (protocol 0-1 are ASCII opcodes, 2-5 open with PROTO ``0x80`` n).
    Looked into as well: every member of a zip or tar archive, an object-dtype ``.npy`` (numpy pickles its
    elements), gzip, bz2 and xz content, under any name. Not for ``.safetensors`` files (checked by parsing them
    instead). Text, JSON, Markdown and safetensors fail at their first byte: '{', '#', '-' and a header length's
    zero bytes are no opcodes."""
    with path.open("rb") as f:
        head = f.read(PICKLE_SCAN_BYTES)
        longer = bool(f.read(1))
    if head[:4] == b"PK\x03\x04":
        return _pickle_in_zip(path, 0)
    if _is_tar(head):
        return _pickle_in_tar(path, 0)
    return _pickle_in_bytes(head, longer, 0)


def _is_tar(head: bytes) -> bool:
    """Whether ``head`` opens with a tar header (``tarfile`` accepts its checksum; v7 tars have no magic)."""
    import tarfile

    if len(head) < 512:
        return False
    try:
        tarfile.TarInfo.frombuf(head[:512], "utf-8", "surrogateescape")
        return True
    except tarfile.HeaderError:
        return False


def _member_where(kind: str, name: str, where: str) -> str:
    return f"{kind} member {name}" + (f" (in {where})" if where else "")


def _check_members(kind: str, members: Iterator[tuple[str, Any]], depth: int) -> str | None:
    """Every (name, reader) of an archive: by name (a pickle suffix), then by content (the first bytes). A member
    that cannot be read is refused: what it holds is unknown, and a loader might read it."""
    count = 0
    for name, read in members:
        count += 1
        if count > MAX_ARCHIVE_MEMBERS:
            raise Uninspectable(f"a {kind} archive of more than {MAX_ARCHIVE_MEMBERS:,} members, more than the check "
                                "inspects")
        if name.endswith(PICKLE_SUFFIXES):
            return f"{kind} member {name}"
        try:
            head = read()
        except Exception as exc:  # noqa: BLE001 - encrypted, unknown compression, bad CRC, truncated: each refused
            raise Uninspectable(f"{kind} member {name} cannot be read ({type(exc).__name__}), so it cannot be "
                                "checked") from None
        if head is None:
            continue  # a directory or link: no content of its own
        where = _pickle_in_bytes(head[:PICKLE_SCAN_BYTES], len(head) > PICKLE_SCAN_BYTES, depth + 1,
                                 f"{kind} member {name}")
        if where is not None:
            return _member_where(kind, name, where)
    return None


def _pickle_in_zip(source: Any, depth: int) -> str | None:
    import zipfile

    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError):
        return None  # no central directory: torch and numpy cannot open it either; the other checks still apply

    def reader(info: zipfile.ZipInfo) -> Any:
        def read() -> bytes | None:
            if info.is_dir():
                return None
            with archive.open(info) as member:
                return member.read(PICKLE_SCAN_BYTES + 1)
        return read

    with archive:
        if len(archive.infolist()) > MAX_ARCHIVE_MEMBERS:
            raise Uninspectable(f"a zip archive of {len(archive.infolist()):,} members, more than the "
                                f"{MAX_ARCHIVE_MEMBERS:,} the check inspects")
        return _check_members("zip", ((info.filename, reader(info)) for info in archive.infolist()), depth)


def _pickle_in_tar(source: Any, depth: int) -> str | None:
    import tarfile

    try:
        archive = tarfile.open(name=source, mode="r:") if isinstance(source, Path) else \
            tarfile.open(fileobj=source, mode="r:")
    except (tarfile.TarError, OSError):
        return None

    def members() -> Iterator[tuple[str, Any]]:
        for info in archive:  # lazily: a tar lists its members only as it is read
            yield info.name, (lambda info=info: _read_tar_member(archive, info))

    with archive:
        try:
            return _check_members("tar", members(), depth)
        except tarfile.TarError as exc:
            raise Uninspectable(f"a tar archive that cannot be read to its end ({exc})") from None


def _read_tar_member(archive: Any, info: Any) -> bytes | None:
    if not info.isfile():
        return None
    member = archive.extractfile(info)
    return member.read(PICKLE_SCAN_BYTES + 1) if member is not None else None


def _decompressor(head: bytes) -> tuple[str, Any] | None:
    import bz2
    import lzma
    import zlib

    if head[:2] == b"\x1f\x8b":
        return "gzip-compressed content", zlib.decompressobj(16 + zlib.MAX_WBITS)
    if head[:3] == b"BZh":
        return "bz2-compressed content", bz2.BZ2Decompressor()
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz-compressed content", lzma.LZMADecompressor()
    return None


def _pickle_in_bytes(head: bytes, longer: bool, depth: int, at: str = "") -> str | None:
    """:func:`pickle_in` on the first bytes of a file or member (``longer``: more follow; ``at``: where they are,
    for a refusal's message)."""
    container = head[:4] == b"PK\x03\x04" or _is_tar(head) or _decompressor(head) is not None
    if container and depth >= MAX_NESTING:
        raise Uninspectable(f"archives or compressed streams nested more than {MAX_NESTING} deep"
                            + (f" ({at} is one more)" if at else ""))
    if head[:6] == b"\x93NUMPY":
        return "an object-dtype .npy array" if _npy_holds_objects(head) else None
    if head[:4] == b"PK\x03\x04" or _is_tar(head):
        kind = "zip" if head[:4] == b"PK\x03\x04" else "tar"
        if longer:
            raise Uninspectable(f"a {kind} archive inside another, larger than the {PICKLE_SCAN_BYTES >> 20} MiB "
                                f"the check reads of a member" + (f" ({at})" if at else ""))
        return (_pickle_in_zip if kind == "zip" else _pickle_in_tar)(io.BytesIO(head), depth)
    found = _decompressor(head)
    if found is not None:
        what, unpack = found
        try:
            inner = unpack.decompress(head, PICKLE_SCAN_BYTES + 1)
        except Exception:  # noqa: BLE001 - zlib.error, OSError, EOFError, LZMAError on a damaged stream
            return None  # nothing readable inside; a text name still fails the UTF-8 check
        where = _pickle_in_bytes(inner[:PICKLE_SCAN_BYTES], len(inner) > PICKLE_SCAN_BYTES or longer, depth + 1,
                                 what)
        return None if where is None else what + (f" (in {where})" if where else "")
    return "" if _is_pickle_stream(head, longer) else None


def _npy_holds_objects(head: bytes) -> bool:
    """Whether a ``.npy`` header declares an object dtype (whose elements ``np.save`` pickles)."""
    import numpy as np

    try:
        stream = io.BytesIO(head)
        version = np.lib.format.read_magic(stream)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _shape, _fortran, dtype = reader(stream, max_header_size=1 << 20)
    except (ValueError, OSError, SyntaxError):
        return True  # a .npy header numpy cannot read: it cannot be shown to be free of pickles
    return bool(dtype.hasobject)


def _is_pickle_stream(data: bytes, longer: bool) -> bool:
    import pickletools

    ops = 0
    try:
        for opcode, _arg, _pos in pickletools.genops(io.BytesIO(data)):
            ops += 1
            if opcode.name == "STOP":
                return True
    except Exception as exc:  # noqa: BLE001 - pickletools raises ValueError, and others on odd arguments
        return longer and ops >= 2 and any(t in str(exc) for t in _TRUNCATED)
    return False


# Names whose content must be UTF-8 text (JSON, YAML, Markdown, text, templates): binary content under such a name
# (a gzip, a numpy array, a pickle) is refused whatever it holds. Binary is allowed only for weights (parsed by
# safetensors) and a SentencePiece tokenizer.model (checked for pickles like any file).
TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".yaml", ".yml", ".md", ".jinja")


def _not_utf8(path: Path, chunk: int = 8 << 20) -> str | None:
    """Why ``path`` is not UTF-8 text (the byte offset of the first bad byte), or None when it is."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as f:
        while True:
            block = f.read(chunk)
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                return f"byte {offset + exc.start} is not UTF-8"
            if not block:
                return None
            offset += len(block)


def packed_secrets(path: Path, token: str | None) -> list[str]:
    """The secrets in the decompressed content of a gzip, bz2 or xz file and of every member of a zip (and what those
    hold in turn, :data:`MAX_NESTING` deep), each as "contains <kind> (in <where>)"; a stream or member larger than
    :data:`SECRET_SCAN_BYTES` unpacked is refused as uncheckable. Why: the byte scan of
    :func:`~hf_optbench.publish.redact.secret_problems` sees compressed bytes only, so a gzip'd ``HF_TOKEN=hf_...``
    saved as ``tokenizer.model`` passed. Not decoded: base64 or other encodings of a secret (a known limit)."""
    with path.open("rb") as f:
        head = f.read(6)
    if head[:4] != b"PK\x03\x04" and _decompressor(head) is None:
        return []
    if path.stat().st_size > SECRET_SCAN_BYTES:
        return [f"a compressed file or zip larger than the {SECRET_SCAN_BYTES >> 20} MiB the secret check reads; "
                "not uploaded"]
    return _secrets_inside(path.read_bytes(), token, "", 0)


def _secrets_inside(data: bytes, token: str | None, at: str, depth: int) -> list[str]:
    """:func:`packed_secrets` on the bytes of a file or member (``at``: where they are)."""
    packed = data[:4] == b"PK\x03\x04" or _decompressor(data) is not None
    if packed and depth > MAX_NESTING:
        return [f"compressed content nested more than {MAX_NESTING} deep ({at}); not uploaded"]
    parts: list[tuple[str, bytes]] = []
    if data[:4] == b"PK\x03\x04":
        import zipfile

        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist()[:MAX_ARCHIVE_MEMBERS]:
                    if not info.is_dir():
                        with archive.open(info) as member:
                            parts.append((_member_where("zip", info.filename, at), member.read(SECRET_SCAN_BYTES + 1)))
        except Exception as exc:  # noqa: BLE001 - a damaged or encrypted member: what it holds is unknown
            return [f"a zip archive{f' ({at})' if at else ''} that cannot be read ({type(exc).__name__}), so it "
                    "cannot be checked for secrets; not uploaded"]
    elif (found := _decompressor(data)) is not None:
        what, unpack = found
        try:
            inner = unpack.decompress(data, SECRET_SCAN_BYTES + 1)
        except Exception:  # noqa: BLE001 - a damaged stream: nothing readable inside
            return []
        parts.append((what + (f" (in {at})" if at else ""), inner))
    problems = []
    for where, content in parts:
        if len(content) > SECRET_SCAN_BYTES:
            problems.append(f"{where} is larger than the {SECRET_SCAN_BYTES >> 20} MiB the secret check reads; "
                            "not uploaded")
            continue
        problems += [f"contains {kind} (in {where})" for kind in secret_kinds(content, token)]
        problems += _secrets_inside(content, token, where, depth + 1)
    return problems


def upload_file_problems(path: Path, rel: Path, token: str | None) -> list[str]:
    """Why ``path`` (shown as ``rel``) must not be uploaded: pickled by name or content (nested in an archive,
    a compressed stream or a numpy array too), content the check cannot see whole, binary under a text file's name,
    unreadable safetensors, or a secret inside (:func:`hf_optbench.publish.redact.secret_problems`: the kind, never
    the value); [] when it may go."""
    from safetensors import safe_open

    problems = []
    if path.suffix in PICKLE_SUFFIXES:
        problems.append(f"{rel}: pickled file (loading it can run code); only safetensors are uploaded")
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except Exception as exc:  # safetensors raises its own error types
            problems.append(f"{rel}: not a readable safetensors file ({exc})")
    elif path.suffix not in PICKLE_SUFFIXES:
        try:
            if (where := pickle_in(path)) is not None:
                inside = f" in {where}" if where else ""
                problems.append(f"{rel}: holds a pickle{inside} (torch.save/pickle content under another name); "
                                "not uploaded")
        except Uninspectable as exc:
            problems.append(f"{rel}: {exc}; not uploaded")
    if path.suffix in TEXT_SUFFIXES and (why := _not_utf8(path)) is not None:
        problems.append(f"{rel}: not UTF-8 text ({why}), which its name promises; binary content is not uploaded "
                        "under a text file's name")
    problems += [f"{rel}: {problem}" for problem in secret_problems(path, token) + packed_secrets(path, token)]
    return problems
