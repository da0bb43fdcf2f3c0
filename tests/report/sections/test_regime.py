"""The regime on the page (issues 29, 44): the report rebuilds the splits a run drew from and was scored on, sets
every cell's final losses against n-gram references fitted on the training split, names a cell "transient" where the
baseline ends at or above the bigram, and keeps the eval split's own leave-one-out references beside them only where
the two place every loss alike; where they do not (a real vocabulary: the bundled Thai sample with its 1,835-token
tokenizer), it says which it used and why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.ngram import reference_losses, regime, trained_reference_losses
from hf_optbench.data.pipeline import prepare_data
from hf_optbench.data.synthetic import HMMSource
from hf_optbench.report.analysis import Analysis
from hf_optbench.report.build import Doc
from hf_optbench.report.sections.regime import (
    OPTIMUM,
    PAST,
    TRANSIENT,
    gap_closed,
    reference_section,
    regime_line,
    regime_of,
)
from hf_optbench.study.records import RunRecord

SYNTHETIC = {"data_source": "synthetic", "block_size": 16, "validation_blocks": 64, "synthetic_num_tokens": 16_000}
# the CPU sweeps' source S1: sharper graph rows and 8 document topics
S1 = {**SYNTHETIC, "synthetic_alpha_x": 0.02, "synthetic_topics": 8, "synthetic_topic_weight": 0.5}
THAI = {"data_source": "thai_sample", "tokenizer_name": "builtin:thai-bpe-2k", "block_size": 64,
        "validation_fraction": 0.1}


def _record(tmp_path: Path, opt: str, size: str, loss: float, data: dict | None = None) -> RunRecord:
    d = tmp_path / f"{opt}__{size}"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({**(data or {}), "n_positions": 64}))
    return RunRecord(d.name, str(d), optimizer=opt, model_size=size, seed=0, status="completed",
                     figures={"final_eval_loss": loss})


def _analysis(tmp_path: Path, data: dict, losses: dict[tuple[str, str], float]) -> Analysis:
    tmp_path.mkdir(parents=True, exist_ok=True)
    recs = [_record(tmp_path, opt, size, loss, data) for (opt, size), loss in losses.items()]
    sizes = list(dict.fromkeys(size for _, size in losses))
    return Analysis(records=recs, sizes=sizes, optimizers=list(dict.fromkeys(opt for opt, _ in losses)))


def _splits(data: dict) -> tuple[np.ndarray, np.ndarray, int]:
    bundle = prepare_data(DataArguments(**data), n_positions=64)  # the very splits the runs used
    return (np.asarray(bundle.eval["input_ids"]), np.asarray(bundle.train["input_ids"]), bundle.vocab_size)


def _markdown(an: Analysis, tmp_path: Path) -> str:
    doc = Doc()
    reference_section(doc, an)
    return doc.markdown(tmp_path)


def test_references_fitted_on_the_training_split_and_the_transient_named(tmp_path: Path) -> None:
    data = {**SYNTHETIC, "data_cache_dir": str(tmp_path / "cache")}
    an = _analysis(tmp_path, data, {("adamw", "tiny"): 3.6, ("muon", "tiny"): 2.6, ("adamw", "mini"): 1.0})
    reg = regime_of(an)
    eval_blocks, train, vocab = _splits(data)
    assert reg.trained == trained_reference_losses(train, eval_blocks, vocab)
    assert reg.eval_only == reference_losses(eval_blocks, vocab)
    assert (reg.train_tokens, reg.eval_tokens, reg.vocab) == (train.size, 1_024, 32)
    assert reg.header == ["size", "adamw final eval loss (where)", "muon final eval loss (where)", OPTIMUM, "regime"]
    where = [cell.split("(")[1].rstrip(")") for cell in reg.rows[0][1:3]]
    assert where == [regime(3.6, reg.trained), regime(2.6, reg.trained)]
    # the baseline at or above the trained bigram: transient; far below it: past the bigram
    assert 3.6 >= reg.trained[2] > 1.0
    assert reg.cells == {"tiny": TRANSIENT, "mini": PAST} and [r[-1] for r in reg.rows] == [TRANSIENT, PAST]
    assert regime_line(reg).endswith(f"in 1 of 2 cells; {TRANSIENT} (at or above it): tiny.")
    # the eval split alone places these losses alike (32 tokens: a small vocabulary), so it stands beside
    assert reg.agree and all(regime(x, reg.eval_only) == regime(x, reg.trained) for x in (3.6, 2.6, 1.0))
    text = _markdown(an, tmp_path)
    assert "| eval split alone, leave-one-out |" in text and "place every loss alike" in text
    assert f"\n\n{regime_line(reg)}\n\n" in text


def test_on_a_real_vocabulary_the_report_says_which_references_it_used_and_why(tmp_path: Path) -> None:
    """The bundled Thai sample with its 1,835-token tokenizer: the eval split alone starves. Where a loss lands in
    different places by the two estimates, the eval-only references are left out and the report says why; where
    every loss lands alike, they stand beside."""
    data = {**THAI, "data_cache_dir": str(tmp_path / "cache")}
    eval_blocks, train, vocab = _splits(data)
    assert vocab > 1_000
    trained, alone = trained_reference_losses(train, eval_blocks, vocab), reference_losses(eval_blocks, vocab)
    grid = np.linspace(min(*trained.values(), *alone.values()) - 0.1, max(*trained.values(), *alone.values()) + 0.1,
                       400)
    differ = next(float(x) for x in grid if regime(float(x), trained) != regime(float(x), alone))
    an = _analysis(tmp_path / "a", data, {("adamw", "tiny"): differ, ("muon", "tiny"): 1.0})
    reg = regime_of(an)
    assert not reg.agree and len(reg.disagree) == 1 and reg.disagree[0].startswith("adamw at tiny")
    text = _markdown(an, tmp_path)
    assert "eval split alone, leave-one-out |" not in text  # not kept beside where it disagrees
    assert f"places 1 of the mean losses otherwise ({reg.disagree[0]})" in text
    assert f"with {reg.eval_tokens:,} eval tokens for a vocabulary of {vocab:,}" in text
    assert f"The table uses the references fitted on {train.size:,} training tokens" in text
    assert f"{differ:.4f} ({regime(differ, trained)})" in text  # the cell reads the trained references
    same = _analysis(tmp_path / "b", data, {("adamw", "tiny"): 0.5, ("muon", "tiny"): 0.4})
    assert regime_of(same).agree and "| eval split alone, leave-one-out |" in _markdown(same, tmp_path)
    # real text has no known optimum: the column says so, and no share of a gap to it is given
    assert reg.optimum is None and reg.closed == {} and [r[-2] for r in reg.rows] == ["not known"]
    assert f"The {OPTIMUM} column says not known" in text and "% of the gap" not in text


@pytest.mark.parametrize("data", [SYNTHETIC, S1], ids=["default graph", "S1"])
def test_the_optimum_is_the_source_s_own_loss_on_the_eval_blocks(tmp_path: Path, data: dict) -> None:
    """On synthetic data the table's optimum is the source's exact loss on the very eval blocks the runs were scored
    on, and it lies below the trigram reference: a perfect model knows more than any table of token triples."""
    data = {**data, "data_cache_dir": str(tmp_path / "cache")}
    reg = regime_of(_analysis(tmp_path, data, {("adamw", "tiny"): 3.0}))
    eval_blocks, _, _ = _splits(data)
    assert reg.optimum == HMMSource.from_data_args(DataArguments(**data)).optimal_loss(eval_blocks)
    assert reg.rows[0][-2] == f"{reg.optimum:.4f}"
    assert 0.0 < reg.optimum < reg.trained[3] < reg.trained[2] < reg.trained[1]


def test_the_share_of_the_gap_closed(tmp_path: Path) -> None:
    """(unigram - loss) / (unigram - optimum) as a percentage, by hand and in the report's table."""
    assert gap_closed(3.0, 2.5, 2.0) == 50.0  # half of the 1-nat gap
    assert gap_closed(3.0, 3.5, 2.0) == -50.0  # above the unigram: a negative share
    assert gap_closed(2.0, 1.5, 2.0) is None  # no gap to close
    data = {**SYNTHETIC, "data_cache_dir": str(tmp_path / "cache")}
    first = regime_of(_analysis(tmp_path / "a", data, {("adamw", "tiny"): 3.0}))
    unigram, optimum = first.trained[1], first.optimum
    # losses a quarter and three quarters of the way from the unigram reference to the optimum
    losses = {("adamw", "tiny"): unigram - 0.25 * (unigram - optimum), ("muon", "tiny"): optimum + 0.25 * (unigram - optimum),
              ("adamw", "mini"): unigram + 0.1}
    an = _analysis(tmp_path / "b", data, losses)
    reg = regime_of(an)
    assert reg.closed == pytest.approx({("tiny", "adamw"): 25.0, ("tiny", "muon"): 75.0,
                                        ("mini", "adamw"): -100 * 0.1 / (unigram - optimum)})
    text = _markdown(an, tmp_path)
    table = text.split("learnable structure each optimizer got")[1]
    assert "| size | adamw (% of the gap) | muon (% of the gap) |" in table
    assert "| tiny | 25.0 % | 75.0 % |" in table and f"| mini | {reg.closed[('mini', 'adamw')]:.1f} % | – |" in table


