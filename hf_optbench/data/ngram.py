"""Reference losses of a token split: what unigram, bigram and trigram tables achieve on it (issue 29: "nothing
shows the regime").

A language model's eval loss means little without them: on the main job's synthetic source AdamW ended at 3.32
nats at ``nano`` while a table of token frequencies alone reaches ~3.4 and one of bigram frequencies ~2.4, so every
compared run sat at or above what a bigram table achieves. :func:`reference_losses` scores exactly the predictions
the eval loss scores (every token of a block after its first, from the tokens before it in the block) with n-gram
models of the split itself, in nats per token.

Estimator: each order is a Witten-Bell interpolated model (Witten & Bell 1991; Chen & Goodman 1998, Sec. 2.7),
``P(w | c) = (C(c, w) + T(c) P(w | c')) / (C(c) + T(c))`` with ``T(c)`` the distinct tokens seen after ``c`` and
``c'`` the context one token shorter, down to an add-one unigram. It is scored **leave-one-out**: each prediction's
own occurrence is removed from the counts it is scored with, so the table is never scored on what it was fit to.
Why not the plug-in entropy of the empirical n-gram distribution: on a few thousand tokens it is biased low, far
for trigrams (most trigrams occur once, and a table that has seen a token predicts it with certainty), while the
leave-one-out cross-entropy estimates what the table would achieve on fresh text from the same source. Why Witten-
Bell: it has no parameter to tune, so the reference cannot be tuned towards a result. A position too early in its
block for the order's context uses the longest context it has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

ORDERS = {1: "unigram", 2: "bigram", 3: "trigram"}


def _context_code(x: Any, rows: Any, pos: Any, k: int, base: int) -> Any:
    """The int64 code of the ``k`` tokens before ``pos`` in each row."""
    import numpy as np

    code = np.zeros(len(pos), dtype=np.int64)
    for j in range(1, k + 1):
        code = code * base + x[rows, pos - j]
    return code


def _per_event(keys: Any) -> tuple[Any, Any]:
    """(sorted unique keys, each event's count of its key)."""
    import numpy as np

    unique, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return unique, counts[inverse]


def _interpolated(x: Any, rows: Any, pos: Any, targets: Any, k: int, base: int, lower: Any) -> Any:
    """Each prediction's leave-one-out Witten-Bell probability with a ``k``-token context, interpolating ``lower``
    (the ``k - 1`` estimate), which a position with fewer than ``k`` tokens before it keeps."""
    import numpy as np

    out = lower.copy()
    usable = pos >= k
    if not usable.any():
        return out
    code_c = _context_code(x, rows[usable], pos[usable], k, base)
    pairs, c_cw = _per_event(code_c * base + targets[usable])
    contexts, c_c = _per_event(code_c)
    with_types, types = np.unique(pairs // base, return_counts=True)  # distinct next tokens per context
    t_c = types[np.searchsorted(with_types, code_c)].astype(np.float64)
    # leave one out: this prediction's own occurrence leaves its counts, and its type when it was the only one
    c_cw1, c_c1, t_c1 = c_cw - 1.0, c_c - 1.0, t_c - (c_cw == 1)
    low = lower[usable]
    denom = c_c1 + t_c1
    safe = np.where(denom > 0, denom, 1.0)
    out[usable] = np.where(denom > 0, (c_cw1 + t_c1 * low) / safe, low)
    del contexts
    return out


def reference_losses(blocks: Sequence[Sequence[int]], vocab_size: int, max_order: int = 3) -> dict[int, float]:
    """{order: leave-one-out cross-entropy in nats per token} for orders 1 .. ``max_order`` (see the module doc).
    ``blocks``: token ids of equal-length blocks (at least 2 tokens each)."""
    import numpy as np

    x = np.asarray(blocks, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] < 2 or x.size < 3:
        raise ValueError("reference losses need blocks of at least two tokens")
    b, t = x.shape
    targets = x[:, 1:].reshape(-1)
    pos = np.tile(np.arange(1, t), b)
    rows = np.repeat(np.arange(b), t - 1)
    base = int(max(vocab_size, int(x.max()) + 1))
    n = len(targets)
    _, c_w = _per_event(targets)
    prob = c_w / (n - 1 + base)  # add-one unigram, leave one out: (C(w) - 1 + 1) / (N - 1 + V)
    out = {1: float(-np.mean(np.log(prob)))}
    for k in range(1, max_order):
        prob = _interpolated(x, rows, pos, targets, k, base, prob)
        out[k + 1] = float(-np.mean(np.log(prob)))
    return out


def describe(losses: dict[int, float]) -> str:
    """"unigram 3.43, bigram 2.39, trigram 2.08 nats"."""
    return ", ".join(f"{ORDERS.get(k, f'{k}-gram')} {v:.3g}" for k, v in sorted(losses.items())) + " nats"


def regime(loss: float, losses: dict[int, float]) -> str:
    """Where a model's loss sits among the references: "above unigram", "unigram-bigram", "bigram-trigram",
    "below trigram"."""
    names = [ORDERS.get(k, f"{k}-gram") for k in sorted(losses)]
    values = [losses[k] for k in sorted(losses)]
    if not values or not math.isfinite(loss):
        return "–"
    if loss >= values[0]:
        return f"above {names[0]}"
    for i in range(1, len(values)):
        if loss >= values[i]:
            return f"{names[i - 1]}–{names[i]}"
    return f"below {names[-1]}"
