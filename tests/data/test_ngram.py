"""The eval split's n-gram reference losses (issue 29), on sources whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_optbench.data.ngram import describe, reference_losses, regime


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
