"""Load a tokenizer (Hub id, local directory or a ``builtin:`` one shipped with the package) and train one offline.

Why this module exists: the benchmark's default tokenizer is ``flax-community/gpt2-base-thai`` (the Flax community
GPT-2 Thai project), but this machine (and many clusters) cannot reach the Hub, and a silent fallback to another
tokenizer would change every number downstream. So loading never switches tokenizers behind the user's back: it loads exactly what was named or raises
:class:`~hf_optbench.errors.OptBenchError` quickly, saying how to point at a local one.

Training uses the ``tokenizers`` library (the Flax community recipe: byte-level BPE, ``min_frequency=2``, one
``<|endoftext|>`` special token that is bos = eos = unk, no pad). One option is ours: GPT-2's pre-tokenizer regex
splits Thai combining vowel and tone marks (Unicode category M) away from their consonants, so no merge can ever
join them and Thai costs far more tokens per character; ``keep_thai_marks`` keeps ``\\p{M}`` inside letter runs.
A character-level variant uses a WordLevel model over code points or grapheme clusters with a vocabulary sorted
by (frequency, character), so the id mapping never changes between runs: a vocabulary built in set or dict order
can number the characters differently on every run, and a cached tokenized dataset then silently means other text.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from hf_optbench.config.checks import check_tokenizer_dir
from hf_optbench.errors import OptBenchError, suggest
from hf_optbench.rundir import write_json_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BUILTIN_PREFIX = "builtin:"
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "resources" / "tokenizers"
DEFAULT_HUB_TOKENIZER = "flax-community/gpt2-base-thai"  # the Flax community GPT-2 Thai tokenizer
EOS_TOKEN = "<|endoftext|>"  # GPT-2's single special token (bos = eos = unk), as flax-community/gpt2-base-thai
CHAR_UNK_TOKEN = "<unk>"
# Flax community tokenizer recipe (transformers/examples/flax/language-modeling/README.md): min_frequency=2.
DEFAULT_MIN_FREQUENCY = 2
METADATA_FILE = "optbench_tokenizer.json"

# GPT-2's pre-tokenizer pattern (openai/gpt-2 encoder.py), with \p{M} added to the letter class and removed from
# the punctuation class so that Thai vowel/tone marks stay inside the letter run they belong to.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
KEEP_MARKS_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}\p{M}]+| ?\p{N}+| ?[^\s\p{L}\p{M}\p{N}]+|\s+(?!\S)|\s+"""

_HUB_PROBE_TIMEOUT_S = 3.0


# ----------------------------------------------------------------------------------------------------- loading
def builtin_tokenizers() -> dict[str, Path]:
    """Names of the tokenizers shipped in ``hf_optbench/resources/tokenizers`` -> their directories."""
    if not BUILTIN_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(BUILTIN_DIR.iterdir()) if (p / "tokenizer.json").is_file()}


