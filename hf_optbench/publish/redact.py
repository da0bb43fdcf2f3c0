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

# Words that make a variable or option name secret (TOKEN, KEY, SECRET, PASSWORD, ..., case-insensitive).
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

# Credentials by the shape their service gives them: a fixed prefix, then the random part. Searched in every staged
# file, weights included (matched in the bytes read as latin-1). Each pattern opens with a literal, so that ``re``
# skips ahead to it: ~0.3-1 ms per MB each here, where one case-insensitive alternation of them all took 116 ms per
# MB (minutes for a GB of weights). Prefixes and lengths: GitHub's token formats (github.blog, 2021-04-05, "Behind
# GitHub's new authentication token formats"; fine-grained tokens github_pat_, 2022-10-18), the rules of gitleaks
# (gitleaks/gitleaks config/gitleaks.toml at b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b: github-*, openai-api-key,
# anthropic-api-key, gitlab-pat, slack-*, gcp-api-key) and of Yelp/detect-secrets 1.5.0 (plugins github_token,
# gitlab_token, slack), W&B's own check (wandb/wandb wandb/sdk/lib/auth/validation.py at 852834b70bad: 40 or more
# word characters; apikey.py at af8577bb5139: legacy keys are 40 hex digits, on-prem ones carry a "name-" prefix);
# lengths are taken as lower bounds, so that a longer variant of a format is still caught.
# Why a table and not detect-secrets itself: its last release (1.5.0, 2024-05) has no rule for fine-grained GitHub
# tokens, OpenAI project keys without the T3BlbkFJ marker, Anthropic, W&B or Google keys, and scans line by line
# through its plugin API (too slow for GBs of weights); this table is tested case by case in tests/publish.
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Hugging Face token", HF_TOKEN_RE),
    ("a GitHub token", re.compile(r"gh[pousr]_[A-Za-z0-9]{36}")),
    ("a GitHub fine-grained token", re.compile(r"github_pat_[A-Za-z0-9_]{40,}")),
    ("an Anthropic API key", re.compile(r"sk-ant-[a-z]+[0-9]*-[A-Za-z0-9_-]{32,}")),
    ("an OpenAI API key", re.compile(r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{32,}")),
    ("an OpenAI API key", re.compile(r"sk-[A-Za-z0-9]{48}")),
    ("a W&B API key", re.compile(r"wandb_v1_[A-Za-z0-9_]{40,}")),
    ("a Slack token", re.compile(r"xox[abeoprs]-(?:[0-9]+-)+[A-Za-z0-9-]{8,}")),
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_]{20,}")),
    ("a GitLab token", re.compile(r"gl(?:pat|dt|ft|rt|soat|cbt|ptt|oas|imt|agent)-[A-Za-z0-9_-]{20,}")),
    ("a Google API key", re.compile(r"AIza[A-Za-z0-9_-]{35}")),
    ("an AWS access key id", re.compile(r"A[KS]IA[0-9A-Z]{16}(?![0-9A-Z])")),
    ("an AWS secret access key", re.compile(r"aws_secret_access_key\s*[=:]")),
    ("an AWS secret access key", re.compile(r"AWS_SECRET_ACCESS_KEY\s*[=:]")),
    ("netrc credentials", re.compile(r"machine\s+\S+(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S")),
    ("netrc credentials", re.compile(r"default(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S")),
    ("a private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
)
# In text files only (every staged file but safetensors weights): a legacy W&B key is 40 hex digits, the shape of a
# git commit id too, so it is a secret only where W&B's own places put it: WANDB_API_KEY, wandb.login(key=...),
# the netrc entry `wandb login` writes for api.wandb.ai.
TEXT_SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a W&B API key", re.compile(r"(?i:wandb_api_key)[\"'\]]{0,2}[ \t]*[:=][ \t]*[\"']?(?:\w+-)?[0-9a-f]{40}")),
    ("a W&B API key", re.compile(r"wandb\.login\([^)\n]{0,80}?key[ \t]*=[ \t]*[\"'](?:\w+-)?[0-9a-f]{40}")),
    ("a W&B API key", re.compile(r"api\.wandb\.ai\s+login\s+\S+\s+password\s+(?:\w+-)?[0-9a-f]{40}")),
)
# A NAME = value, NAME: value or "name": "value" assignment (.env, YAML, JSON, shell, Python) whose NAME looks
# secret (is_secret_name: *_KEY, *_TOKEN, *_SECRET, *_PASSWORD) and whose value looks random (_random_looking).
# The name starts where no name character precedes it: without that, a long run of letters would be tried from each
# of its positions, each try backtracking through the rest (quadratic: 20 s for 20,000 letters).
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.-])([A-Za-z_][A-Za-z0-9_.-]*)[\"'\]]{0,2}[ \t]*(?::=|[:=])[ \t]*[\"']?([A-Za-z0-9_.+/=-]{16,})")
# gitleaks' generic-api-key rule: 3.5 bits per character (config/gitleaks.toml at b58d3f1, `entropy = 3.5`)
GENERIC_MIN_ENTROPY = 3.5
_PARSE_LIMIT = 256 << 20  # a JSON or YAML file larger than this is not parsed: refused as uncheckable


