"""The hidden-Markov synthetic source: deterministic, fast, well-formed, and Dirichlet-distributed rows."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.synthetic import HMMSource, _dirichlet_rows


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
