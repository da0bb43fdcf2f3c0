"""How hard is a source? gzip's compression ratio, and a search for synthetic alphas that hit a target ratio.

Why gzip (seed 004): it is a model-free, cheap proxy of how much structure a learner can exploit. A ratio near 1
means almost no structure (seed 004: above ~0.98 "almost impossible"); seed 004 targets ~0.75 as hard but learnable.

Definitions (ours, stated so numbers are comparable):
- token ratio = gzip-compressed bits / (n_tokens * log2(vocab_size)): gzip's cost per token relative to a uniform
  code. i.i.d. uniform tokens give ~1.05 (gzip's own overhead) when tokens fit a byte (vocab <= 256); larger
  vocabularies are serialised as uint16/uint32, where gzip pays more (~1.2 for i.i.d. uniform over 1,000 ids), so
  compare ratios only at equal vocabulary size.
- byte ratio (text sources) = gzip-compressed bytes / UTF-8 bytes.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_optbench.errors import OptBenchError

SEED004_TARGET_RATIO = 0.75  # seed 004: "a compression ratio around 75% would be a good starting point"
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
    """gzip token ratio of an :class:`~hf_optbench.synthetic.HMMSource` with these knobs."""
    from hf_optbench.synthetic import HMMSource

    src = HMMSource(vocab_size, hidden_nodes, hidden_states, alpha_x, alpha_z, seed)
    return gzip_ratio(src.tokens(sample_tokens, sequence_length=sequence_length), vocab_size)


def calibrate_alphas(
    target_ratio: float = SEED004_TARGET_RATIO,
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
        raise OptBenchError(f"target_ratio must be in (0, 1.2), got {target_ratio}. Seed 004 uses 0.75.")
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
        from hf_optbench.synthetic import HMMSource

        src = HMMSource.from_data_args(data_args)
        toks = src.tokens(sample_tokens)
        return {"source": "synthetic", "token_ratio": gzip_ratio(toks, src.vocab_size), "tokens": int(toks.size),
                "vocab_size": src.vocab_size, "alpha_x": src.alpha_x, "alpha_z": src.alpha_z}

    from hf_optbench.data import iter_documents

    texts, size = [], 0
    for text in iter_documents(data_args):
        texts.append(text)
        size += len(text.encode("utf-8"))
        if size >= sample_bytes:
            break
    joined = "\n".join(texts).encode("utf-8")
    out: dict[str, Any] = {"source": data_args.data_source, "documents": len(texts), "bytes": len(joined),
                           "byte_ratio": gzip_ratio_bytes(joined)}
    from hf_optbench.tokenization import load_tokenizer

    try:
        tok = load_tokenizer(data_args.tokenizer_name)
    except OptBenchError as exc:  # the byte ratio stands on its own; say why the token ratio is missing
        out["token_ratio"] = None
        out["token_ratio_unavailable"] = str(exc)
        return out
    ids = [i for row in tok(texts, add_special_tokens=False, verbose=False)["input_ids"] for i in row]
    out.update(token_ratio=gzip_ratio(ids, len(tok)), tokens=len(ids), vocab_size=len(tok), tokenizer=data_args.tokenizer_name)
    return out


# --------------------------------------------------------------------------------------------------------- CLI
def cli_main(argv: list[str] | None = None) -> int:
    """``hf-optbench data difficulty [DataArguments flags] [--target_ratio R] [--tune both|alpha_x|alpha_z]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "difficulty":
        print("usage: hf-optbench data difficulty [--data_source ...] [--target_ratio 0.75] [--json]", file=sys.stderr)
        return 2
    argv = ["--data_source" if a == "--source" else a for a in argv[1:]]
    from transformers import HfArgumentParser

    from hf_optbench.data_config import DataArguments

    parser = HfArgumentParser(DataArguments, prog="hf-optbench data difficulty",
                              description="gzip compression ratio of a data source; alpha search for a target ratio.")
    parser.add_argument("--target_ratio", "--target-ratio", type=float, default=None,
                        help="search synthetic alphas that give this token ratio (seed 004: 0.75)")
    parser.add_argument("--tune", choices=("both", "alpha_x", "alpha_z"), default="both",
                        help="which concentration the search varies (both: alpha_x = alpha_z)")
    parser.add_argument("--sample_tokens", "--sample-tokens", type=int, default=1 << 18, help="tokens sampled per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    data_args, extra = parser.parse_args_into_dataclasses(args=argv)
    if extra.target_ratio is not None:
        if data_args.data_source != "synthetic":
            raise OptBenchError("--target_ratio searches synthetic alphas: add --data_source synthetic.")
        result = calibrate_alphas(
            extra.target_ratio, tune=extra.tune, alpha_x=data_args.synthetic_alpha_x, alpha_z=data_args.synthetic_alpha_z,
            vocab_size=data_args.synthetic_vocab_size, hidden_nodes=data_args.synthetic_hidden_nodes,
            hidden_states=data_args.synthetic_hidden_states, seed=data_args.synthetic_seed, sample_tokens=extra.sample_tokens,
        )
    else:
        result = source_difficulty(data_args, sample_tokens=extra.sample_tokens)
    if extra.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        if key == "evaluations":
            continue
        print(f"{key:>24}: {value:.4g}" if isinstance(value, float) else f"{key:>24}: {value}")
    if "alpha_x" in result and extra.target_ratio is not None:
        print(f"recipe lines: synthetic_alpha_x: {result['alpha_x']:.4g}\n              synthetic_alpha_z: {result['alpha_z']:.4g}")
    return 0