def _entropy(value: str) -> float:
    """Shannon entropy of ``value``'s characters, in bits per character."""
    import math
    from collections import Counter

    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def _random_looking(value: str) -> bool:
    """Whether ``value`` looks like a key rather than a word, a name or a number: 16+ characters mixing letters
    and digits at :data:`GENERIC_MIN_ENTROPY` bits per character or more (a 40-hex W&B key ~3.7, a word < 3.5)."""
    return (len(value) >= 16 and any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
            and _entropy(value) >= GENERIC_MIN_ENTROPY)


def _assigned(name: str, value: str) -> str | None:
    """The kind of secret a ``name`` = ``value`` assignment holds (naming the key, never the value), or None."""
    if is_secret_name(name) and _random_looking(value):
        return f"a high-entropy value assigned to '{name}'"
    return None


def _kinds_in(text: str, text_rules: bool) -> list[str]:
    """The kinds of secret :data:`SECRET_PATTERNS` (and with ``text_rules`` the text-only rules) find in ``text``."""
    found = [kind for kind, pattern in SECRET_PATTERNS if pattern.search(text)]
    if text_rules:
        found += [kind for kind, pattern in TEXT_SECRET_PATTERNS if pattern.search(text)]
        found += [k for m in _ASSIGNMENT.finditer(text) if (k := _assigned(m.group(1), m.group(2)))]
    return found


def secret_kinds(data: bytes, token: str | None, text_rules: bool = True) -> list[str]:
    """The kinds of secret in ``data`` (bytes read as Latin-1, so any byte is a character): :func:`_kinds_in`, and
    ``token`` itself as "a Hugging Face token"."""
    kinds = _kinds_in(data.decode("latin-1"), text_rules)
    if token and token.encode() in data:
        kinds.append(SECRET_PATTERNS[0][0])
    return list(dict.fromkeys(kinds))


def _add(found: list[str], kinds: list[str]) -> None:
    found += [k for k in dict.fromkeys(kinds) if k not in found]


