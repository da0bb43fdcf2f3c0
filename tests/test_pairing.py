"""Runs with the same seed are pairs: whatever the optimizer, they start from the same initial weights and train on
the same batches in the same order, so the report may compare them seed by seed (paired statistics).

Checked through the code path a run takes (``hf_optbench.run.main``): the weights as ``prepare`` built them, and
the ``input_ids`` of every training micro-batch as the Trainer fed them to ``compute_loss``. A run with another
seed must differ in both, or the comparison could not fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Trainer

from hf_optbench.run import train as run_mod

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
STEPS = 4
ARGS = ["--max_steps", str(STEPS), "--per_device_train_batch_size", "4", "--block_size", "32", "--eval_strategy",
        "no", "--save_strategy", "no", "--write_model_card", "false"]


def _observe(monkeypatch, tmp_path: Path, optimizer: str, seed: int) -> dict:
    """Run one tiny run; return its initial weights and the training batches it saw, in order."""
    seen: dict = {"batches": []}
    real_prepare = run_mod.prepare
    real_compute_loss = Trainer.compute_loss

    def prepare(cfg):
        prepared = real_prepare(cfg)
        seen["init"] = {k: v.detach().clone() for k, v in prepared.model.state_dict().items()}
        return prepared

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            seen["batches"].append(inputs["input_ids"].detach().cpu().clone())
        return real_compute_loss(self, model, inputs, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(run_mod, "prepare", prepare)
        m.setattr(Trainer, "compute_loss", compute_loss)  # the run's Trainer (or a subclass) calls it per batch
        out = tmp_path / f"{optimizer}_s{seed}"
        assert run_mod.main([QUICK, "--output_dir", str(out), "--optimizer", optimizer, "--seed", str(seed),
                             *ARGS]) == 0
    return seen


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict:
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("pairing")
    try:
        return {key: _observe(mp, tmp, opt, seed) for key, opt, seed in
                (("adamw0", "adamw", 0), ("lion0", "lion", 0), ("adamw1", "adamw", 1))}
    finally:
        mp.undo()


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_same_initial_weights_whatever_the_optimizer(observed: dict) -> None:
    assert _same_weights(observed["adamw0"]["init"], observed["lion0"]["init"])
    assert not _same_weights(observed["adamw0"]["init"], observed["adamw1"]["init"])  # the check can fail


def test_same_seed_same_batches_in_the_same_order(observed: dict) -> None:
    a, b, other = (observed[k]["batches"] for k in ("adamw0", "lion0", "adamw1"))
    assert len(a) == len(b) == STEPS
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, other, strict=True))  # another seed, another order
