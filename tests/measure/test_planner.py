"""The memory planner: its optimizer-state figure equals the measured storage bytes of the optimizers the registry
builds (every CPU-runnable one, CPU sizes), its shapes equal the model's, and its ZeRO/precision arithmetic."""

from __future__ import annotations

import json

import pytest
import torch

from hf_optbench.cli.memory import main as cli_main
from hf_optbench.errors import OptBenchError
from hf_optbench.measure.planner import (
    GPUS,
    ParamShape,
    activation_bytes,
    fit,
    gpt2_param_shapes,
    plan_memory,
    planned_optimizer_state_bytes,
    state_layout,
)
from hf_optbench.measure.planner_zero import zero_partitions
from hf_optbench.measure.state_bytes import optimizer_state_bytes as measured_state_bytes
from hf_optbench.models import GPT2_SIZES, build_model, count_parameters
from hf_optbench.optim.registry import OPTIMIZERS, build_optimizer

CPU_OPTIMIZERS = [name for name, spec in OPTIMIZERS.items() if not spec.requires_cuda]
VOCAB = 50_266  # the Thai tokenizer's length: build_model pads the embedding to 50,304


def _measure(name: str, size: str, n_positions: int = 64, **kwargs: object) -> tuple[int, torch.nn.Module]:
    torch.manual_seed(0)
    model = build_model(size, VOCAB, n_positions=n_positions)
    opt = build_optimizer(name, model, model_size=size, **kwargs)
    if callable(getattr(opt, "train", None)):
        opt.train()  # schedule-free optimizers step only in train mode
    x = torch.randint(0, VOCAB, (2, 16))
    for _ in range(2):  # SOAP builds its eigenbases on the first step, so measure after the second
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return measured_state_bytes(opt, model.parameters()).total, model


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_planner_equals_measured_state(name: str) -> None:
    measured, model = _measure(name, "tiny")
    shapes = gpt2_param_shapes("tiny", model.get_input_embeddings().num_embeddings, 64)
    assert planned_optimizer_state_bytes(name, shapes) == measured


@pytest.mark.slow
@pytest.mark.parametrize("size", ["mini", "midi"])
@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_planner_equals_measured_state_larger_cpu_sizes(name: str, size: str) -> None:
    measured, _ = _measure(name, size, n_positions=128)
    assert planned_optimizer_state_bytes(name, gpt2_param_shapes(size, 50_304, 128)) == measured


@pytest.mark.parametrize("name", ["adamw_8bit", "lion_8bit"])
def test_planner_8bit_embedding_state(name: str) -> None:
    measured, _ = _measure(name, "tiny", embedding_state_32bit=False)
    shapes = gpt2_param_shapes("tiny", 50_304, 64)
    assert planned_optimizer_state_bytes(name, shapes, embedding_state_32bit=False) == measured
    assert planned_optimizer_state_bytes(name, shapes, embedding_state_32bit=True) > 3 * measured


def test_every_registry_optimizer_has_a_formula() -> None:
    for name, spec in OPTIMIZERS.items():
        assert state_layout(name) is spec.layout
    assert state_layout("adamw_torch") is OPTIMIZERS["adamw"].layout  # the registry's aliases
    with pytest.raises(OptBenchError, match="no state formula.*adamw"):
        state_layout("torch.optim.RAdam")


@pytest.mark.parametrize("size", list(GPT2_SIZES))
def test_shapes_equal_the_model(size: str) -> None:
    with torch.device("meta"):  # gpt2-xl's shapes without its 6 GB
        model = build_model(size, 50_304, n_positions=1024, pad_vocab_to_multiple_of=1)
    shapes = gpt2_param_shapes(size, 50_304, 1024)
    assert [(p.name, p.shape) for p in shapes] == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert sum(p.numel for p in shapes) == count_parameters(model)


def test_zero_and_precision_arithmetic() -> None:
    ddp = plan_memory("gpt2", "adamw", precision="bf16", zero_stage=0, world_size=4)
    n = ddp.num_params
    assert n == 124_475_904  # GPT-2 small with the 50,304-row embedding (nanoGPT's 124M)
    assert (ddp.param_bytes, ddp.grad_bytes, ddp.master_weight_bytes) == (4 * n, 4 * n, 0)  # autocast: fp32 weights
    assert ddp.optimizer_state_bytes == ddp.optimizer_state_bytes_total == 8 * n + 4 * 148
    z1 = plan_memory("gpt2", "adamw", precision="bf16", zero_stage=1, world_size=4)
    assert (z1.param_bytes, z1.grad_bytes) == (2 * n, 2 * n)  # ZeRO's 2 + 2 + K (Rajbhandari et al. 2020)
    # both param groups' sizes are multiples of 2 x 4 (no alignment padding): a quarter of each per rank; AdamW
    # keeps one fp32 step tensor per flat partition (2 per rank), not one per model tensor
    assert z1.master_weight_bytes == 4 * n // 4 and z1.optimizer_state_bytes == 8 * n // 4 + 4 * 2
    assert z1.optimizer_state_bytes_total == 4 * z1.optimizer_state_bytes
    z2 = plan_memory("gpt2", "adamw", precision="bf16", zero_stage=2, world_size=4)
    assert z2.grad_bytes == 2 * n // 4 and z2.param_bytes == 2 * n
    z3 = plan_memory("gpt2", "adamw", precision="bf16", zero_stage=3, world_size=4)
    assert z3.param_bytes == 2 * n // 4
    fp32 = plan_memory("gpt2", "lion", precision="fp32", zero_stage=3, world_size=2)
    # DeepSpeed clones an fp32 master partition even when the weights are fp32
    assert fp32.master_weight_bytes == 4 * n // 2 and fp32.param_bytes == 2 * n
    pure = plan_memory("gpt2", "lion", precision="bf16-pure")
    assert pure.optimizer_state_bytes == 2 * n and pure.param_bytes == 2 * n
    assert ddp.total_bytes == sum((ddp.param_bytes, ddp.grad_bytes, ddp.master_weight_bytes,
                                   ddp.optimizer_state_bytes, ddp.activation_bytes))


