"""Reference losses of a token split: what unigram, bigram and trigram tables achieve on it, so that a report shows
the regime its runs are in.

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

A second estimate, :func:`trained_reference_losses`, fits interpolated Kneser-Ney models on a training stream and
scores them on the held-out one, as a language model is (see its section below). **The report reads the regime
against this one**, fitted on the training split the runs drew from: on the main job's 32-token synthetic
source the two agree, but on real text the eval split alone starves. With the bundled Thai tokenizer's 1,835 token
types, 8,192 eval tokens put most bigrams and trigrams in the split once, leave-one-out scores each such occurrence
with no count for it, and the references sit far too high (bigram 3.995 from the eval split
against 3.12 from the 100,096 training tokens the runs saw, and the runs' losses, 3.8-4.0, read "bigram–trigram"
instead of the transient they were in). The leave-one-out figure stays beside the trained one where the two place
every loss alike; :func:`singleton_share` says how starved a split is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_optbench.errors import OptBenchError

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


def singleton_share(blocks: Any, order: int = 2) -> float:
    """The share of a split's ``order``-gram predictions (within blocks) whose n-gram occurs once in it: the
    predictions leave-one-out scores with no count of their own, so how starved :func:`reference_losses` is."""
    x = np.asarray(blocks, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] < order:
        return 0.0
    _, counts = _per_event(_codes(x, order, int(x.max()) + 1, start=0))
    return float(np.mean(counts == 1))


def describe(losses: dict[int, float]) -> str:
    """"unigram 3.43, bigram 2.39, trigram 2.08 nats"."""
    return ", ".join(f"{ORDERS.get(k, f'{k}-gram')} {v:.3g}" for k, v in sorted(losses.items())) + " nats"


def transient(loss: float, losses: dict[int, float]) -> bool:
    """Whether a loss sits at or above the bigram reference: the first moments of training, where a model has not
    yet learned what a table of token pairs knows (the report's "transient")."""
    return math.isfinite(loss) and 2 in losses and loss >= losses[2]


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


# ------------------------------------------------------------------------------------------------------------
# Held-out estimate: Kneser-Ney models of a training stream, scored on a held-out one
# ------------------------------------------------------------------------------------------------------------
# n-gram reference losses of a token stream: the levels a language model must beat to have learned more than them.
#
# Why: a model's eval loss means little on its own. Set beside the held-out cross-entropy of the best unigram, bigram
# and trigram models estimated on the same training tokens, it says how much of the data's structure the model has
# picked up: at or above the bigram level it has learned no more than pair statistics (the first moments of
# training); clearly below the trigram level it uses context beyond two tokens.
#
# The estimate: interpolated Kneser-Ney smoothing (Kneser & Ney 1995, "Improved backing-off for M-gram language
# modeling", ICASSP; the interpolated form as in Chen & Goodman 1998, "An empirical study of smoothing techniques
# for language modeling", TR-10-98 Harvard, with one discount per order, D = n1 / (n1 + 2 n2) (Ney, Essen & Kneser
# 1994), n_r being the number of distinct n-grams seen exactly r times at that level), estimated on
# the training tokens and evaluated on the held-out ones, in nats per predicted token (the unit of the Trainer's
# eval loss). The highest order of each model uses raw counts, the lower ones continuation counts (how many distinct
# tokens precede an n-gram), and the lowest is interpolated with the uniform distribution over ``vocab_size``, so an
# unseen token never has probability 0. Chen & Goodman found this form the best of the smoothing methods they
# compared, so the reference is not easy to beat by a trick of estimation.
#
# Rows: a 2-D array is a batch of independent sequences (as the packed blocks a model sees): n-grams never span two
# rows, the first token of each row is not predicted (the causal-LM loss has no label for it) and the second is
# predicted from one token of context, exactly the context a model has there. A 1-D array is one sequence.
#
# Plain numpy, not a library: the n-gram packages on PyPI (nltk.lm, kenlm) either take minutes for a million tokens
# in pure Python or need a compiled binary; here n-grams are int64 codes counted with ``np.unique``.

SMOOTHING = ("interpolated Kneser-Ney (Kneser & Ney 1995; Chen & Goodman 1998), one discount per order "
             "D = n1/(n1+2 n2), lowest order interpolated with uniform 1/V")


def _as_rows(tokens: Any, vocab_size: int, what: str) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] < 2 or arr.shape[0] == 0:
        raise OptBenchError(f"{what} tokens must be a 1-D sequence or 2-D rows of at least 2 tokens, got shape "
                            f"{np.asarray(tokens).shape}. Pass the token ids of the split.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise OptBenchError(f"{what} tokens must be integer ids, got dtype {arr.dtype}. Pass token ids, not text.")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise OptBenchError(f"{what} tokens must be in [0, {vocab_size}), got ids {arr.min()} .. {arr.max()}. "
                            "Pass the vocabulary size of the tokenizer that made them.")
    return arr.astype(np.int64)


def _codes(rows: np.ndarray, n: int, vocab_size: int, *, start: int) -> np.ndarray:
    """Every n-gram of the rows whose last token is at position >= ``start`` (and >= n-1), as one int64 code each
    (base-``vocab_size`` digits, oldest token most significant)."""
    length = rows.shape[1]
    first = max(start, n - 1)
    if first >= length:  # rows shorter than the n-gram: none
        return np.zeros(0, dtype=np.int64)
    code = np.zeros((rows.shape[0], length - first), dtype=np.int64)
    for j in range(n):  # token at offset t - (n-1) + j
        code = code * vocab_size + rows[:, first - (n - 1) + j: length - (n - 1) + j]
    return code.reshape(-1)


