"""The regime on the page: every cell's final losses against n-gram reference losses, and whether the
baseline has left the transient.

A speedup or a final loss says nothing about where the runs are in training until it is set against what simple
tables achieve on the same text: on real Thai text AdamW sat on the unigram plateau while Muon escaped it, so the
"speedup" measured when each escaped. The references (:mod:`hf_optbench.data.ngram`) are interpolated Kneser-Ney
unigram, bigram and trigram models **fitted on the training split** the runs drew from and scored on the eval split
the runs were scored on, as a language model is; both splits are rebuilt from a run's own config.yaml through the
data cache (a cache hit: the splits the runs used, byte for byte).

Why the training split and not the eval split alone: the eval split's own leave-one-out references need
nothing but the split, and on the main job's 32-token synthetic source they agree with the trained ones, but on a
real vocabulary (the bundled Thai tokenizer's 1,835 types) 8,192 eval tokens hold most bigrams once, the references
sit far too high, and runs still in the transient read "bigram–trigram". So the trained references decide; the
eval-only ones are shown beside them where they place every loss alike, and where they do not, the report says
which it used and why. A cell is **transient** when the baseline's mean final loss is at or above the trained
bigram reference.

Where the data is synthetic, its source is a known hidden-Markov model, so the table also gives the **optimum**: the
source's own cross-entropy on the very eval blocks the runs were scored on (the forward algorithm,
:meth:`hf_optbench.data.synthetic.HMMSource.optimal_loss`), what a perfect model scores. Against it each optimizer's
**share of the gap** from the unigram reference to the optimum says how much of the learnable structure beyond token
frequencies it has learned. Real text has no known optimum: the table says so and gives no share.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import BASELINE
from hf_optbench.study.budget import budget_tokens
from hf_optbench.study.records import RunRecord

# At most this many training tokens fit the references: the main job's and the study's whole training splits (2^20
# and 2^21 synthetic tokens) fit under it, and a Hub corpus of billions stays a few seconds of counting.
REFERENCE_TRAIN_TOKENS = 2_097_152
TRANSIENT, PAST = "transient", "past the bigram"
OPTIMUM = "optimum (the source's own loss)"


def _data_args(cfg: dict[str, Any]) -> Any:
    """The run's DataArguments from its config.yaml's data fields (the other fields are the model's and trainer's)."""
    from hf_optbench.config.data_args import DataArguments

    names = {f.name for f in dataclasses.fields(DataArguments)}
    return DataArguments(**{k: v for k, v in cfg.items() if k in names})


def splits(rec: RunRecord) -> tuple[Any, Any, int]:
    """(the eval split's token blocks, the training split's first :data:`REFERENCE_TRAIN_TOKENS` tokens in blocks,
    the vocabulary size) of a run, rebuilt from its config.yaml's data arguments through the data cache."""
    import numpy as np

    from hf_optbench.data.pipeline import prepare_data
    from hf_optbench.report.planned import run_config

    cfg = run_config(rec)
    if "data_source" not in cfg:  # a run's resolved config.yaml always states it
        raise OptBenchError(f"{rec.run_dir}: its config.yaml does not state its data (data_source), so its "
                            "eval split cannot be rebuilt")
    data_args = _data_args(cfg)
    bundle = prepare_data(data_args, n_positions=int(cfg.get("n_positions") or data_args.block_size))
    eval_blocks = np.asarray(bundle.eval.with_format("numpy")["input_ids"], dtype=np.int64)
    rows = min(len(bundle.train), max(1, REFERENCE_TRAIN_TOKENS // max(1, eval_blocks.shape[1])))
    train = np.asarray(bundle.train.with_format("numpy")[:rows]["input_ids"], dtype=np.int64)
    return eval_blocks, train, int(bundle.vocab_size)


def optimal_loss(rec: RunRecord, eval_blocks: Any) -> float | None:
    """The run's data source's exact cross-entropy on ``eval_blocks`` (nats per predicted token, the predictions the
    eval loss scores) where its data is synthetic: the hidden-Markov source rebuilt from the run's config.yaml, as
    the data cache built it, scored by the forward algorithm. None for any other source: real text has no known
    optimum. Cost: ~0.3 s for 128 blocks of 64 tokens of the default graph, ~2 s with 8 topics on 2 busy cores."""
    from hf_optbench.report.planned import run_config

    cfg = run_config(rec)
    if cfg.get("data_source") != "synthetic":
        return None
    from hf_optbench.data.synthetic import HMMSource

    return HMMSource.from_data_args(_data_args(cfg)).optimal_loss(eval_blocks)


def gap_closed(unigram: float, loss: float, optimum: float) -> float | None:
    """The percentage of the gap from the unigram reference down to the optimum that ``loss`` has closed:
    100 (unigram - loss) / (unigram - optimum); 0 at the unigram, 100 at the optimum, negative above the unigram.
    None where the optimum is not below the unigram (no gap to close)."""
    gap = unigram - optimum
    return 100.0 * (unigram - loss) / gap if gap > 0 else None


@dataclass
class Regime:
    """The references and where every cell's losses sit among them (:func:`regime_of`)."""

    trained: dict[int, float]  # {order: loss} of the models fitted on the training split, scored on the eval split
    eval_only: dict[int, float]  # the eval split's own leave-one-out references
    train_tokens: int
    eval_blocks: int
    eval_tokens: int
    vocab: int
    singletons: dict[int, float]  # {order: share of the eval split's n-gram predictions whose n-gram it holds once}
    run_tokens: tuple[float, float] | None  # the fewest and most tokens a compared run trained on
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    cells: dict[str, str] = field(default_factory=dict)  # cell -> TRANSIENT | PAST (where the baseline ran)
    disagree: list[str] = field(default_factory=list)  # "adamw at tiny: 3.953, bigram–trigram by the eval split alone"
    optimum: float | None = None  # the source's exact loss on the eval blocks (synthetic data only)
    closed: dict[tuple[str, str], float] = field(default_factory=dict)  # {(cell, optimizer): % of the gap closed}

    @property
    def agree(self) -> bool:
        """Whether the eval split alone places every mean loss where the trained references do."""
        return not self.disagree


def _means(an: Any) -> dict[tuple[str, str], float]:
    """{(cell, optimizer): mean final eval loss over the completed seeds}."""
    out = {}
    for cell in an.sizes:
        for opt in an.optimizers:
            vals = [float(r["final_eval_loss"]) for r in an.ok() if r.status == "completed"
                    and r.get("final_eval_loss") is not None and r.optimizer == opt and r.cell.label == cell]
            if vals:
                out[(cell, opt)] = statistics.fmean(vals)
    return out


def regime_of(an: Any) -> Regime | None:
    """Both references of the runs' data and every cell's mean final losses placed among the trained ones; None
    without a completed run that has a final eval loss."""
    from hf_optbench.data.ngram import (
        reference_losses,
        regime,
        singleton_share,
        trained_reference_losses,
        transient,
    )

    ok = [r for r in an.ok() if r.status == "completed" and r.get("final_eval_loss") is not None]
    if not ok:
        return None
    eval_blocks, train, vocab = splits(ok[0])
    budgets = [b for b in (budget_tokens(r) for r in ok) if b]
    out = Regime(trained_reference_losses(train, eval_blocks, vocab), reference_losses(eval_blocks, vocab),
                 int(train.size), int(eval_blocks.shape[0]), int(eval_blocks.size), vocab,
                 {n: singleton_share(eval_blocks, n) for n in (2, 3)}, (min(budgets), max(budgets)) if budgets else None)
    out.optimum = optimal_loss(ok[0], eval_blocks)
    means = _means(an)
    optimum = "not known" if out.optimum is None else f"{out.optimum:.4f}"
    out.header = ["size", *[f"{o} final eval loss (where)" for o in an.optimizers], OPTIMUM, "regime"]
    for cell in an.sizes:
        row = [cell]
        for opt in an.optimizers:
            mean = means.get((cell, opt))
            if mean is None:
                row.append("–")
                continue
            where, alone = regime(mean, out.trained), regime(mean, out.eval_only)
            row.append(f"{mean:.4f} ({where})")
            if out.optimum is not None and (share := gap_closed(out.trained[1], mean, out.optimum)) is not None:
                out.closed[(cell, opt)] = share
            if alone != where:
                out.disagree.append(f"{opt} at {cell}: {mean:.4f}, {alone} by the eval split alone, {where} by the "
                                    "training split")
        base = means.get((cell, BASELINE))
        if base is not None:
            out.cells[cell] = TRANSIENT if transient(base, out.trained) else PAST
        row += [optimum, out.cells.get(cell, "–")]
        out.rows.append(row)
    return out


def regime_line(reg: Regime) -> str:
    """One line for the top of a report: "Regime: adamw ends past the bigram reference in 5 of 8 cells; transient
    (at or above it): nano @ 0.15 tok/param, ... (the regime table)"."""
    transient_cells = [c for c, word in reg.cells.items() if word == TRANSIENT]
    past = len(reg.cells) - len(transient_cells)
    bigram = reg.trained.get(2)
    level = f"{bigram:.4f} nats, " if bigram is not None else ""
    text = (f"Regime: {BASELINE} ends below the bigram reference ({level}fitted on {reg.train_tokens:,} training tokens) "
            f"in {past} of {len(reg.cells)} cell{'s' if len(reg.cells) != 1 else ''}")
    if transient_cells:
        text += f"; {TRANSIENT} (at or above it): {', '.join(transient_cells)}"
    return text + "."


def _which_and_why(reg: Regime) -> str:
    """The sentence that says which references the table uses and why, where the eval split alone disagrees."""
    from hf_optbench.data.ngram import ORDERS, describe

    shown = "; ".join(reg.disagree[:4]) + ("; ..." if len(reg.disagree) > 4 else "")
    gaps = {n: reg.eval_only[n] - reg.trained[n] for n in sorted(reg.trained)}
    worst = max((n for n in gaps if n in reg.singletons), key=lambda n: abs(gaps[n]))
    name = ORDERS[worst]
    return (f"The eval split alone (leave-one-out: {describe(reg.eval_only)}) places {len(reg.disagree)} of the mean "
            f"losses otherwise ({shown}). It is left out: with {reg.eval_tokens:,} eval tokens for a vocabulary of "
            f"{reg.vocab:,}, {reg.singletons[worst]:.0%} of its {name} predictions are of a {name} it holds once, which "
            f"leave-one-out scores with no count of its own: its {name} reference sits {abs(gaps[worst]):.2f} nats "
            f"{'above' if gaps[worst] > 0 else 'below'} the one fitted on the training split. The table "
            f"uses the references fitted on {reg.train_tokens:,} training tokens.")


def reference_section(doc: Any, an: Any, reg: Regime | None = None) -> None:
    """The report's "Regime" section (``doc``: report.build.Doc); a note instead where the splits cannot be rebuilt.
    ``reg``: :func:`regime_of`'s result where the caller has it already."""
    from hf_optbench.data.ngram import ORDERS

    doc.h(2, "Regime: final losses against n-gram reference losses")
    try:
        reg = reg or regime_of(an)
    except (OptBenchError, OSError, ValueError) as exc:
        doc.p(f"Reference losses not computed: {exc}.")
        return
    if reg is None:
        doc.p("No completed run with a final eval loss: no regime to show.")
        return
    trained = f"fitted on the training split ({reg.train_tokens:,} tokens), scored on the eval split"
    header, rows = ["reference", trained], [[ORDERS[k], f"{v:.4f}"] for k, v in sorted(reg.trained.items())]
    if reg.agree:
        header.append("eval split alone, leave-one-out")
        for row, (_, v) in zip(rows, sorted(reg.eval_only.items()), strict=True):
            row.append(f"{v:.4f}")
    doc.table(header, rows)
    saw = ""
    if reg.run_tokens is not None:
        low, high = reg.run_tokens
        passes = f": up to {high / reg.train_tokens:.3g} passes over it" if high > reg.train_tokens else ""
        saw = f" (the compared runs trained on {low:,.0f}{f' to {high:,.0f}' if high != low else ''} tokens{passes})"
    doc.p(f"What unigram, bigram and trigram tables achieve on the eval split the runs are scored on ({reg.eval_blocks} "
          f"blocks, {reg.eval_tokens:,} tokens, vocabulary {reg.vocab:,}): interpolated Kneser-Ney models fitted on "
          f"the training split the runs drew from{saw}, scored on exactly the predictions the eval loss scores (each "
          "token after a block's first, from the tokens before it in its block), as a language model is. "
          + ("The eval split's own references (Witten-Bell, leave-one-out) place every loss alike, so they stand beside. "
             if reg.agree else _which_and_why(reg) + " ")
          + f"A cell is {TRANSIENT} when {BASELINE} ends at or above the bigram reference: it has not yet learned what "
          "a table of token pairs knows, and its speedups measure the very start of training. hf_optbench/data/ngram.py "
          f"says why these estimators. {BASELINE} and every other optimizer, per size"
          f"{' and data ratio (tokens per parameter)' if an.multi else ''} (mean over seeds):")
    doc.table(reg.header, reg.rows)
    if reg.cells:
        doc.p(regime_line(reg))
    _gap_table(doc, an, reg)


def _gap_table(doc: Any, an: Any, reg: Regime) -> None:
    """The optimum's sentence and, where it is known, every optimizer's share of the unigram-to-optimum gap."""
    if reg.optimum is None:
        doc.p(f"The {OPTIMUM} column says not known: real text comes from no model whose loss can be computed, so it "
              "has no known optimum, and no share of the way to one is given.")
        return
    doc.p(f"The {OPTIMUM} column is what a perfect model scores on the same predictions: the synthetic source's exact "
          "cross-entropy on these eval blocks (its hidden-Markov model rebuilt from the runs' config.yaml, scored by "
          "the forward algorithm, Rabiner 1989). Below, each optimizer's share of the gap from the unigram reference "
          "to the optimum that it closed, 100 × (unigram − mean final eval loss) / (unigram − optimum): the nats "
          "between the two are all there is to learn beyond token frequencies, so the share says how far along that "
          "learnable structure each optimizer got (0 %: the unigram table; 100 %: the source itself):")
    rows = [[cell, *[f"{reg.closed[(cell, o)]:.1f} %" if (cell, o) in reg.closed else "–" for o in an.optimizers]]
            for cell in an.sizes]
    doc.table(["size", *[f"{o} (% of the gap)" for o in an.optimizers]], rows)


def regime_summary(an: Any) -> tuple[str, Regime | None]:
    """The regime table's one line (:func:`regime_line`: the baseline against the bigram reference
    fitted on the training split, the transient cells named) and the regime itself, computed once for both reports."""
    try:
        reg = regime_of(an)
    except (OptBenchError, OSError, ValueError) as exc:
        return f"Regime: not computed ({exc}).", None
    if reg is None:
        return "Regime: no completed run with a final eval loss.", None
    if not reg.cells:
        return f"Regime: no completed {BASELINE} run with a final eval loss.", reg
    return regime_line(reg) + " (evidence.md: the regime table).", reg