def test_zero_partitions_follow_deepspeeds_flattening() -> None:
    """Stages 1-2 pad each param group to a multiple of 2 x world and split it evenly; stage 3 splits each tensor
    into ceil(numel / world) elements and closes a sub-group once it reaches sub_group_size."""
    shapes = [ParamShape("w", (3, 5)), ParamShape("v", (7, 2)), ParamShape("b", (5,))]  # groups: 29 and 5
    assert [p.numel for p in zero_partitions(shapes, 3, 2)] == [30 // 3, 6 // 3]  # 29 -> 30, 5 -> 6
    assert [p.numel for p in zero_partitions(shapes, 3, 3)] == [5 + 5, 2]
    assert [p.numel for p in zero_partitions(shapes, 3, 3, sub_group_size=4)] == [5, 5, 2]
    assert all(p.shape == (p.numel,) and not p.is_embedding for p in zero_partitions(shapes, 3, 1))


def test_zero_state_is_the_layout_on_flat_partitions() -> None:
    """Adafactor loses its factorisation and 8-bit its fp32 embedding state under ZeRO (measured on two ranks in
    tests/test_zero_planner.py); the planner says so and refuses what cannot run flattened."""
    plain = plan_memory("gpt2", "adafactor", precision="bf16")
    zero = plan_memory("gpt2", "adafactor", precision="bf16", zero_stage=2, world_size=4)
    assert zero.optimizer_state_bytes == zero.master_weight_bytes + 4 * 2  # full second moment + RMS per partition
    assert zero.optimizer_state_bytes_total > 100 * plain.optimizer_state_bytes_total
    assert any("factored moments" in note for note in zero.notes)
    b8 = plan_memory("gpt2", "adamw_8bit", precision="bf16", zero_stage=2, world_size=4)
    assert b8.optimizer_state_bytes < plan_memory("gpt2", "adamw_8bit", precision="bf16").optimizer_state_bytes / 4
    with pytest.raises(OptBenchError, match="'muon' cannot run under DeepSpeed ZeRO-2"):
        plan_memory("gpt2", "muon", zero_stage=2, world_size=2)
    with pytest.raises(OptBenchError, match="bf16-pure"):
        plan_memory("gpt2", "adamw", precision="bf16-pure", zero_stage=1, world_size=2)


def test_activation_estimate_follows_korthikanti() -> None:
    # tiny: L=2, h=64, a=2; s=128, b=4, vocab 50,304. Eager attention, 16-bit activations, no dropout:
    # per layer 32sbh + 2as^2b (Korthikanti et al. 2022 eq. 1 without the dropout masks); + final LN 4sbh;
    # + logits (2 + 4 + 4) s b V.
    s, b, h, a, L, V = 128, 4, 64, 2, 2, 50_304
    expected = L * (32 * s * b * h + 2 * a * s * s * b) + 4 * s * b * h + 10 * s * b * V
    got = activation_bytes("tiny", micro_batch_size=b, block_size=s, vocab_size=V, precision="bf16",
                           attn_implementation="eager")
    assert got == expected
    sdpa = activation_bytes("tiny", micro_batch_size=b, block_size=s, vocab_size=V, precision="bf16")
    assert sdpa == L * (32 * s * b * h + 4 * a * s * b) + 4 * s * b * h + 10 * s * b * V
    ckpt = activation_bytes("tiny", micro_batch_size=b, block_size=s, vocab_size=V, gradient_checkpointing=True)
    assert ckpt < sdpa
    fp32 = activation_bytes("tiny", micro_batch_size=b, block_size=s, vocab_size=V, precision="fp32")
    assert fp32 == L * (64 * s * b * h + 4 * a * s * b) + 8 * s * b * h + 8 * s * b * V


def test_fit_rule() -> None:
    cap = GPUS["A100 40GB"]
    assert fit(int(0.89 * cap), cap) == "yes" and fit(int(0.95 * cap), cap) == "tight" and fit(cap + 1, cap) == "no"
    xl = plan_memory("gpt2-xl", "adamw", precision="bf16", micro_batch_size=8, block_size=1024)
    assert xl.fits["T4 16GB"] == "no"
    tiny = plan_memory("tiny", "adamw", micro_batch_size=1, block_size=128)
    assert set(tiny.fits.values()) == {"yes"}


def test_bad_input() -> None:
    with pytest.raises(OptBenchError, match="model_size"):
        plan_memory("gpt5", "adamw")
    with pytest.raises(OptBenchError, match="precision"):
        plan_memory("gpt2", "adamw", precision="int4")
    with pytest.raises(OptBenchError, match="world_size"):
        plan_memory("gpt2", "adamw", world_size=0)
    with pytest.raises(OptBenchError, match="n_positions"):
        plan_memory("gpt2", "adamw", block_size=2048, n_positions=1024)


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "gpt2-xl", "--optimizer", "lion", "--precision", "bf16", "--zero-stage", "2",
            "--world-size", "4", "--micro-batch-size", "8", "--block-size", "1024"]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "optimizer state" in text and "H100 80GB" in text and "T4 16GB" in text
    assert cli_main(argv + ["--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["num_params"] == 1_557_686_400 and plan["zero_stage"] == 2
    assert plan["optimizer_state_bytes"] == plan["optimizer_state_bytes_total"] // 4
    assert plan["optimizer_state_bytes_total"] == 4 * plan["num_params"]  # Lion: one fp32 moment (no padding here)
