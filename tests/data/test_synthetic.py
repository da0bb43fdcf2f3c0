"""The hidden-Markov synthetic source: deterministic, fast, well-formed, Dirichlet-distributed rows, the default
source unchanged by the topic knob, and the exact optimal loss checked against brute force."""

from __future__ import annotations

import hashlib
import itertools
import time

import numpy as np
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.ngram import heldout_reference_losses
from hf_optbench.data.synthetic import HMMSource, _dirichlet_rows, _pmf


def test_deterministic_by_seed_and_in_range():
    a = HMMSource(seed=3).sample(16, 50, np.random.default_rng(0))
    b = HMMSource(seed=3).sample(16, 50, np.random.default_rng(0))
    c = HMMSource(seed=4).sample(16, 50, np.random.default_rng(0))
    assert a.dtype == np.int32 and a.shape == (16, 50)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 32


def test_one_to_two_million_tokens_in_seconds():
    src = HMMSource()
    t0 = time.perf_counter()
    toks = src.tokens(1 << 21)
    assert toks.size == 1 << 21
    assert time.perf_counter() - t0 < 10  # ~0.6 s measured on 2 shared cores


def test_train_and_eval_streams_are_separate_and_stable():
    src = HMMSource(seed=1)
    train = np.concatenate(list(src.iter_blocks(10, 32, split="train", chunk=4)))
    again = np.concatenate(list(src.iter_blocks(10, 32, split="train", chunk=4)))
    ev = np.concatenate(list(src.iter_blocks(10, 32, split="eval", split_seed=5)))
    ev_other = np.concatenate(list(src.iter_blocks(10, 32, split="eval", split_seed=6)))
    assert train.shape == (10, 32) and np.array_equal(train, again)
    assert not np.array_equal(train, ev) and not np.array_equal(ev, ev_other)
    with pytest.raises(ValueError):
        next(src.iter_blocks(1, 4, split="test"))


def test_low_alpha_is_near_deterministic_and_high_alpha_near_uniform():
    rng = np.random.default_rng(0)
    low = HMMSource(alpha_x=1e-4, alpha_z=1e-4, hidden_nodes=0).sample(64, 400, rng)
    high = HMMSource(alpha_x=100.0, alpha_z=100.0).sample(64, 400, rng)
    # with one-hot rows and no hidden node, X(t) is a function of X(t-1): few distinct bigrams
    bigrams_low = {(a, b) for row in low for a, b in zip(row[:-1], row[1:], strict=False)}
    assert len(bigrams_low) <= 32
    counts = np.bincount(high.reshape(-1), minlength=32) / high.size
    assert np.abs(counts - 1 / 32).max() < 0.01


@pytest.mark.parametrize("alpha", [1e-3, 0.1, 1.0, 5.0])
def test_dirichlet_rows_match_the_dirichlet_moments(alpha):
    k = 8
    rows = _dirichlet_rows(np.random.default_rng(1), alpha, (40000,), k)
    assert np.allclose(rows.sum(-1), 1.0) and (rows >= 0).all()
    assert abs(rows.mean() - 1 / k) < 1e-9
    theory = (1 / k) * (1 - 1 / k) / (k * alpha + 1)  # Var of one coordinate of Dirichlet(alpha * 1_k)
    assert rows[:, 0].var() == pytest.approx(theory, rel=0.08)


def test_rows_flatten_monotonically_as_alpha_grows():
    maxes = [_dirichlet_rows(np.random.default_rng(2), a, (500,), 16).max(-1).mean() for a in (1e-3, 1e-2, 0.1, 1, 10)]
    assert all(x > y for x, y in zip(maxes, maxes[1:], strict=False))


def test_from_data_args_and_no_hidden_nodes():
    args = DataArguments(data_source="synthetic", synthetic_vocab_size=300, synthetic_hidden_nodes=0, synthetic_seed=9)
    src = HMMSource.from_data_args(args)
    assert (src.vocab_size, src.hidden_nodes, src.seed) == (300, 0, 9)
    toks = src.tokens(5000)
    assert toks.size == 5000 and toks.max() < 300


