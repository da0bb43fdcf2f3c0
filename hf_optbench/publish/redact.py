"""Secrets out of everything a run writes, prints or shares: ``config.yaml``, the model card, the upload folder,
error messages; and the content checks that keep pickles and tokens out of an upload.

The Hub token comes from ``HF_TOKEN`` or the login cache (``hf auth login``) through ``huggingface_hub``; it is
never accepted on the command line, and :func:`scrub_secrets` removes it (and anything shaped like one) from
what hf_optbench writes, wherever it was pasted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# An HF user-access token is "hf_" followed by ~34 letters/digits; 30+ catches it without matching identifiers.
HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{30,}")
REDACTED = "<redacted>"
# Suffixes of files that torch/pickle would deserialise by executing code: never part of an upload.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Keys whose value is a secret whatever it looks like (TrainingArguments.hub_token, W&B keys, ...).
SECRET_KEYS = frozenset({"hub_token", "hf_token", "token", "use_auth_token", "push_to_hub_token",
                         "wandb_api_key", "api_key", "password", "secret"})


def _is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and key.lower() in SECRET_KEYS


def scrub_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts/lists/tuples/strings, nested) without secrets.

    Keys in :data:`SECRET_KEYS` (``hub_token``, ...) are dropped entirely, and every substring that looks like an
    HF token (``hf_`` + 30 or more letters/digits) is replaced by ``<redacted>``, wherever it appears (a token
    pasted into ``run_name`` or a URL is caught too). Other objects are returned unchanged.
    """
    if isinstance(obj, dict):
        return {k: scrub_secrets(v) for k, v in obj.items() if not _is_secret_key(k)}
    if isinstance(obj, list):
        return [scrub_secrets(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(scrub_secrets(v) for v in obj)
    if isinstance(obj, str):
        return HF_TOKEN_RE.sub(REDACTED, obj)
    return obj


# ------------------------------------------------------------------------------------ names, text and argv

# Words that make a variable or option name secret (issue 13: TOKEN, KEY, SECRET, PASSWORD, case-insensitive).
SECRET_NAME_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "apikey", "credentials"})


def is_secret_name(name: str) -> bool:
    """Whether a variable or option name looks secret: one of its words (split on ``-``/``_``/``.``) is in
    :data:`SECRET_NAME_WORDS` (``HF_TOKEN``, ``--hub-token``, ``WANDB_API_KEY``; not ``max_train_tokens``)."""
    words = re.split(r"[-_.\s]+", name.strip("-").lower())
    return any(w in SECRET_NAME_WORDS for w in words)


def secret_option_values(argv: list[str]) -> list[str]:
    """The values given to options whose names look secret (``--token X``, ``--api-key=X``), to keep them out of
    any message that would otherwise echo the command line."""
    values = []
    for i, tok in enumerate(argv):
        if not tok.startswith("-"):
            continue
        name, eq, value = tok.partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            values.append(value)
        elif i + 1 < len(argv):
            values.append(argv[i + 1])
    return [v for v in values if v]


def argv_secret_values(argv: list[Any]) -> list[str]:
    """The secret values in a command line: of each ``NAME=value`` whose NAME looks secret (``env MY_SECRET=abc
    python ...``, ``--api-key=X``) and of each option with a secret name followed by its value (``--token X``)."""
    tokens = [str(t) for t in argv]
    values = [t.partition("=")[2] for t in tokens if "=" in t and is_secret_name(t.partition("=")[0])]
    return [v for v in values + secret_option_values(tokens) if v]


def redact_argv(argv: list[Any]) -> list[str]:
    """``argv`` as hf_optbench may write or log it (a sweep's state rows, manifest, copy of its file, each run's
    stdout.log, the dry run): every value :func:`argv_secret_values` finds, and every HF-token-shaped string,
    replaced by ``<redacted>``; the names stay, to say that they were set. The one rule for every writer."""
    tokens = [str(t) for t in argv]
    out = []
    for i, tok in enumerate(tokens):
        name, eq, value = tok.partition("=")
        if eq and value and is_secret_name(name):
            tok = f"{name}={REDACTED}"
        elif i > 0 and tokens[i - 1].startswith("-") and "=" not in tokens[i - 1] and is_secret_name(tokens[i - 1]):
            tok = REDACTED
        out.append(HF_TOKEN_RE.sub(REDACTED, tok))
    return out


