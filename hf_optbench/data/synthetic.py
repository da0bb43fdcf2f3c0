"""A synthetic token source of controlled difficulty: a chain of hidden Markov nodes feeding an observed node.

Why: optimizer comparisons are easier to read on data whose difficulty is known and tunable, which real text cannot
offer. Difficulty is gzip's compression ratio of sampled tokens (:mod:`hf_optbench.data.difficulty`): above ~0.98
there is almost no structure for a learner to exploit, while ~0.75 is hard but learnable, where optimizers can
differ. The graph: hidden nodes Z_1 .. Z_K with S states each and an observed node X with V tokens. At every step

    Z_1(t) ~ P_1[Z_1(t-1)]                    Z_k(t) ~ P_k[Z_k(t-1), Z_{k-1}(t)]   (k >= 2)
    X(t)   ~ P_X[X(t-1), Z_K(t)]

and every row of every table is drawn from a symmetric Dirichlet (coupled across alpha, see
``_dirichlet_rows``): ``alpha_z`` for the hidden nodes, ``alpha_x`` for X. These two concentrations are the
difficulty knob: small ones make rows nearly one-hot (predictable, compressible); large ones make them near uniform
(the gzip ratio tends to 1). With ``hidden_nodes=0`` X is a plain first-order Markov chain. Every table is small
(P_X has V*S*V entries), so any graph size samples fast. The alphas that give a ratio depend on the graph size:
after changing it, calibrate with ``hf-optbench data difficulty --data_source synthetic --target_ratio 0.75``.

Document topics (``topics`` > 0; off by default, which leaves the source above unchanged draw for draw): each
sequence draws one of ``topics`` topics at its start, kept for the whole sequence, and each token comes with
probability ``topic_weight`` from that topic's word distribution T[topic] (rows ~ Dirichlet(``alpha_x``)) instead
of from the graph; the next step's X(t-1) is the token emitted either way. This is the composite model of Griffiths
et al. 2005 ("Integrating topics and syntax", NIPS 17): short-range syntax from a hidden Markov model, long-range
semantics from a document topic. Why: in the graph alone, what lies beyond the bigram is a lookup on (X(t-1),
hidden state) pairs that models of the CPU sizes learn far more slowly than pair statistics (``nano`` at 4-8 and
``tiny`` at 2-4 tokens per parameter end within 0.05 nats of the bigram reference loss, docs/notes/regime_design.md);
a topic is evidence that accumulates over the whole context, as in text, where an n-gram model cannot see it and
attention can.

Sampling is vectorised over sequences (numpy), looping only over time, so ~1M tokens take well under a second.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from hf_optbench.config.bounds import SYNTHETIC_CHUNK
from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.cache import block_schema, store, work_dir, write_blocks

# Stream ids that separate the random numbers used for the graph, the training samples, the held-out samples and
# the tuning samples (3 is taken by ``HMMSource.tokens``, the difficulty measurement's sample).
_GRAPH_STREAM, _TRAIN_STREAM, _EVAL_STREAM, _TUNING_STREAM = 0, 1, 2, 4


def _dirichlet_rows(rng: np.random.Generator, alpha: float, shape: tuple[int, ...], k: int) -> np.ndarray:
    """Rows ~ Dirichlet(alpha * 1_k) of shape ``shape + (k,)``, coupled across alpha.

    Why not ``rng.dirichlet``: its draws jump when alpha changes (rejection sampling, and another algorithm below
    alpha=0.1), so for one seed the difficulty moved erratically with alpha and alpha searches stalled. Here the
    random numbers are fixed by the seed and alpha only sets the concentration, so difficulty moves smoothly:
    Gamma(alpha) = Gamma(alpha + 1) * U**(1/alpha) (the "boost" identity, exact), with Gamma(alpha + 1) from the
    Wilson-Hilferty cube-of-a-normal approximation (shape >= 1, where it is close), normalised in log space so
    tiny alphas never underflow to an all-zero row.
    """
    size = (*shape, k)
    z = rng.standard_normal(size)
    u = np.maximum(rng.random(size), np.finfo(np.float64).tiny)
    a = alpha + 1.0
    cube = np.maximum(1.0 - 1.0 / (9.0 * a) + z / (3.0 * np.sqrt(a)), 1e-12)
    log_g = np.log(a) + 3.0 * np.log(cube) + np.log(u) / alpha
    log_g -= log_g.max(axis=-1, keepdims=True)
    rows = np.exp(log_g)
    return rows / rows.sum(axis=-1, keepdims=True)


def _pmf(cdf: np.ndarray) -> np.ndarray:
    """The probabilities ``HMMSource._draw`` samples from a cumulative table: the last entry takes what rounding
    left below 1 (``_draw`` clips to it)."""
    pmf = np.diff(cdf, axis=-1, prepend=0.0)
    pmf[..., -1] = 1.0 - pmf[..., :-1].sum(-1)
    return pmf


@dataclass
class HMMSource:
    """Seedable generator of token sequences from a graph of hidden Markov nodes (``DataArguments.synthetic_*``)."""

    vocab_size: int = 32  # observable tokens
    hidden_nodes: int = 4
    hidden_states: int = 4  # states per hidden node
    alpha_x: float = 0.068  # with alpha_z = 0.068: gzip token ratio 0.750 on this graph (seed 0), "hard but learnable"
    alpha_z: float = 0.068
    seed: int = 0
    topics: int = 0  # document topics (0: none, the graph alone)
    topic_weight: float = 0.5  # probability that a token comes from its sequence's topic (with topics > 0)
    _hidden_cdf: list[np.ndarray] = field(init=False, repr=False, compare=False)
    _x_cdf: np.ndarray = field(init=False, repr=False, compare=False)
    _topic_cdf: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.vocab_size < 2 or self.hidden_states < 1 or self.hidden_nodes < 0:
            raise ValueError(f"invalid HMMSource sizes: {self}")
        if not (self.alpha_x > 0 and self.alpha_z > 0):
            raise ValueError("Dirichlet concentrations must be > 0")
        if self.topics < 0 or not 0.0 <= self.topic_weight <= 1.0:
            raise ValueError(f"invalid HMMSource topics: {self}")
        rng = np.random.default_rng([self.seed, _GRAPH_STREAM])
        s, v = self.hidden_states, self.vocab_size
        self._hidden_cdf = []
        for k in range(self.hidden_nodes):
            parents = 1 if k == 0 else s  # node k>0 also conditions on the current state of node k-1
            self._hidden_cdf.append(np.cumsum(_dirichlet_rows(rng, self.alpha_z, (s, parents), s), axis=-1))
        x_parents = s if self.hidden_nodes else 1
        self._x_cdf = np.cumsum(_dirichlet_rows(rng, self.alpha_x, (v, x_parents), v), axis=-1)
        # drawn after the graph's tables, so the graph of a seed is the same with or without topics
        self._topic_cdf = (np.cumsum(_dirichlet_rows(rng, self.alpha_x, (self.topics,), v), axis=-1)
                           if self.topics else None)

    @classmethod
    def from_data_args(cls, data_args: DataArguments) -> HMMSource:
        """Build from a :class:`~hf_optbench.config.data_args.DataArguments` (its ``synthetic_*`` fields)."""
        return cls(
            vocab_size=data_args.synthetic_vocab_size,
            hidden_nodes=data_args.synthetic_hidden_nodes,
            hidden_states=data_args.synthetic_hidden_states,
            alpha_x=data_args.synthetic_alpha_x,
            alpha_z=data_args.synthetic_alpha_z,
            seed=data_args.synthetic_seed,
            topics=data_args.synthetic_topics,
            topic_weight=data_args.synthetic_topic_weight,
        )

    @staticmethod
    def _draw(cdf_rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        u = rng.random((cdf_rows.shape[0], 1))
        idx = (cdf_rows < u).sum(axis=1)
        return np.minimum(idx, cdf_rows.shape[1] - 1)  # guard against cumsum rounding below 1.0

    def sample(self, n_sequences: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """``n_sequences`` independent sequences of ``length`` tokens (int32), each from a uniform random start."""
        s, v = self.hidden_states, self.vocab_size
        z = [rng.integers(0, s, size=n_sequences) for _ in range(self.hidden_nodes)]
        x = rng.integers(0, v, size=n_sequences)
        topic = rng.integers(0, self.topics, size=n_sequences) if self._topic_cdf is not None else None
        zeros = np.zeros(n_sequences, dtype=np.int64)
        out = np.empty((n_sequences, length), dtype=np.int32)
        for t in range(length):
            parent = zeros
            for k, cdf in enumerate(self._hidden_cdf):
                z[k] = self._draw(cdf[z[k], parent], rng)
                parent = z[k]
            x = self._draw(self._x_cdf[x, parent], rng)
            if topic is not None:
                from_topic = rng.random(n_sequences) < self.topic_weight
                x = np.where(from_topic, self._draw(self._topic_cdf[topic], rng), x)
            out[:, t] = x
        return out

    def optimal_loss(self, blocks: np.ndarray) -> float:
        """The true source's cross-entropy on ``blocks`` (rows of tokens it sampled), in nats per predicted token:
        the mean of -log P(x_t | x_0 .. x_{t-1}) over t >= 1 in each row, the context a model has inside a block.

        Why: it is the loss of a perfect model on the same positions a model's eval loss covers, so it shows how
        far below the n-gram references (:mod:`hf_optbench.data.ngram`) there is left to learn. Computed exactly by
        the forward algorithm (Rabiner 1989, "A tutorial on hidden Markov models", eq. 19-20) over the sequence's
        topic and the joint state of the hidden nodes, advanced node by node (never an S**K x S**K matrix),
        starting as ``sample`` starts: topic, hidden nodes and the token before the row uniform.
        """
        rows = np.asarray(blocks, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[1] < 2:
            raise ValueError(f"blocks must be 2-D rows of at least 2 tokens, got shape {rows.shape}")
        n, s, k_nodes = rows.shape[0], self.hidden_states, self.hidden_nodes
        n_topics = self.topics or 1
        emit = _pmf(self._x_cdf)  # [x_prev, z_K, x]
        hidden = [_pmf(c) for c in self._hidden_cdf]  # [z_k old, z_{k-1} new, z_k new]
        belief = np.full((n, n_topics) + (s,) * k_nodes, 1.0 / (n_topics * s**k_nodes))
        graph_shape = (n, 1) + (1,) * (k_nodes - 1) + (s,) if k_nodes else (n, 1)  # over z_K
        nll = 0.0
        for t in range(rows.shape[1]):
            for k, table in enumerate(hidden):  # advance node k given its old state and node k-1's new one
                b = belief.reshape(n * n_topics, s ** max(k - 1, 0), s if k else 1, s, -1)
                belief = np.einsum("npjar,ajc->npjcr", b, table[:, : (s if k else 1)]).reshape(belief.shape)
            x = rows[:, t]
            # P(x_t | x_{t-1}, z_K) per row and state of z_K; before the row, x_{t-1} is uniform over the vocabulary
            lik = (emit[:, :, x].mean(0).T if t == 0 else emit[rows[:, t - 1], :, x]).reshape(graph_shape)
            if self._topic_cdf is not None:
                topic_lik = _pmf(self._topic_cdf)[:, x].T.reshape((n, n_topics) + (1,) * k_nodes)
                lik = (1.0 - self.topic_weight) * lik + self.topic_weight * topic_lik
            weighted = belief * lik
            p = weighted.reshape(n, -1).sum(1)
            if t > 0:
                nll -= np.log(p).sum()
            belief = weighted / p.reshape((n,) + (1,) * (belief.ndim - 1))
        return float(nll / (n * (rows.shape[1] - 1)))

    def iter_blocks(
        self, n_blocks: int, block_size: int, *, split: str = "train", split_seed: int = 0,
        chunk: int = SYNTHETIC_CHUNK,
    ) -> Iterator[np.ndarray]:
        """Yield ``n_blocks`` sequences of ``block_size`` tokens in chunks (2-D arrays), deterministically.

        The training stream depends on ``seed`` only; the held-out streams (eval, tuning: one each) on ``seed`` and
        ``split_seed``, so the evaluation blocks are the same for every optimizer, training seed and budget.
        """
        streams = {"train": [_TRAIN_STREAM], "eval": [_EVAL_STREAM, split_seed], "tuning": [_TUNING_STREAM, split_seed]}
        if split not in streams:
            raise ValueError(f"split must be 'train', 'eval' or 'tuning', got {split!r}")
        key = [self.seed, *streams[split]]
        rng = np.random.default_rng(key)
        done = 0
        while done < n_blocks:
            n = min(chunk, n_blocks - done)
            yield self.sample(n, block_size, rng)
            done += n

    def tokens(self, n_tokens: int, *, sequence_length: int = 1024, seed: int = 0) -> np.ndarray:
        """About ``n_tokens`` tokens (whole sequences) as one flat array, e.g. for the gzip difficulty ratio."""
        n_seq = max(1, -(-n_tokens // sequence_length))
        rng = np.random.default_rng([self.seed, 3, seed])
        return self.sample(n_seq, sequence_length, rng).reshape(-1)[:n_tokens]


def build_synthetic_entry(data_args: DataArguments, n_train: int, n_eval: int, cache_root: str, fp: str) -> str:
    """Generate ``n_train`` / ``n_eval`` blocks of ``data_args.block_size`` tokens into the data cache entry ``fp``
    (same Arrow layout as a packed text source); returns the entry's directory."""
    import datasets
    import pyarrow as pa

    t0 = time.perf_counter()
    bs, vocab = data_args.block_size, data_args.synthetic_vocab_size
    src = HMMSource.from_data_args(data_args)
    schema = block_schema()
    n_tuning = data_args.tuning_blocks
    sizes = {"train": n_train, "eval": n_eval, **({"tuning": n_tuning} if n_tuning else {})}
    with work_dir(cache_root) as work:
        parts = {}
        for name, n in sizes.items():
            path = os.path.join(work, f"{name}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for chunk in src.iter_blocks(n, bs, split=name, split_seed=data_args.split_seed):
                    write_blocks(writer, schema, chunk, bs)
            parts[name] = datasets.Dataset.from_file(path)
        info = {
            "data_source": "synthetic",
            "source": f"synthetic: HMM graph V={vocab} K={data_args.synthetic_hidden_nodes} "
            f"S={data_args.synthetic_hidden_states} alpha_x={data_args.synthetic_alpha_x} "
            f"alpha_z={data_args.synthetic_alpha_z} seed={data_args.synthetic_seed}"
            + (f" topics={data_args.synthetic_topics} topic_weight={data_args.synthetic_topic_weight}"
               if data_args.synthetic_topics else ""),
            "tokenizer": None,
            "vocab_size": vocab,
            "block_size": bs,
            "num_documents": sizes,
            "train_blocks": n_train,
            "eval_blocks": n_eval,
            "train_tokens": n_train * bs,
            "eval_tokens": n_eval * bs,
            "tuning_blocks": n_tuning,
            "tuning_tokens": n_tuning * bs,
            "dropped_tail_tokens": dict.fromkeys(sizes, 0),
            "split_seed": data_args.split_seed,
            "fingerprint": fp,
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        return store(datasets.DatasetDict(parts), info, cache_root, fp, replace=data_args.overwrite_data_cache)