def resolve_tokenizer_path(name_or_path: str) -> str:
    """Map ``builtin:NAME`` to its directory; return anything else unchanged (after ``~`` expansion for paths)."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise OptBenchError(
            f"tokenizer_name is empty: {name_or_path!r}. Set it to a Hub id (e.g. {DEFAULT_HUB_TOKENIZER}), "
            "a local directory, or builtin:<name>."
        )
    name = name_or_path.strip()
    if name.startswith(BUILTIN_PREFIX):
        key = name[len(BUILTIN_PREFIX) :]
        available = builtin_tokenizers()
        if key not in available:
            raise OptBenchError(
                f"unknown built-in tokenizer: {name!r}. Available: "
                f"{', '.join(BUILTIN_PREFIX + k for k in available) or '(none shipped)'}.{suggest(key, available)}"
            )
        return str(available[key])
    expanded = os.path.expanduser(name)
    return expanded if os.path.exists(expanded) else name


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def offline_env() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` asks for no network (tokenizer loading, Hub streaming)."""
    truthy = {"1", "on", "yes", "true"}
    return any(os.environ.get(k, "").strip().lower() in truthy for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = _HUB_PROBE_TIMEOUT_S) -> bool:
    """A quick TCP probe of the Hub endpoint (or the configured proxy).

    Why: with no network huggingface_hub retries for ~45 s before failing; a 3 s probe lets us fail fast with a
    useful message instead.
    """
    if offline_env():
        return False
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") if os.environ.get(k)), None)
    endpoint = proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parsed.hostname
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _not_available_error(name: str, why: str) -> OptBenchError:
    shipped = ", ".join(BUILTIN_PREFIX + k for k in builtin_tokenizers()) or "none"
    return OptBenchError(
        f"tokenizer_name {name!r} cannot be loaded: {why}. Fix: offline, use a tokenizer shipped with hf_optbench "
        f"(--tokenizer_name {shipped.split(', ')[0]}; shipped: {shipped}), a local directory holding tokenizer.json "
        "(saved with save_pretrained, or a copy of the Hub repo), or train one with `hf-optbench tokenizer train "
        "--input FILES --vocab-size N --output DIR`."
    )


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id``'s tokenizer (no network: the cache's own index)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(isinstance(try_to_load_from_cache(repo_id, name), str)
                   for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
    except ValueError:  # not a valid repo id: from_pretrained says so when it loads it
        return False


def check_tokenizer_available(name_or_path: str) -> str:
    """The tokenizer's directory or Hub id, once it is known that :func:`load_tokenizer` can load it without custom
    code: a shipped ``builtin:NAME``, a local directory with tokenizer files (none asking for code of its own), or a
    Hub id in the local cache (or, online, one it may download). Why: the checks a run makes before any work (and
    ``validate --full`` with it) answer here without transformers or torch: an offline run of the default Hub
    tokenizer not in the cache was refused only after 20 s of imports."""
    path = resolve_tokenizer_path(name_or_path)
    if os.path.isdir(path):
        if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json")):
            raise OptBenchError(
                f"tokenizer_name {name_or_path!r} is a directory without tokenizer files (tokenizer.json, "
                "vocab.json/merges.txt or tokenizer_config.json). Point it at a directory written by "
                "save_pretrained or `hf-optbench tokenizer train`."
            )
        check_tokenizer_dir(Path(path))  # custom code (auto_map) is refused by name, never run
        return path
    if os.path.exists(path):
        raise OptBenchError(f"tokenizer_name {name_or_path!r} is a file, not a directory. Pass the directory that holds tokenizer.json.")
    if _looks_like_path(path):
        raise OptBenchError(f"tokenizer directory not found: {name_or_path!r}. Check the path, or give a Hub id / builtin:<name>.")
    if offline_env() and not in_hub_cache(path):
        raise _not_available_error(path, "it is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    return path


def _refuse_custom_code(name: str, exc: ValueError) -> None:
    """transformers' refusal of a Hub tokenizer that needs its own code (``trust_remote_code=False``) as one line."""
    if "trust_remote_code" in str(exc):
        raise OptBenchError(
            f"tokenizer_name {name!r} asks for custom tokenizer code (auto_map in its tokenizer_config.json or "
            "config.json), which hf_optbench never runs. Use a tokenizer with a stock class, a shipped "
            "builtin:<name>, or `hf-optbench tokenizer train`.") from None


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load exactly the named tokenizer: ``builtin:NAME``, a local directory, or a Hub id (cache first).

    Never falls back to another tokenizer. Offline (``HF_HUB_OFFLINE=1``) or with the Hub unreachable, a Hub id
    that is not in the local cache raises :class:`OptBenchError` within a few seconds.
    """
    from transformers import AutoTokenizer

    path = check_tokenizer_available(name_or_path)
    if os.path.isdir(path):
        try:
            return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        except (OSError, ValueError, KeyError) as exc:
            raise OptBenchError(f"tokenizer directory {path!r} could not be loaded ({exc}). Re-save it with save_pretrained.") from exc
    try:  # the Hub cache, with no network access at all
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except ValueError as exc:
        _refuse_custom_code(path, exc)
    except OSError:
        pass
    if offline_env():
        raise _not_available_error(path, "it is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    if not hub_reachable():
        raise _not_available_error(path, "it is not in the local Hugging Face cache and the Hub cannot be reached")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except ValueError as exc:
        _refuse_custom_code(path, exc)
        raise _not_available_error(path, f"download failed ({str(exc).splitlines()[0]})") from exc
    except OSError as exc:
        raise _not_available_error(path, f"download failed ({str(exc).splitlines()[0]})") from exc


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides token ids (the full tokenizer.json and special tokens).

    Why: the data cache is keyed by it, so a cache built with another tokenizer (or another version of the same
    name) can never be reused by mistake: a cache keyed by the tokenizer's name alone silently feeds ids of
    another numbering to the model.
    """
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizer: hash the vocabulary
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([len(tokenizer), tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token]).encode())
    return h.hexdigest()[:16]


def thai_char_count(text: str) -> int:
    """Number of characters in the Thai block (U+0E00-U+0E7F)."""
    return sum(1 for ch in text if "\u0e00" <= ch <= "\u0e7f")


def tokens_per_char(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> dict[str, float]:
    """Tokens per character and per Thai character over ``texts`` (the figure the Thai-marks option changes)."""
    n_tokens = sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])
    n_chars = sum(len(t) for t in texts)
    n_thai = sum(thai_char_count(t) for t in texts)
    return {
        "tokens": n_tokens,
        "chars": n_chars,
        "thai_chars": n_thai,
        "tokens_per_char": n_tokens / max(n_chars, 1),
        "tokens_per_thai_char": n_tokens / max(n_thai, 1),
    }