def redact_text(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with each of ``secrets`` (literal values) and every HF-token-shaped substring replaced by
    ``<redacted>``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return HF_TOKEN_RE.sub(REDACTED, text)


# ------------------------------------------------------------------------------------------- file contents

# What a file must not carry to the Hub, by content (weights included: matched in the bytes read as latin-1): an
# HF token, and the credentials a ``.netrc``, an AWS credentials file or an SSH/TLS key file holds. Each pattern
# opens with a literal, so that ``re`` skips ahead to it: ~1 ms per MB each here, where one case-insensitive
# alternation of them all took 116 ms per MB (minutes for a GB of weights).
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Hugging Face token", HF_TOKEN_RE),
    ("an AWS access key id", re.compile(r"A[KS]IA[0-9A-Z]{16}(?![0-9A-Z])")),
    ("an AWS secret access key", re.compile(r"aws_secret_access_key\s*[=:]")),
    ("an AWS secret access key", re.compile(r"AWS_SECRET_ACCESS_KEY\s*[=:]")),
    ("netrc credentials", re.compile(r"machine\s+\S+(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S")),
    ("netrc credentials", re.compile(r"default(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S")),
    ("a private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
)


def file_secrets(path: Path, token: str | None, chunk: int = 8 << 20) -> list[str]:
    """What secrets the file holds (:data:`SECRET_PATTERNS` by name, and ``token`` itself as "a Hugging Face
    token"), streamed in chunks (weights can be GBs)."""
    needle = token.encode() if token else None
    overlap = 256  # longer than any secret matched, so a match split across two chunks is still seen
    found: list[str] = []
    tail = b""
    with path.open("rb") as f:
        while block := f.read(chunk):
            window = tail + block
            text = window.decode("latin-1")
            found += [name for name, pattern in SECRET_PATTERNS if name not in found and pattern.search(text)]
            if needle and needle in window and SECRET_PATTERNS[0][0] not in found:
                found.append(SECRET_PATTERNS[0][0])
            tail = window[-overlap:]
    return found


def file_contains_token(path: Path, token: str | None) -> bool:
    """Whether the file holds an HF-token-like string or ``token`` itself."""
    return SECRET_PATTERNS[0][0] in file_secrets(path, token)


# How much of a file (or of a compressed or archived member) the pickle check parses: a pickle's opcodes, not its
# payload, are what it recognises.
PICKLE_SCAN_BYTES = 1 << 20
# pickletools' messages when the scanned bytes end inside a valid opcode (a larger pickle than the scan).
_TRUNCATED = ("but only", "exhausted before seeing STOP", "no newline found")
_NESTING = 3  # containers inside containers looked into (a gzip in a zip in a gzip); deeper is refused
_ZIP_MEMBERS = 256  # members of one zip looked into


def looks_pickled(path: Path) -> bool:
    """Whether the file's *content* is or holds a pickle, whatever its name (:func:`pickle_in`)."""
    return pickle_in(path) is not None


def pickle_in(path: Path) -> str | None:
    """Where the file's content holds a pickle ("" for the file itself, else e.g. "gzip-compressed content", "zip
    member data.pkl"); None
    when it holds none. Protocols 0-5: the first bytes parse as a pickle opcode stream (``pickletools.genops``) up
    to STOP, or up to the end of the scanned bytes of a larger file (protocol 0-1 are ASCII opcodes, 2-5 open with
    PROTO ``0x80`` n). Looked into as well: a zip (``torch.save``'s format holds ``*.pkl``; ``np.savez``), an
    object-dtype ``.npy`` (numpy pickles its elements), gzip, bz2 and xz content, under any name. Not for
    ``.safetensors`` files (checked by parsing them instead). Text, JSON, Markdown and safetensors fail at their
    first byte: '{', '#', '-' and a header length's zero bytes are no opcodes."""
    with path.open("rb") as f:
        head = f.read(PICKLE_SCAN_BYTES)
        longer = bool(f.read(1))
    if head[:4] == b"PK\x03\x04":
        return _pickle_in_zip(path, 0)
    return _pickle_in_bytes(head, longer, 0)


def _pickle_in_zip(source: Any, depth: int) -> str | None:
    import zipfile

    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist()[:_ZIP_MEMBERS]:
                if info.filename.endswith(".pkl"):
                    return f"zip member {info.filename}"
                with archive.open(info) as member:
                    head = member.read(PICKLE_SCAN_BYTES + 1)
                where = _pickle_in_bytes(head[:PICKLE_SCAN_BYTES], len(head) > PICKLE_SCAN_BYTES, depth + 1)
                if where is not None:
                    return f"zip member {info.filename}" + (f" (in {where})" if where else "")
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, RuntimeError):
        return None  # not a readable zip: the other checks (UTF-8 for text names) still apply
    return None


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


