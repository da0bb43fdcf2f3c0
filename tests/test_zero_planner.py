"""The memory planner under DeepSpeed ZeRO-2 equals what two CPU ranks really hold, per rank.

One ``accelerate launch --config_file accelerate_configs/cpu_zero2.yaml`` runs this file as a worker: for each
registry optimizer in turn it builds a tiny GPT-2 and the optimizer, hands both to Accelerate (which wraps them
in DeepSpeed's ZeRO-2 engine, as Trainer does), takes two steps and writes what each rank measured with
``state_bytes.optimizer_state_bytes`` (the memory probe's function) plus the implementation string. The test
then compares each rank's figures with ``plan_memory(..., zero_stage=2, world_size=2)``. Optimizers that
``check_zero_compatible`` refuses run too, to show the reason for refusing holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIZE, VOCAB, N_POSITIONS, SEQ = "tiny", 512, 64, 16


def _registry() -> tuple[list[str], list[str]]:
    """(optimizers that run under ZeRO on CPU, the ones check_zero_compatible refuses)."""
    from hf_optbench.optim.registry import OPTIMIZERS

    cpu = [n for n, s in OPTIMIZERS.items() if not s.requires_cuda]
    return [n for n in cpu if not OPTIMIZERS[n].zero_incompatible], [n for n in cpu if OPTIMIZERS[n].zero_incompatible]


def _worker(out_dir: str, names: list[str]) -> None:
    """Runs on each rank under accelerate launch; writes rank<r>.json."""
    import torch
    from accelerate import Accelerator

    from hf_optbench.measure.state_bytes import optimizer_state_bytes
    from hf_optbench.models import build_model
    from hf_optbench.optim.registry import build_optimizer, describe_optimizer

    acc = Accelerator()
    ds_config = acc.state.deepspeed_plugin.deepspeed_config  # what Trainer fills from its batch arguments
    # on CPU Accelerate reports one process under DeepSpeed (measured: num_processes 1, process_index 0 on both
    # ranks), so the ranks come from torch.distributed
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    ds_config.update(train_micro_batch_size_per_gpu=2, train_batch_size=2 * world)
    results: dict[str, dict] = {}
    for name in names:
        try:
            torch.manual_seed(0)
            model = build_model(SIZE, VOCAB, n_positions=N_POSITIONS)
            opt = build_optimizer(name, model, model_size=SIZE)
            engine, wrapped = acc.prepare(model, opt)
            if callable(getattr(opt, "train", None)):
                opt.train()  # schedule-free steps only in train mode
            x = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(rank))
            for _ in range(2):
                acc.backward(engine(input_ids=x, labels=x).loss)
                wrapped.step()
                wrapped.zero_grad()
            measured = optimizer_state_bytes(wrapped, list(acc.unwrap_model(engine).parameters()))
            results[name] = {"state": measured.total, "master": measured.master_bytes,
                             "by_name": measured.by_name, "by_dtype": measured.by_dtype,
                             "impl": describe_optimizer(wrapped, model=model)}
        except Exception as exc:  # noqa: BLE001 - recorded for the test to judge (Muon's failure is expected)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        acc.free_memory()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results), encoding="utf-8")
    acc.wait_for_everyone()


@pytest.fixture(scope="module")
def zero2_ranks(tmp_path_factory) -> list[dict[str, dict]]:
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("zero2_planner")
    runs, refused = _registry()
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", "accelerate_configs/cpu_zero2.yaml", __file__, str(out),
           ",".join(runs + refused)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    # the files exist once both processes have exited: nothing is still writing them
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize("name", _registry()[0])
def test_planned_equals_measured_per_rank_under_zero2(zero2_ranks: list[dict[str, dict]], name: str) -> None:
    from hf_optbench.measure.planner import plan_memory

    plan = plan_memory(SIZE, name, precision="fp32", zero_stage=2, world_size=2, vocab_size=VOCAB,
                       n_positions=N_POSITIONS, block_size=SEQ)
    for rank, results in enumerate(zero2_ranks):
        got = results[name]
        assert "error" not in got, f"rank {rank}: {got}"
        assert (got["state"], got["master"]) == (plan.optimizer_state_bytes, plan.master_weight_bytes), \
            (rank, got, plan.notes)
        assert "ZeRO flat partitions" in got["impl"], got["impl"]
    print(f"\n{name}: planned = measured = {plan.optimizer_state_bytes:,} B state + {plan.master_weight_bytes:,} B "
          f"fp32 master per rank; {zero2_ranks[0][name]['impl']}")


def test_8bit_under_zero_does_not_claim_fp32_embedding_state(zero2_ranks: list[dict[str, dict]]) -> None:
    for name in ("adamw_8bit", "lion_8bit"):
        impl = zero2_ranks[0][name]["impl"]
        assert "embedding fp32" not in impl and "no fp32 embedding state" in impl, impl
    assert "second moment factored on 0 of 2 tensors" in zero2_ranks[0]["adafactor"]["impl"]


def test_refused_optimizers_really_cannot_run_flattened(zero2_ranks: list[dict[str, dict]]) -> None:
    """The measured reasons behind check_zero_compatible's refusals of Muon and SOAP."""
    for results in zero2_ranks:
        assert "Param gradient must be a 2D matrix" in results["muon"]["error"]
        assert set(results["soap"]["by_name"]) == {"exp_avg", "exp_avg_sq"}  # no Shampoo preconditioner


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2].split(","))
