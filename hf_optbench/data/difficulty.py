"""How hard is a source? gzip's compression ratio, and a search for synthetic alphas that hit a target ratio.

Why gzip: it is a model-free, cheap proxy of how much structure a learner can exploit. A ratio near 1 means almost
no structure (above ~0.98 a problem is close to impossible to learn); ~0.75 is a hard but learnable target, where
optimizers can differ, and the synthetic source's default alphas are calibrated to it.

Definitions (ours, stated so numbers are comparable):
- token ratio = gzip-compressed bits / (n_tokens * log2(vocab_size)): gzip's cost per token relative to a uniform
  code. i.i.d. uniform tokens give ~1.05 (gzip's own overhead) when tokens fit a byte (vocab <= 256); larger
  vocabularies are serialised as uint16/uint32, where gzip pays more (~1.2 for i.i.d. uniform over 1,000 ids), so
  compare ratios only at equal vocabulary size.
- byte ratio (text sources) = gzip-compressed bytes / UTF-8 bytes.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_optbench.errors import OptBenchError

TARGET_RATIO = 0.75  # "hard but learnable": structured enough to learn, hard enough that optimizers differ
# Measured in place of the default Hub tokenizer when that one cannot be loaded (offline): shipped with the package.
OFFLINE_TOKENIZER = "builtin:thai-bpe-2k"
_GZIP_LEVEL = 9


def gzip_ratio(tokens: Sequence[int] | np.ndarray, vocab_size: int) -> float:
    """Compressed bits per token over ``log2(vocab_size)`` bits (see the module docstring)."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        raise OptBenchError("cannot measure the gzip ratio of an empty token sequence. Sample more tokens.")
    if vocab_size < 2:
        raise OptBenchError(f"vocab_size must be >= 2 for a gzip ratio, got {vocab_size}.")
    dtype = np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.uint32
    compressed = len(gzip.compress(arr.astype(dtype).tobytes(), compresslevel=_GZIP_LEVEL, mtime=0))
    return compressed * 8 / (arr.size * math.log2(vocab_size))


def gzip_ratio_bytes(data: bytes) -> float:
    """gzip-compressed size over raw size."""
    if not data:
        raise OptBenchError("cannot measure the gzip ratio of empty text. Check the source.")
    return len(gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)) / len(data)


def synthetic_ratio(
    alpha_x: float,
    alpha_z: float,
    *,
    vocab_size: int = 32,
    hidden_nodes: int = 4,
    hidden_states: int = 4,
    seed: int = 0,
    sample_tokens: int = 1 << 18,
    sequence_length: int = 1024,
) -> float:
    """gzip token ratio of an :class:`~hf_optbench.data.synthetic.HMMSource` with these knobs."""
    from hf_optbench.data.synthetic import HMMSource

    src = HMMSource(vocab_size, hidden_nodes, hidden_states, alpha_x, alpha_z, seed)
    return gzip_ratio(src.tokens(sample_tokens, sequence_length=sequence_length), vocab_size)


