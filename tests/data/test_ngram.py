"""n-gram reference losses on sources whose answer is known: the eval split's leave-one-out estimate (issue 29) and
the held-out Kneser-Ney estimate (issue 31); every conditional distribution sums to 1, rows respected."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_optbench.data.ngram import (
    _as_rows,
    _chain,
    cross_entropy,
    describe,
    heldout_reference_losses,
    reference_losses,
    regime,
    singleton_share,
    trained_reference_losses,
    transient,
)
from hf_optbench.errors import OptBenchError


def test_independent_uniform_tokens_cost_log_v_at_every_order() -> None:
    x = np.random.default_rng(0).integers(0, 8, size=(200, 64))
    losses = reference_losses(x, 8)
    assert all(v == pytest.approx(math.log(8), abs=0.03) for v in losses.values())


def test_a_markov_chain_s_bigram_reference_is_its_entropy_rate() -> None:
    rng = np.random.default_rng(1)
    p = rng.dirichlet([0.3] * 6, size=6)
    pi = np.linalg.matrix_power(p, 200)[0]
    rate = -sum(pi[i] * p[i, j] * math.log(p[i, j]) for i in range(6) for j in range(6))
    seqs = np.zeros((300, 64), dtype=np.int64)
    seqs[:, 0] = rng.integers(0, 6, size=300)
    for t in range(1, 64):
        u = rng.random(300)[:, None]
        seqs[:, t] = np.minimum((np.cumsum(p[seqs[:, t - 1]], axis=1) < u).sum(axis=1), 5)
    losses = reference_losses(seqs, 6)
    assert losses[2] == pytest.approx(rate, abs=0.03) and losses[1] > losses[2] + 0.2
    assert losses[3] == pytest.approx(losses[2], abs=0.02)  # nothing more to learn from a second token back


def test_leave_one_out_is_not_fooled_by_tokens_seen_once() -> None:
    """On few tokens most trigrams occur once: the plug-in entropy of the empirical trigram table is near 0, yet a
    table cannot predict fresh text from the same (uniform) source. Scored leave-one-out, it costs ~log V."""
    x = np.random.default_rng(2).integers(0, 32, size=(20, 16))
    losses = reference_losses(x, 32)
    assert losses[3] > 0.9 * math.log(32)
    cycle = np.array([[(i + j) % 5 for j in range(32)] for i in range(50)])
    assert reference_losses(cycle, 5)[2] < 0.01  # a deterministic successor: a bigram table knows it


def test_regime_and_description() -> None:
    refs = {1: 3.43, 2: 2.39, 3: 2.08}
    assert [regime(v, refs) for v in (3.6, 3.32, 2.2, 1.9)] == ["above unigram", "unigram–bigram", "bigram–trigram",
                                                               "below trigram"]
    assert describe(refs) == "unigram 3.43, bigram 2.39, trigram 2.08 nats"
    with pytest.raises(ValueError):
        reference_losses(np.zeros((3, 1), dtype=int), 4)


def test_singletons_and_the_transient() -> None:
    """How starved a split is: the share of its bigram predictions whose bigram it holds once; and the transient,
    at or above the bigram reference."""
    assert singleton_share(np.tile(np.arange(4), (10, 1))) == 0.0  # every bigram seen ten times
    assert singleton_share(np.arange(64).reshape(4, 16)) == 1.0  # every bigram once
    refs = {1: 3.43, 2: 2.39, 3: 2.08}
    assert [transient(v, refs) for v in (3.6, 2.39, 2.2, float("nan"))] == [True, True, False, False]


def test_the_trained_references_are_the_held_out_cross_entropies() -> None:
    rng = np.random.default_rng(4)
    train, held = rng.integers(0, 6, (50, 16)), rng.integers(0, 6, (10, 16))
    assert trained_reference_losses(train, held, 6) == {n: cross_entropy(train, held, 6, n) for n in (1, 2, 3)}



def _markov(p: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n tokens of the first-order chain with transition matrix ``p`` (rows: previous token)."""
    cdf = np.cumsum(p, axis=1)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    u = rng.random(n)
    for t in range(1, n):
        out[t] = min(int(np.searchsorted(cdf[out[t - 1]], u[t])), p.shape[0] - 1)
    return out


def test_uniform_iid_tokens_cost_log_v_at_every_order():
    rng = np.random.default_rng(0)
    v = 8
    ref = heldout_reference_losses(rng.integers(0, v, 200_000), rng.integers(0, v, 20_000), v)
    for key in ("unigram", "bigram", "trigram"):
        assert ref[key] == pytest.approx(math.log(v), abs=0.01), key
    assert ref["trigram"] >= ref["unigram"] - 0.005  # no structure to find: more context cannot help
    assert "Kneser-Ney" in ref["smoothing"] and ref["train_tokens"] == 200_000 and ref["eval_predictions"] == 19_999


