"""The regime on the page (issue 29): the report rebuilds the eval split a run was scored on and sets every size's
final losses against its unigram, bigram and trigram reference losses."""

from __future__ import annotations

from pathlib import Path

import yaml

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.ngram import reference_losses
from hf_optbench.data.pipeline import prepare_data
from hf_optbench.report.analysis import Analysis
from hf_optbench.report.build import Doc
from hf_optbench.report.reference import reference_section, reference_table

DATA = {"data_source": "synthetic", "block_size": 16, "validation_blocks": 64, "synthetic_num_tokens": 16_000}


def _record(tmp_path: Path, opt: str, size: str, loss: float, data: dict | None = None) -> dict:
    d = tmp_path / f"{opt}__{size}"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({**(data or {}), "n_positions": 16}))
    return {"run_id": d.name, "run_dir": str(d), "optimizer": opt, "model_size": size, "seed": 0,
            "status": "completed", "final_eval_loss": loss}


def test_the_eval_split_s_references_beside_every_final_loss(tmp_path: Path) -> None:
    data = {**DATA, "data_cache_dir": str(tmp_path / "cache")}
    recs = [_record(tmp_path, "adamw", "tiny", 3.6, data), _record(tmp_path, "muon", "tiny", 2.6, data)]
    an = Analysis(records=recs, sizes=["tiny"], optimizers=["adamw", "muon"])
    refs, header, rows, split = reference_table(an)
    bundle = prepare_data(DataArguments(**data), n_positions=16)  # the very split the runs were scored on
    assert refs == reference_losses([list(b) for b in bundle.eval["input_ids"]], bundle.vocab_size)
    assert refs[1] > refs[2] and split == "64 eval blocks, 1,024 tokens, vocabulary 32"
    assert header == ["size", "adamw final eval loss (where)", "muon final eval loss (where)"]
    where = [cell.split("(")[1].rstrip(")") for cell in rows[0][1:]]
    expected = [("above unigram" if loss >= refs[1] else "unigram–bigram" if loss >= refs[2] else "bigram–trigram"
                 if loss >= refs[3] else "below trigram") for loss in (3.6, 2.6)]
    assert where == expected


def test_a_run_whose_data_cannot_be_rebuilt_gets_a_note(tmp_path: Path) -> None:
    doc = Doc()
    reference_section(doc, Analysis(records=[_record(tmp_path, "adamw", "tiny", 3.0)], sizes=["tiny"],
                                    optimizers=["adamw"]))
    text = doc.markdown(tmp_path)
    assert "Reference losses not computed:" in text and "does not state its data" in text