def _pickle_in_bytes(head: bytes, longer: bool, depth: int) -> str | None:
    """:func:`pickle_in` on the first bytes of a file or member (``longer``: more follow)."""
    import io

    if depth > _NESTING:
        return "content nested too deep to check" if _decompressor(head) or head[:4] == b"PK\x03\x04" else None
    if head[:6] == b"\x93NUMPY":
        return "an object-dtype .npy array" if _npy_holds_objects(head) else None
    if head[:4] == b"PK\x03\x04":
        return _pickle_in_zip(io.BytesIO(head), depth) if not longer else "a zip archive too large to look into"
    found = _decompressor(head)
    if found is not None:
        what, unpack = found
        try:
            inner = unpack.decompress(head, PICKLE_SCAN_BYTES + 1)
        except Exception:  # noqa: BLE001 - zlib.error, OSError, EOFError, LZMAError on a damaged stream
            return None  # nothing readable inside; a text name still fails the UTF-8 check
        where = _pickle_in_bytes(inner[:PICKLE_SCAN_BYTES], len(inner) > PICKLE_SCAN_BYTES or longer, depth + 1)
        return None if where is None else what + (f" (in {where})" if where else "")
    return "" if _is_pickle_stream(head, longer) else None


def _npy_holds_objects(head: bytes) -> bool:
    """Whether a ``.npy`` header declares an object dtype (whose elements ``np.save`` pickles)."""
    import io

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
    import io
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


def upload_file_problems(path: Path, rel: Path, token: str | None) -> list[str]:
    """Why ``path`` (shown as ``rel``) must not be uploaded: pickled by name or content (nested in an archive,
    a compressed stream or a numpy array too), binary under a text file's name, unreadable safetensors, or a
    secret inside (:data:`SECRET_PATTERNS`, or ``token``); [] when it may go."""
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
    elif path.suffix not in PICKLE_SUFFIXES and (where := pickle_in(path)) is not None:
        inside = f" in {where}" if where else ""
        problems.append(f"{rel}: holds a pickle{inside} (torch.save/pickle content under another name); not uploaded")
    if path.suffix in TEXT_SUFFIXES and (why := _not_utf8(path)) is not None:
        problems.append(f"{rel}: not UTF-8 text ({why}), which its name promises; binary content is not uploaded "
                        "under a text file's name")
    problems += [f"{rel}: contains {kind}" for kind in file_secrets(path, token)]
    return problems


def public_env(env: dict[str, Any]) -> dict[str, str]:
    """``env`` as hf_optbench may write it (a sweep's manifest, its copy of the sweep file): the value of a
    variable whose name looks secret (:func:`is_secret_name`) replaced by a marker; the name stays, to say that it
    was set."""
    return {str(k): REDACTED if is_secret_name(str(k)) else str(v) for k, v in env.items()}


def secret_values(env: dict[str, Any]) -> list[str]:
    """The values of ``env``'s secret-named variables (to keep them out of files and messages)."""
    return [str(v) for k, v in env.items() if is_secret_name(str(k)) and str(v)]
