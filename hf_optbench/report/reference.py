"""The regime on the page (issue 29): the eval split's own n-gram reference losses beside every size's final losses.

A speedup or a final loss says nothing about where the runs are in training until it is set against what simple
tables achieve on the same tokens: on the main job's synthetic source every compared run ended at or above what a
bigram table achieves, and on real Thai text AdamW sat on the unigram plateau while Muon escaped it, so the
"speedup" measured when each escaped. :mod:`hf_optbench.data.ngram` computes the references (leave-one-out
Witten-Bell tables, documented there) from the eval split the runs were scored on, which this module rebuilds from a
run's own config.yaml through the data cache (a cache hit: the split the runs used, byte for byte).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.report.analysis import Analysis
from hf_optbench.rundir import BASELINE
from hf_optbench.study.records import cell_of


def eval_blocks(rec: Mapping[str, Any]) -> tuple[list[list[int]], int]:
    """(the eval split's token blocks, the vocabulary size) of a run, rebuilt from its config.yaml's data arguments
    through the data cache."""
    from hf_optbench.config.data_args import DataArguments
    from hf_optbench.data.pipeline import prepare_data
    from hf_optbench.report.planned import run_config

    cfg = run_config(rec)
    if "data_source" not in cfg:  # a run's resolved config.yaml always states it
        raise OptBenchError(f"{rec.get('run_dir')}: its config.yaml does not state its data (data_source), so its "
                            "eval split cannot be rebuilt")
    names = {f.name for f in dataclasses.fields(DataArguments)}
    data_args = DataArguments(**{k: v for k, v in cfg.items() if k in names})
    bundle = prepare_data(data_args, n_positions=int(cfg.get("n_positions") or data_args.block_size))
    return [list(map(int, ids)) for ids in bundle.eval["input_ids"]], int(bundle.vocab_size)


def reference_table(an: Analysis) -> tuple[dict[int, float], list[str], list[list[str]], str]:
    """(reference losses {order: nats}, header, rows, the split described): per size (per size and data ratio, in a
    sweep with several: the regime of every cell), every optimizer's mean final eval loss and where it sits among the
    references."""
    from hf_optbench.data.ngram import reference_losses, regime

    ok = [r for r in an.ok() if r["status"] == "completed" and r.get("final_eval_loss") is not None]
    if not ok:
        return {}, [], [], ""
    blocks, vocab = eval_blocks(ok[0])
    refs = reference_losses(blocks, vocab)
    header = ["size", *[f"{o} final eval loss (where)" for o in an.optimizers]]
    rows = []
    for size in an.sizes:
        cells = []
        for opt in an.optimizers:
            vals = [float(r["final_eval_loss"]) for r in ok if r["optimizer"] == opt and cell_of(r) == size]
            cells.append(f"{statistics.fmean(vals):.4f} ({regime(statistics.fmean(vals), refs)})" if vals else "–")
        rows.append([size, *cells])
    tokens = sum(len(b) for b in blocks)
    split = f"{len(blocks)} eval blocks, {tokens:,} tokens, vocabulary {vocab}"
    return refs, header, rows, split


def reference_section(doc: Any, an: Analysis) -> None:
    """The report's "Regime" section (``doc``: report.build.Doc); a note instead where the split cannot be rebuilt."""
    from hf_optbench.data.ngram import ORDERS

    doc.h(2, "Regime: final losses against the eval split's n-gram reference losses")
    try:
        refs, header, rows, split = reference_table(an)
    except (OptBenchError, OSError, ValueError) as exc:
        doc.p(f"Reference losses not computed: {exc}.")
        return
    if not refs:
        doc.p("No completed run with a final eval loss: no regime to show.")
        return
    doc.table(["reference", "loss (nats / token)"], [[ORDERS[k], f"{v:.4f}"] for k, v in sorted(refs.items())])
    doc.p(f"What unigram, bigram and trigram tables achieve on the eval split the runs are scored on ({split}): each "
          "a Witten-Bell interpolated n-gram model of the split itself, scored leave-one-out (every prediction from "
          "counts without its own occurrence) on exactly the predictions the eval loss scores (each token after a "
          "block's first, from the tokens before it in its block); hf_optbench/data/ngram.py says why this estimator. "
          f"A run above the bigram reference has not yet learned what a table of token pairs knows: its speedup "
          f"measures the very start of training. {BASELINE} and every other optimizer, per size"
          f"{' and data ratio (tokens per parameter)' if an.multi else ''} (mean over seeds):")
    doc.table(header, rows)