def _parsed_strings(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Every string a JSON, JSON-lines or YAML file (or a safetensors header) holds once parsed (escapes such as
    ``\\u0067`` decoded, keys given twice both kept), and its (key, string value) pairs. ValueError saying why a
    file cannot be parsed."""
    import json

    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            docs = [f.read(size).decode("utf-8", "replace")] if 0 < size <= 100 << 20 else []
    elif path.stat().st_size > _PARSE_LIMIT:
        raise ValueError(f"larger than the {_PARSE_LIMIT >> 20} MiB parsed to check its strings")
    elif suffix in (".yaml", ".yml"):
        return _yaml_strings(path)
    else:
        docs = [path.read_text(encoding="utf-8", errors="replace")]
    if suffix == ".jsonl":
        docs = docs[0].splitlines()
    strings: list[str] = []
    pairs: list[tuple[str, str]] = []
    for doc in docs:
        try:
            tree = json.loads(doc, object_pairs_hook=lambda items: items)
        except (ValueError, RecursionError) as exc:
            if suffix == ".jsonl":
                continue  # a line cut short (a run still writing): its text was searched as it stands
            raise ValueError(f"not valid JSON ({exc if isinstance(exc, ValueError) else 'nested too deeply'})") \
                from None
        _walk(tree, strings, pairs)
    return strings, pairs


def _yaml_strings(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    from hf_optbench.errors import OptBenchError
    from hf_optbench.yaml_file import load_yaml_mapping

    try:
        tree = load_yaml_mapping(path, "staged file", empty_ok=True)
    except OptBenchError:
        raise ValueError("not YAML hf_optbench can read (a syntax error, a key given twice or an alias)") from None
    strings: list[str] = []
    pairs: list[tuple[str, str]] = []
    _walk(tree, strings, pairs)
    return strings, pairs


def _walk(tree: Any, strings: list[str], pairs: list[tuple[str, str]]) -> None:
    """Collect the strings of a parsed document (dicts, or lists of (key, value) pairs from ``object_pairs_hook``)
    without recursion: a deeply nested file must not end in RecursionError."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, dict):
            node = list(node.items())
        if isinstance(node, list) and node and all(isinstance(p, tuple) and len(p) == 2 for p in node):
            for key, value in node:
                strings.append(str(key))
                if isinstance(value, str):
                    pairs.append((str(key), value))
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def secret_problems(path: Path, token: str | None, chunk: int = 8 << 20) -> list[str]:
    """What the file holds that must not leave the machine, each as "contains <kind>" (the kind, never the value),
    or why it cannot be checked.

    The bytes are streamed in chunks (weights can be GBs) through :data:`SECRET_PATTERNS`, and ``token`` itself is
    looked for as "a Hugging Face token"; every file but safetensors weights also through the text rules (W&B's
    places, high-entropy ``*_KEY``/``*_TOKEN`` assignments); JSON, JSON lines, YAML and a safetensors header's
    metadata are parsed too, so that a value written with escapes, or under a secret-named key, is seen."""
    text_rules = path.suffix.lower() != ".safetensors"
    overlap = 256  # longer than any secret matched, so a match split across two chunks is still seen
    found: list[str] = []
    tail = b""
    with path.open("rb") as f:
        while block := f.read(chunk):
            window = tail + block
            _add(found, secret_kinds(window, token, text_rules))
            tail = window[-overlap:]
    problems = [f"contains {kind}" for kind in found]
    if path.suffix.lower() in (".json", ".jsonl", ".yaml", ".yml", ".safetensors"):
        try:
            strings, pairs = _parsed_strings(path)
        except ValueError as exc:
            return problems + [f"{exc}, so its strings cannot be checked for secrets"]
        kinds = _kinds_in("\n".join(strings), True) + [k for key, v in pairs if (k := _assigned(key, v))]
        if token and any(token in s for s in strings):
            kinds.append(SECRET_PATTERNS[0][0])
        problems += [f"contains {kind}" for kind in dict.fromkeys(kinds) if kind not in found]
    return problems

def public_env(env: dict[str, Any]) -> dict[str, str]:
    """``env`` as hf_optbench may write it (a sweep's manifest, its copy of the sweep file): the value of a
    variable whose name looks secret (:func:`is_secret_name`) replaced by a marker; the name stays, to say that it
    was set."""
    return {str(k): REDACTED if is_secret_name(str(k)) else str(v) for k, v in env.items()}


def secret_values(env: dict[str, Any]) -> list[str]:
    """The values of ``env``'s secret-named variables (to keep them out of files and messages)."""
    return [str(v) for k, v in env.items() if is_secret_name(str(k)) and str(v)]