def _distinct(codes: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``codes``. By hand, not ``np.unique``: numpy 2.4's ``np.unique`` without counts
    takes a hash path that needed 10 s for 2M trigram codes of a 50,257-token vocabulary on a 2-core CPU, a sort
    0.6 s (numpy 2.4.6)."""
    ordered = np.sort(codes)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` at ``query`` for sorted unique ``keys``; 0 where a query is absent."""
    if keys.size == 0:
        return np.zeros(query.shape, dtype=np.float64)
    idx = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    return np.where(keys[idx] == query, values[idx], 0).astype(np.float64)


def _discount(counts: np.ndarray) -> float:
    """Chen & Goodman's D = n1 / (n1 + 2 n2); 0.5 where no n-gram was seen exactly once or twice (counts so large
    that the discount barely matters)."""
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 > 0 else 0.5


def _level(ngrams: np.ndarray, vocab_size: int, query: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One level of the recursion for the n-gram codes ``ngrams`` (raw occurrences, or one per distinct left
    extension at a continuation level). Per query n-gram: the discounted count over its context's total, the weight
    left for the lower order (D x distinct continuations of the context over the total), and whether the context
    was seen at all (if not, the caller passes the lower order through)."""
    keys, counts = np.unique(ngrams, return_counts=True)
    d = _discount(counts)
    ctx_keys, ctx_start = np.unique(keys // vocab_size, return_index=True)
    ctx_totals = np.add.reduceat(counts, ctx_start) if keys.size else np.zeros(0, dtype=np.int64)
    ctx_types = np.diff(np.append(ctx_start, keys.size))
    total = _lookup(ctx_keys, ctx_totals, query // vocab_size)
    types = _lookup(ctx_keys, ctx_types, query // vocab_size)
    count = _lookup(keys, counts, query)
    safe = np.maximum(total, 1.0)
    return np.maximum(count - d, 0.0) / safe, d * types / safe, total > 0


def _chain(train: np.ndarray, held: np.ndarray, vocab_size: int, order: int, start: int) -> np.ndarray:
    """Probabilities of the held-out tokens at positions ``start`` .. end of each row (``start >= order - 1``: every
    one has its full context) under the interpolated Kneser-Ney ``order``-gram model of ``train``."""
    prob = np.full(held.shape[0] * (held.shape[1] - start), 1.0 / vocab_size)
    for n in range(1, order + 1):
        if n == order:
            grams = _codes(train, n, vocab_size, start=0)
        else:  # continuation counts: one per distinct (preceding token, n-gram) pair
            grams = _distinct(_codes(train, n + 1, vocab_size, start=0)) % vocab_size**n
        discounted, backoff, seen = _level(grams, vocab_size, _codes(held, n, vocab_size, start=start))
        prob = np.where(seen, discounted + backoff * prob, prob)
    return prob


def cross_entropy(tokens_train: Any, tokens_eval: Any, vocab_size: int, order: int) -> float:
    """Held-out cross-entropy (nats per predicted token) of an interpolated Kneser-Ney ``order``-gram model
    estimated on ``tokens_train`` (see the module docstring for the rows and the smoothing).

    A position with fewer than ``order - 1`` tokens before it in its row (the row's second token, for a trigram)
    is scored by the model of the order its context allows, whose highest level then uses raw counts.
    """
    if order < 1:
        raise OptBenchError(f"the n-gram order must be >= 1, got {order}. Use 1 (unigram) .. 3 (trigram).")
    if vocab_size < 2 or order * math.log2(vocab_size) >= 62:
        raise OptBenchError(f"vocab_size {vocab_size} with order {order} does not fit int64 n-gram codes (needs "
                            "2 <= vocab_size and vocab_size**order < 2**62). Lower the order.")
    train = _as_rows(tokens_train, vocab_size, "training")
    held = _as_rows(tokens_eval, vocab_size, "held-out")
    length = held.shape[1]
    probs = [_chain(train, held[:, : t + 1], vocab_size, t + 1, t) for t in range(1, min(order - 1, length))]
    if order - 1 < length:
        probs.append(_chain(train, held, vocab_size, order, max(order - 1, 1)))
    return float(-np.log(np.concatenate(probs)).mean())


def trained_reference_losses(tokens_train: Any, tokens_eval: Any, vocab_size: int, max_order: int = 3) -> dict[int, float]:
    """{order: held-out cross-entropy} for orders 1 .. ``max_order`` of interpolated Kneser-Ney models fitted on
    ``tokens_train`` and scored on ``tokens_eval``: the report's reference levels (the module doc says why)."""
    return {n: cross_entropy(tokens_train, tokens_eval, vocab_size, n) for n in range(1, max_order + 1)}


def heldout_reference_losses(tokens_train: Any, tokens_eval: Any, vocab_size: int) -> dict[str, Any]:
    """Held-out unigram, bigram and trigram cross-entropies (nats per predicted token) of ``tokens_eval`` under
    interpolated Kneser-Ney models estimated on ``tokens_train``: the levels a model's eval loss is read against.

    Returns ``{"unigram", "bigram", "trigram": float, "smoothing": str, "train_tokens", "eval_predictions": int}``
    (``eval_predictions``: the held-out positions scored, the first token of each row excluded).
    """
    out: dict[str, Any] = {ORDERS[n]: v for n, v in trained_reference_losses(tokens_train, tokens_eval, vocab_size).items()}
    held = _as_rows(tokens_eval, vocab_size, "held-out")
    out.update(smoothing=SMOOTHING, train_tokens=int(np.asarray(tokens_train).size),
               eval_predictions=int(held.shape[0] * (held.shape[1] - 1)))
    return out