# ------------------------------------------------------------------------------------------------ document topics
def test_default_source_is_unchanged_draw_for_draw():
    # sha256 of this sample taken from the code before topics and optimal_loss existed (commit 497d4ab)
    sample = HMMSource().sample(64, 64, np.random.default_rng(0))
    assert hashlib.sha256(sample.tobytes()).hexdigest() == (
        "f7f64d4abd19f9a1d5819ad6da010d805de2f941d706ead398e76c52dc6e90da")
    off = HMMSource(topics=0, topic_weight=0.9).sample(64, 64, np.random.default_rng(0))
    assert np.array_equal(off, sample)  # the weight means nothing without topics


def test_topics_keep_the_graph_and_hold_for_a_whole_sequence():
    plain, topical = HMMSource(seed=5), HMMSource(seed=5, topics=3, topic_weight=1.0, alpha_x=1e-3)
    assert np.array_equal(plain._x_cdf, HMMSource(seed=5, topics=3, alpha_x=0.068)._x_cdf)  # same graph tables
    rows = topical.sample(40, 50, np.random.default_rng(1))
    # weight 1 and sparse topic rows: one topic explains every token of a row (its few words), and rows differ
    words = _pmf(topical._topic_cdf) > 1e-3
    explained_by = [{tp for tp in range(3) if words[tp, r].all()} for r in rows]
    assert all(len(tps) >= 1 for tps in explained_by)
    assert len(set().union(*explained_by)) > 1 and words.sum(1).max() <= 4
    with pytest.raises(ValueError):
        HMMSource(topics=-1)
    with pytest.raises(ValueError):
        HMMSource(topics=2, topic_weight=1.5)


def test_optimal_loss_of_a_markov_chain_is_its_own_log_likelihood():
    src = HMMSource(hidden_nodes=0, vocab_size=12, alpha_x=0.3, seed=2)
    rows = src.sample(30, 40, np.random.default_rng(3))
    pmf = _pmf(src._x_cdf)[:, 0, :]
    direct = -np.log(pmf[rows[:, :-1], rows[:, 1:]]).mean()
    assert src.optimal_loss(rows) == pytest.approx(direct, rel=1e-12)


def _brute_force_loss(src: HMMSource, rows: np.ndarray) -> float:
    """Mean -log P(x_t | x_<t) by enumerating every topic, start state and hidden path (loops, no tensor tricks)."""
    s, k_nodes = src.hidden_states, src.hidden_nodes
    hidden = [_pmf(c) for c in src._hidden_cdf]
    emit, topic_pmf = _pmf(src._x_cdf), _pmf(src._topic_cdf)
    states = list(itertools.product(range(s), repeat=k_nodes))
    total = 0.0
    for row in rows:
        # alpha[(topic, z)] = P(x_0 .. x_t, topic, z_t); starts: topic, z and the token before the row uniform
        alpha = {(tp, z): 1.0 / (src.topics * len(states)) for tp in range(src.topics) for z in states}
        prefix = []
        for t, x in enumerate(row):
            new = {}
            for (tp, z), a in alpha.items():
                for z2 in states:
                    p_move = 1.0
                    for k in range(k_nodes):
                        p_move *= hidden[k][z[k], z2[k - 1] if k else 0, z2[k]]
                    graph = np.mean(emit[:, z2[-1], x]) if t == 0 else emit[row[t - 1], z2[-1], x]
                    p_x = (1 - src.topic_weight) * graph + src.topic_weight * topic_pmf[tp, x]
                    new[(tp, z2)] = new.get((tp, z2), 0.0) + a * p_move * p_x
            prefix.append(sum(new.values()))
            alpha = new
        total += -sum(np.log(prefix[t] / prefix[t - 1]) for t in range(1, len(row)))
    return total / (rows.shape[0] * (rows.shape[1] - 1))


def test_optimal_loss_matches_brute_force_enumeration():
    src = HMMSource(vocab_size=3, hidden_nodes=2, hidden_states=2, alpha_x=0.5, alpha_z=0.3, topics=2,
                    topic_weight=0.4, seed=7)
    rows = src.sample(3, 5, np.random.default_rng(2))
    assert src.optimal_loss(rows) == pytest.approx(_brute_force_loss(src, rows), rel=1e-10)


def test_optimal_loss_is_below_every_ngram_reference():
    src = HMMSource(topics=8, alpha_x=0.02)
    train = np.concatenate(list(src.iter_blocks(2048, 64, split="train")))
    held = np.concatenate(list(src.iter_blocks(128, 64, split="eval")))
    ref = heldout_reference_losses(train, held, 32)
    assert src.optimal_loss(held) < ref["trigram"] < ref["bigram"] < ref["unigram"]