def test_a_run_whose_data_cannot_be_rebuilt_gets_a_note(tmp_path: Path) -> None:
    doc = Doc()
    reference_section(doc, Analysis(records=[_record(tmp_path, "adamw", "tiny", 3.0)], sizes=["tiny"],
                                    optimizers=["adamw"]))
    text = doc.markdown(tmp_path)
    assert "Reference losses not computed:" in text and "does not state its data" in text


@pytest.mark.slow  # load_sweep counts each size's parameters for the budget: ~10 s on 2 shared cores
def test_the_thai_regime_sweep_runs_the_main_job_s_shape_on_the_bundled_sample() -> None:
    """benchmarks/thai_regime.yaml (the regime table on a real vocabulary) still loads: the
    bundled Thai sample with the 1,835-token tokenizer, adamw and muon at tiny, 1 token per parameter, 3 paired
    seeds, tuned on held-out documents."""
    from hf_optbench.study.sweep_spec import load_sweep

    spec = load_sweep(Path(__file__).resolve().parents[3] / "benchmarks" / "thai_regime.yaml")
    base = yaml.safe_load(spec.base.read_text())
    assert (base["data_source"], base["tokenizer_name"]) == ("thai_sample", THAI["tokenizer_name"])
    assert {(r.optimizer, r.model_size) for r in spec.runs} == {("adamw", "tiny"), ("muon", "tiny")}
    assert len({r.seed for r in spec.runs}) == 3 and spec.overrides["tuning_blocks"] > 0
    assert spec.budget is not None and spec.tune is not None