def calibrate_alphas(
    target_ratio: float = TARGET_RATIO,
    *,
    tune: str = "both",
    alpha_x: float = 1e-3,
    alpha_z: float = 0.125,
    vocab_size: int = 32,
    hidden_nodes: int = 4,
    hidden_states: int = 4,
    seed: int = 0,
    sample_tokens: int = 1 << 18,
    low: float = 1e-4,
    high: float = 10.0,
    tolerance: float = 0.005,
    max_iter: int = 30,
) -> dict[str, Any]:
    """Bisect (in log space) the concentration(s) that give ``target_ratio``.

    ``tune``: ``"both"`` sets alpha_x = alpha_z = a; ``"alpha_x"`` / ``"alpha_z"`` vary one and keep the other at
    the given value. The ratio rises with alpha on average but is not exactly monotone for a fixed graph seed, so
    the result is *a* crossing, reported with its measured ratio.
    """
    if tune not in ("both", "alpha_x", "alpha_z"):
        raise OptBenchError(f"tune must be both, alpha_x or alpha_z, got {tune!r}.")
    if not 0.0 < target_ratio < 1.2:
        raise OptBenchError(f"target_ratio must be in (0, 1.2), got {target_ratio}. The default target is 0.75.")
    if not 0 < low < high:
        raise OptBenchError(f"the alpha search range needs 0 < low < high, got low={low}, high={high}.")

    def alphas(a: float) -> tuple[float, float]:
        return (a, a) if tune == "both" else (a, alpha_z) if tune == "alpha_x" else (alpha_x, a)

    def ratio(a: float) -> float:
        ax, az = alphas(a)
        return synthetic_ratio(ax, az, vocab_size=vocab_size, hidden_nodes=hidden_nodes,
                               hidden_states=hidden_states, seed=seed, sample_tokens=sample_tokens)

    trace = []
    lo, hi = math.log10(low), math.log10(high)
    r_lo, r_hi = ratio(low), ratio(high)
    trace += [(low, r_lo), (high, r_hi)]
    if not r_lo <= target_ratio <= r_hi:
        raise OptBenchError(
            f"target_ratio {target_ratio} is outside what {tune} in [{low}, {high}] reaches "
            f"({r_lo:.3f} .. {r_hi:.3f}) for V={vocab_size}, K={hidden_nodes}, S={hidden_states}. "
            "Change the other alpha, the graph size, or the search range."
        )
    best = min(trace, key=lambda t: abs(t[1] - target_ratio))
    for _ in range(max_iter):
        mid = (lo + hi) / 2
        a = 10**mid
        r = ratio(a)
        trace.append((a, r))
        if abs(r - target_ratio) < abs(best[1] - target_ratio):
            best = (a, r)
        if abs(r - target_ratio) <= tolerance:
            break
        lo, hi = (mid, hi) if r < target_ratio else (lo, mid)
    ax, az = alphas(best[0])
    return {"alpha_x": ax, "alpha_z": az, "ratio": best[1], "target_ratio": target_ratio, "tune": tune,
            "evaluations": [{"alpha": a, "ratio": r} for a, r in trace]}


def source_difficulty(data_args: Any, *, sample_tokens: int = 1 << 18, sample_bytes: int = 1 << 22) -> dict[str, Any]:
    """gzip ratios of a configured source: token ratio (synthetic, or text through its tokenizer) and byte ratio."""
    if data_args.data_source == "synthetic":
        from hf_optbench.data.synthetic import HMMSource

        src = HMMSource.from_data_args(data_args)
        toks = src.tokens(sample_tokens)
        return {"source": "synthetic", "token_ratio": gzip_ratio(toks, src.vocab_size), "tokens": int(toks.size),
                "vocab_size": src.vocab_size, "alpha_x": src.alpha_x, "alpha_z": src.alpha_z}

    from hf_optbench.data.sources import iter_documents

    texts, size = [], 0
    for text in iter_documents(data_args):
        texts.append(text)
        size += len(text.encode("utf-8"))
        if size >= sample_bytes:
            break
    joined = "\n".join(texts).encode("utf-8")
    out: dict[str, Any] = {"source": data_args.data_source, "documents": len(texts), "bytes": len(joined),
                           "byte_ratio": gzip_ratio_bytes(joined)}
    tok, name, note = _difficulty_tokenizer(data_args.tokenizer_name)
    ids = [i for row in tok(texts, add_special_tokens=False, verbose=False)["input_ids"] for i in row]
    out.update(token_ratio=gzip_ratio(ids, len(tok)), tokens=len(ids), vocab_size=len(tok), tokenizer=name)
    if note:
        out["tokenizer_note"] = note
    return out


def _difficulty_tokenizer(name: str) -> tuple[Any, str, str | None]:
    """``(tokenizer, the name measured with, a note or None)`` for the token ratio of a text source.

    Only the default Hub tokenizer falls back, to the shipped :data:`OFFLINE_TOKENIZER`, and the result says so:
    ``data difficulty`` with no flags should measure something offline. A tokenizer the user named is loaded exactly
    or the :class:`OptBenchError` (one line naming the fix) propagates: a ratio under another tokenizer is not
    the ratio they asked for. Training runs never fall back (see :mod:`hf_optbench.data.tokenizers`).
    """
    from hf_optbench.data.tokenizers import DEFAULT_HUB_TOKENIZER, load_tokenizer

    try:
        return load_tokenizer(name), name, None
    except OptBenchError as exc:
        if name != DEFAULT_HUB_TOKENIZER:
            raise
        reason = str(exc).split(". Fix:")[0]
    note = (f"token_ratio measured with {OFFLINE_TOKENIZER}, not {name} ({reason}); pass --tokenizer_name to "
            "measure with another tokenizer")
    return load_tokenizer(OFFLINE_TOKENIZER), OFFLINE_TOKENIZER, note