# ---------------------------------------------------------------------------------------------------- training
def _bpe_backend(vocab_size: int, keep_thai_marks: bool, min_frequency: int) -> tuple[Any, Any]:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if keep_thai_marks:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(KEEP_MARKS_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:  # exactly GPT-2's byte-level pre-tokenizer (what flax-community/gpt2-base-thai uses)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def _char_backend(texts: Iterable[str], vocab_size: int, graphemes: bool) -> Any:
    """WordLevel over code points (or grapheme clusters), ids sorted by (-count, unit) so they never change."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    splitter = pre_tokenizers.Split(Regex(r"\X" if graphemes else r"[\s\S]"), behavior="isolated")
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(unit for unit, _ in splitter.pre_tokenize_str(text))
    specials = [EOS_TOKEN, CHAR_UNK_TOKEN]
    units = sorted(counts, key=lambda u: (-counts[u], u))[: max(vocab_size - len(specials), 0)]
    vocab = {tok: i for i, tok in enumerate(specials + units)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=CHAR_UNK_TOKEN))
    tok.pre_tokenizer = splitter
    tok.decoder = decoders.Fuse()  # join units back with no separator
    tok.add_special_tokens(specials)
    return tok


def train_tokenizer(
    texts: Iterable[str] | Sequence[str],
    vocab_size: int,
    output_dir: str | os.PathLike[str],
    *,
    keep_thai_marks: bool = True,
    char_level: bool = False,
    min_frequency: int = DEFAULT_MIN_FREQUENCY,
    metadata: dict[str, Any] | None = None,
) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE (or char-level) tokenizer on ``texts`` and save it loadable by AutoTokenizer.

    ``texts`` may be a generator (it is consumed once). Returns the saved tokenizer, reloaded from ``output_dir``.
    """
    if vocab_size < (2 if char_level else 258):
        floor = 2 if char_level else 258
        raise OptBenchError(
            f"vocab_size {vocab_size} is too small: a {'char-level' if char_level else 'byte-level BPE'} tokenizer "
            f"needs at least {floor} ({'special tokens' if char_level else '256 bytes + <|endoftext|>'}). Raise --vocab-size."
        )
    if min_frequency < 1:
        raise OptBenchError(f"min_frequency must be >= 1, got {min_frequency}. Use the Flax recipe's 2.")
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    counted = _CountingIterator(texts)
    if char_level:
        backend = _char_backend(counted, vocab_size, graphemes=keep_thai_marks)
        unk = CHAR_UNK_TOKEN
    else:
        backend, trainer = _bpe_backend(vocab_size, keep_thai_marks, min_frequency)
        backend.train_from_iterator(counted, trainer=trainer)
        unk = EOS_TOKEN
    if counted.n_texts == 0 or counted.n_chars == 0:
        raise OptBenchError("tokenizer training input holds no text: every document is empty. Pass files with text in them.")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, unk_token=unk, model_max_length=1024
    )
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(out))
    meta = {
        "kind": "char-level" if char_level else "byte-level BPE",
        "units": ("grapheme clusters" if keep_thai_marks else "code points") if char_level else None,
        "vocab_size_requested": vocab_size,
        "vocab_size": len(wrapped),
        "keep_thai_marks": keep_thai_marks,
        "min_frequency": None if char_level else min_frequency,
        "pre_tokenizer_pattern": None if char_level else (KEEP_MARKS_PATTERN if keep_thai_marks else GPT2_PATTERN),
        "documents": counted.n_texts,
        "characters": counted.n_chars,
        "recipe": "Flax community byte-level BPE (min_frequency=2, <|endoftext|> = bos/eos/unk, no pad)",
        **(metadata or {}),
    }
    write_json_atomic(out / METADATA_FILE, meta)
    return AutoTokenizer.from_pretrained(str(out), trust_remote_code=False)


class _CountingIterator:
    """Pass texts through while counting them (so an empty corpus is reported, not silently trained on)."""

    def __init__(self, texts: Iterable[str]):
        self._texts = texts
        self.n_texts = 0
        self.n_chars = 0

    def __iter__(self) -> Iterator[str]:
        for t in self._texts:
            if t:
                self.n_texts += 1
                self.n_chars += len(t)
                yield t
