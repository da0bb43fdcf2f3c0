"""The Python API's record says where each value came from by how the optimizer was made, never by what the value
equals: hf_optbench's builder records its sources as it builds (the caller's, the citation, auto with its reason);
an optimizer the Trainer built from TrainingArguments names their fields; any other optimizer is the caller's."""

from __future__ import annotations

from hf_optbench.optim.held import OUTSIDE_SOURCE, held_record
from hf_optbench.optim.registry import CALLER_SOURCE, build_optimizer, built_sources

from fixtures.models import tiny_model


def _sources(record: dict) -> dict[str, str]:
    return {k: v["source"] for k, v in record["hyperparameters"].items()}


def test_muon_through_the_api_records_auto_with_its_reason_and_cites_what_it_did_not_get() -> None:
    model = tiny_model()
    sources = _sources(held_record(build_optimizer("muon", model, model_size="tiny"), model=model))
    assert sources["ns_precision"].startswith("auto: "), sources["ns_precision"]
    assert sources["learning_rate"] != CALLER_SOURCE and sources["learning_rate"]  # the citation
    given = _sources(held_record(build_optimizer("muon", model, model_size="tiny", lr=1e-3,
                                                 ns_precision="fp32"), model=model))
    assert given["learning_rate"] == CALLER_SOURCE and given["ns_precision"] == CALLER_SOURCE


def test_a_value_equal_to_the_citation_but_given_by_the_caller_is_the_caller_s() -> None:
    from hf_optbench.optim.registry import optimizer_defaults

    model = tiny_model()
    cited = optimizer_defaults("adamw", "tiny")["learning_rate"]
    sources = _sources(held_record(build_optimizer("adamw", model, model_size="tiny", lr=cited), model=model))
    assert sources["learning_rate"] == CALLER_SOURCE


def test_the_trainer_s_own_adamw_names_the_training_arguments_never_a_citation(tmp_path) -> None:
    from transformers import Trainer, TrainingArguments

    model = tiny_model()
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, report_to=[], use_cpu=True)
    optimizer = Trainer(model=model, args=args).create_optimizer()  # what train() builds
    assert built_sources(optimizer) is None
    sources = _sources(held_record(optimizer, model=model, args=args))
    assert sources["learning_rate"] == "TrainingArguments learning_rate (set by the caller)"
    assert sources["eps"] == "TrainingArguments adam_epsilon (transformers' default)"
    assert not any("nanoGPT" in s for s in sources.values()), sources


def test_an_optimizer_the_caller_made_is_the_caller_s() -> None:
    import torch

    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))  # nanoGPT's values, by hand
    assert set(_sources(held_record(optimizer, model=model)).values()) == {OUTSIDE_SOURCE}