def test_first_order_chain_gives_its_entropies():
    rng = np.random.default_rng(1)
    p = np.array([[0.8, 0.1, 0.1], [0.2, 0.2, 0.6], [0.5, 0.45, 0.05]])
    # stationary distribution and the chain's entropy rate, in closed form
    w, vecs = np.linalg.eig(p.T)
    pi = np.real(vecs[:, np.argmin(np.abs(w - 1))])
    pi /= pi.sum()
    h_unigram = -(pi * np.log(pi)).sum()
    h_rate = -(pi[:, None] * p * np.log(p)).sum()
    ref = heldout_reference_losses(_markov(p, 200_000, rng), _markov(p, 50_000, rng), 3)
    assert ref["unigram"] == pytest.approx(h_unigram, abs=0.01)
    assert ref["bigram"] == pytest.approx(h_rate, abs=0.01)
    assert ref["trigram"] == pytest.approx(h_rate, abs=0.01)  # first order: a second token of context adds nothing


def test_second_order_structure_shows_only_at_the_trigram():
    # x_t = x_{t-1} xor x_{t-2}, flipped with probability 0.05: pairs look random, triples are nearly determined
    rng = np.random.default_rng(2)
    n = 100_000
    x = np.zeros(n, dtype=np.int64)
    x[:2] = 1
    flips = rng.random(n) < 0.05
    for t in range(2, n):
        x[t] = (x[t - 1] ^ x[t - 2]) ^ flips[t]
    train, held = x[:80_000], x[80_000:]
    h_noise = -(0.05 * math.log(0.05) + 0.95 * math.log(0.95))
    assert cross_entropy(train, held, 2, 2) == pytest.approx(math.log(2), abs=0.01)
    assert cross_entropy(train, held, 2, 3) == pytest.approx(h_noise, abs=0.01)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_every_conditional_distribution_sums_to_one(order):
    rng = np.random.default_rng(3)
    v = 6
    train = _as_rows(rng.integers(0, v, (40, 12)) % np.array([1, 2, 3, 6, 6, 6] * 2), v, "training")
    # contexts seen often, seen once and never seen (token 5 never follows 5 5 in the sparse training data)
    for context in ([0, 0], [3, 1], [5, 5]):
        held = np.array([[*context, w] for w in range(v)])
        probs = _chain(train, held, v, order, 2)
        assert probs.sum() == pytest.approx(1.0, abs=1e-12), context
        assert (probs > 0).all()  # smoothing leaves no token at probability 0


def test_rows_are_independent_sequences():
    # every row is 0 1 2 3: within rows the next token is certain; across a row boundary 3 -> 0 would be a new pair
    rows = np.tile(np.arange(4), (50, 1))
    ref = heldout_reference_losses(rows, rows[:5], 4)
    assert ref["bigram"] < 0.05 and ref["trigram"] < 0.05
    assert ref["eval_predictions"] == 5 * 3  # the first token of a row is never predicted
    # token 0 never follows 3 inside a training row; joined into one sequence, it would 49 times
    assert cross_entropy(rows, np.array([[3, 0]]), 4, 2) > 1.0
    assert cross_entropy(rows.reshape(-1), np.array([[3, 0]]), 4, 2) < 0.1


def test_short_context_positions_use_the_lower_order_with_raw_counts():
    # the row's second token has one token of context: the trigram model scores it as the bigram model does
    rng = np.random.default_rng(4)
    train = rng.integers(0, 5, (200, 16)) % np.array([5] * 8 + [2] * 8)
    held = rng.integers(0, 5, (30, 2))
    assert cross_entropy(train, held, 5, 3) == pytest.approx(cross_entropy(train, held, 5, 2), rel=1e-12)


def test_training_rows_shorter_than_the_order_hold_no_ngram_of_it():
    # 2-token rows hold no trigram: the 4-gram model still gives every held-out token a probability (no crash, no
    # infinity), and no more than the uniform code's cost plus the smoothing's
    rows = np.tile([[0, 1], [1, 0]], (20, 1))
    held = np.array([[0, 1, 0, 1, 0]])
    assert 0 < cross_entropy(rows, held, 2, 4) < math.log(2) + 0.1


@pytest.mark.parametrize(
    ("train", "held", "vocab", "order", "fragment"),
    [
        ([0, 1, 9], [0, 1], 4, 2, "in [0, 4)"),
        ([0.5, 1.0], [0, 1], 4, 2, "integer ids"),
        ([0, 1, 2], [1], 4, 2, "at least 2 tokens"),
        ([0, 1, 2], [0, 1], 4, 0, "order must be >= 1"),
        ([0, 1, 2], [0, 1], 1 << 16, 4, "int64"),
    ],
)
def test_bad_input_is_one_clear_error(train, held, vocab, order, fragment):
    with pytest.raises(OptBenchError, match=fragment.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        cross_entropy(train, held, vocab, order)
