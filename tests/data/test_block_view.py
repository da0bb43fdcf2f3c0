"""The packed splits as tensors from their Arrow columns (hf_optbench.data.block_view): the batches the Trainer's
loader gives (one ready batch per fetch, passed through by the run's collator) are the ones default_data_collator
built from the lists, bit for bit and in the same order, and a run trains the same."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
from transformers import default_data_collator

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data.block_view import BlockView, ReadyBatch, block_view, ready_batches
from hf_optbench.data.pipeline import prepare_data


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> datasets.Dataset:
    """A real packed training split (synthetic source, memory-mapped from the data cache)."""
    args = DataArguments(data_source="synthetic", synthetic_num_tokens=20_000, block_size=32, validation_blocks=8,
                         data_cache_dir=str(tmp_path_factory.mktemp("cache")))
    return prepare_data(args, n_positions=32).train


def _lists(ds: datasets.Dataset, idx: list[int]) -> dict[str, torch.Tensor]:
    return default_data_collator([ds[i] for i in idx])  # what the loader gave before: lists, then tensors


@pytest.mark.parametrize("idx", [[0], [3, 1, 4, 1], [-1, 0, 7]])
def test_a_batch_is_the_collated_lists_bit_for_bit(split: datasets.Dataset, idx: list[int]) -> None:
    view = block_view(split)
    assert isinstance(view, BlockView) and len(view) == len(split)
    got, want = ready_batches(default_data_collator)(view.__getitems__(idx)), _lists(split, idx)
    assert set(got) == set(want) == {"input_ids", "labels"}
    for key in want:
        assert got[key].dtype == want[key].dtype == torch.int64 and torch.equal(got[key], want[key])
    assert torch.equal(view[idx[0]]["input_ids"], want["input_ids"][0])


def test_a_split_of_several_arrow_chunks_reads_each_block_from_its_chunk(split: datasets.Dataset) -> None:
    chunked = datasets.concatenate_datasets([split.select(range(5)).flatten_indices(),
                                             split.select(range(5, 12)).flatten_indices()])
    assert chunked.data.table.column("input_ids").num_chunks == 2
    view = block_view(chunked)
    assert isinstance(view, BlockView)
    idx = [11, 0, 5, 4, 6]
    got, want = view.__getitems__(idx)[0].tensors, _lists(chunked, idx)
    assert all(torch.equal(got[key], want[key]) for key in want)
    with pytest.raises(IndexError):
        view.__getitems__([12])
    with pytest.raises(IndexError):
        view.__getitems__([-13])
    assert torch.equal(view[-12]["input_ids"], want["input_ids"][1])  # block 0, counted from the end


def test_the_collator_passes_a_ready_batch_through_and_collates_examples(split: datasets.Dataset) -> None:
    collate = ready_batches(default_data_collator)
    batch = block_view(split).__getitems__([2, 5])
    assert collate(batch) is batch[0].tensors  # no copy, no stack
    examples = [{"input_ids": torch.arange(4), "labels": torch.arange(4)} for _ in range(3)]
    assert all(torch.equal(collate(examples)[k], default_data_collator(examples)[k]) for k in ("input_ids", "labels"))
    assert ready_batches(collate) is collate
    with pytest.raises((TypeError, AttributeError, KeyError)):  # a collator that does not know it refuses it
        default_data_collator([ReadyBatch({"input_ids": torch.zeros(2, 4)})])


def test_the_trainers_loader_gives_the_batches_of_the_lists_in_their_order(split: datasets.Dataset,
                                                                           tmp_path: Path) -> None:
    """Through the Trainer's own loader (its sampler, its column filter, accelerate's wrapper): every batch of an
    epoch equal to the one the split's lists and default_data_collator give, in the same order."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64, n_positions=32))

    def batches(dataset: object, collator: object) -> list[dict[str, torch.Tensor]]:
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True,
                                 report_to="none", dataloader_drop_last=True, seed=3)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
        return list(trainer.get_train_dataloader())

    got = batches(block_view(split), ready_batches(default_data_collator))
    want = batches(split, default_data_collator)
    assert len(got) == len(want) == len(split) // 4
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w) == {"input_ids", "labels"}
        assert all(g[k].dtype == torch.int64 and torch.equal(g[k], w[k]) for k in w)


def test_what_is_not_a_plain_packed_split_passes_through(split: datasets.Dataset) -> None:
    for other in (split.select([2, 0]), split.with_format("torch"), split.add_column("x", [0] * len(split)),
                  split.select([])):
        assert block_view(other) is other
    assert block_view(None) is None
    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]], "labels": [[1, 2], [3]]})
    assert block_view(ragged) is ragged


@pytest.mark.slow  # two runs (~10 s)
def test_a_run_trains_the_same_with_and_without_the_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's loss and grad norm, and the eval and tuning losses, identical to the lists' path."""
    from hf_optbench.data import block_view as module
    from hf_optbench.run.train import main

    argv = ["recipes/quickstart_cpu.yaml", "--data_source", "synthetic", "--block_size", "64", "--max_steps", "12",
            "--eval_steps", "6", "--tuning_blocks", "8", "--validation_blocks", "8", "--save_strategy", "no",
            "--save_final_model", "false", "--write_model_card", "false", "--logging_steps", "4",
            "--data_cache_dir", str(tmp_path / "cache")]
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    assert main([*argv, "--output_dir", str(tmp_path / "view")]) == 0
    monkeypatch.setattr(module, "block_view", lambda ds: ds)
    assert main([*argv, "--output_dir", str(tmp_path / "lists")]) == 0

    def record(name: str) -> tuple[list, dict]:
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        keep = [{k: r.get(k) for k in ("kind", "step", "loss", "grad_norm", "eval_loss")} for r in rows]
        return keep, {k: summary[k] for k in ("final_train_loss", "final_eval_loss", "final_tuning_loss")}

    assert record("view") == record("lists")
