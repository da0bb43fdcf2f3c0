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


def file_contains_token(path: Path, token: str | None, chunk: int = 8 << 20) -> bool:
    """Stream the file (weights can be GBs) looking for a token-like string or ``token`` itself."""
    needle = token.encode() if token else None
    overlap = 256  # longer than any token, so a match split across two chunks is still seen
    tail = b""
    with path.open("rb") as f:
        while block := f.read(chunk):
            window = tail + block
            if HF_TOKEN_RE.search(window.decode("latin-1")) or (needle and needle in window):
                return True
            tail = window[-overlap:]
    return False


# How much of a file the pickle check parses: a pickle's opcodes, not its payload, are what it recognises.
PICKLE_SCAN_BYTES = 1 << 20
# pickletools' messages when the scanned bytes end inside a valid opcode (a larger pickle than the scan).
_TRUNCATED = ("but only", "exhausted before seeing STOP", "no newline found")


def looks_pickled(path: Path) -> bool:
    """Whether the file's *content* is a pickle, whatever its name, protocols 0-5: its first bytes parse as a
    pickle opcode stream (``pickletools.genops``) up to STOP, or up to the end of the scanned bytes of a larger
    file (protocol 0-1 are ASCII opcodes, 2-5 open with PROTO ``0x80`` n); ``torch.save``'s zip format holds a
    ``*.pkl`` member. Not for ``.safetensors`` files (checked by parsing them instead). Text, JSON, Markdown and
    safetensors fail at their first byte: '{', '#', '-' and a header length's zero bytes are no opcodes."""
    with path.open("rb") as f:
        head = f.read(PICKLE_SCAN_BYTES)
        longer = bool(f.read(1))
    if head[:4] == b"PK\x03\x04":
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith(".pkl") for name in archive.namelist())
        except zipfile.BadZipFile:
            return False
    return _is_pickle_stream(head, longer)


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


def upload_file_problems(path: Path, rel: Path, token: str | None) -> list[str]:
    """Why ``path`` (shown as ``rel``) must not be uploaded: pickled by name or content, unreadable safetensors,
    or a token inside; [] when it may go."""
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
    elif path.suffix not in PICKLE_SUFFIXES and looks_pickled(path):
        problems.append(f"{rel}: holds a pickle (torch.save/pickle content under another name); not uploaded")
    if file_contains_token(path, token):
        problems.append(f"{rel}: contains a Hugging Face token")
    return problems


def public_env(env: dict[str, Any]) -> dict[str, str]:
    """``env`` as hf_optbench may write it (a sweep's manifest, its copy of the sweep file): the value of a
    variable whose name looks secret (:func:`is_secret_name`) replaced by a marker; the name stays, to say that it
    was set."""
    return {str(k): REDACTED if is_secret_name(str(k)) else str(v) for k, v in env.items()}


def secret_values(env: dict[str, Any]) -> list[str]:
    """The values of ``env``'s secret-named variables (to keep them out of files and messages)."""
    return [str(v) for k, v in env.items() if is_secret_name(str(k)) and str(v)]
