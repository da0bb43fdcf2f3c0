"""metrics.py: real storage bytes of optimizer states (exact analytic counts), FLOPs, device peaks, spike rule,
targets and AUC. Tiny models, CPU only."""

from __future__ import annotations

import math
import os
import socket
import statistics

import pytest
import torch

from hf_optbench.measure import flops as FL
from hf_optbench.measure import metrics as M
from hf_optbench.measure import state_bytes as SB
from hf_optbench.optim.unwrap import optimizer_chain


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _one_step(model, optimizer) -> list[torch.Tensor]:
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return [p for p in model.parameters()]  # unique: tied wte/lm_head once


# ---------------------------------------------------------------------------------------------- state bytes


def test_adamw_fp32_state_is_two_moments_plus_step_per_tensor():
    model = _tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    params = _one_step(model, opt)
    got = SB.optimizer_state_bytes(opt, params)
    numel = sum(p.numel() for p in params)
    # exp_avg + exp_avg_sq in fp32 (2 x 4 B per element) + a 0-d fp32 `step` tensor per parameter tensor
    assert got.total == 2 * 4 * numel + 4 * len(params)
    assert got.by_name == {"exp_avg": 4 * numel, "exp_avg_sq": 4 * numel, "step": 4 * len(params)}
    assert got.by_dtype == {"float32": got.total}
    assert got.master_bytes == 0


def test_lion_state_is_exactly_one_moment():
    from lion_pytorch import Lion

    model = _tiny_gpt2()
    opt = Lion(model.parameters(), lr=1e-4)
    params = _one_step(model, opt)
    got = SB.optimizer_state_bytes(opt, params)
    assert got.total == 4 * sum(p.numel() for p in params)
    assert set(got.by_name) == {"exp_avg"}


def test_adafactor_state_is_factored_rows_and_columns():
    from transformers.optimization import Adafactor

    model = _tiny_gpt2()
    opt = Adafactor(model.parameters(), scale_parameter=False, relative_step=False, warmup_init=False, lr=1e-3)
    params = _one_step(model, opt)
    expected = 0
    for p in params:
        if p.dim() >= 2:  # factored second moment: a row vector and a column vector (Shazeer & Stern 2018)
            expected += 4 * (math.prod(p.shape[:-1]) + math.prod(p.shape[:-2]) * p.shape[-1])
        else:
            expected += 4 * p.numel()
        expected += 4  # the 0-d fp32 RMS tensor; `step` is a Python int (no tensor memory)
    got = SB.optimizer_state_bytes(opt, params)
    assert got.total == expected
    assert got.total < 0.2 * 4 * sum(p.numel() for p in params)


def test_bnb_adamw8bit_counts_uint8_states_absmax_shared_qmaps_and_small_fp32_states():
    bnb = pytest.importorskip("bitsandbytes")
    model = _tiny_gpt2()  # wte (128x32) and c_fc (32x128) have 4096 elements: 8-bit; the rest stay fp32
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    params = _one_step(model, opt)
    big = [p for p in params if p.numel() >= 4096]
    small = [p for p in params if p.numel() < 4096]
    assert big and small
    expected = sum(2 * p.numel() + 2 * 4 * math.ceil(p.numel() / 256) for p in big)  # state1/2 + absmax1/2
    expected += 2 * 256 * 4  # qmap1, qmap2: 256 fp32 each, one storage shared by every 8-bit tensor
    expected += sum(2 * 4 * p.numel() for p in small)  # tensors < 4096 elements keep fp32 state1/state2
    got = SB.optimizer_state_bytes(opt, params)
    assert got.total == expected
    assert got.total < 2 * 4 * sum(p.numel() for p in params)
    assert got.by_dtype["uint8"] == sum(2 * p.numel() for p in big)
    assert got.by_name["qmap1"] == got.by_name["qmap2"] == 1024


def test_shared_storage_and_views_are_counted_once():
    base = torch.zeros(100)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(10))], lr=0.1)
    p0, p1 = opt.param_groups[0]["params"]
    opt.state[p0]["buf"] = base[:10]
    opt.state[p1]["buf"] = base[10:20]  # a view of the same 400-byte storage
    opt.state[p1]["other"] = [base, torch.zeros(3, dtype=torch.float16)]
    got = SB.optimizer_state_bytes(opt)
    assert got.total == 400 + 6
    assert got.by_dtype == {"float32": 400, "float16": 6}


class _Int8State(torch.Tensor):
    """A minimal quantized wrapper subclass, like torchao's: logical fp32, stored as int8 codes + fp32 scales."""

    @staticmethod
    def __new__(cls, codes, scales):
        return torch.Tensor._make_wrapper_subclass(cls, codes.shape, dtype=torch.float32, device=codes.device)

    def __init__(self, codes, scales):
        self.codes, self.scales = codes, scales

    def __tensor_flatten__(self):
        return ["codes", "scales"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_tensor_subclass_is_flattened_to_real_storage_not_logical_size():
    p = torch.nn.Parameter(torch.zeros(64, 64))
    opt = torch.optim.SGD([p], lr=0.1)
    state = _Int8State(torch.zeros(64, 64, dtype=torch.int8), torch.zeros(64))
    opt.state[p]["exp_avg"] = state
    assert state.numel() * state.element_size() == 16384  # what a logical count would report
    got = SB.optimizer_state_bytes(opt)
    assert got.total == 4096 + 256
    assert got.by_dtype == {"int8": 4096, "float32": 256}


def test_state_outside_optimizer_state_is_counted_but_params_and_grads_are_not():
    p = torch.nn.Parameter(torch.zeros(8))
    p.grad = torch.zeros(8)
    opt = torch.optim.SGD([p], lr=0.1)
    opt.ema_buffers = {"ema": torch.zeros(5), "alias_of_param": p, "alias_of_grad": p.grad}
    got = SB.optimizer_state_bytes(opt)
    assert got.total == 20 and got.by_name == {"attr:ema_buffers": 20}


def test_wrappers_are_unwrapped_through_dot_optimizer():
    """Accelerate's AcceleratedOptimizer and DeepSpeed's ZeRO optimizers keep the real one in ``.optimizer``
    (the Trainer hands callbacks the AcceleratedOptimizer: tests/measure/test_recorder.py checks that path)."""

    class Wrapper:
        def __init__(self, optimizer):
            self.optimizer = optimizer
            self.param_groups = optimizer.param_groups

    model = _tiny_gpt2()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapped = Wrapper(Wrapper(inner))
    params = _one_step(model, inner)
    assert optimizer_chain(wrapped)[-1] is inner and len(optimizer_chain(wrapped)) == 3
    assert SB.optimizer_state_bytes(wrapped, params).total == SB.optimizer_state_bytes(inner, params).total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_deepspeed_zero2_partition_state_and_fp32_master_are_found(monkeypatch):
    """One rank of ZeRO-2: the inner optimizer's state is the flat fp32 partition's moments (first run builds
    DeepSpeed's shm op, ~1 min; cached afterwards)."""
    pytest.importorskip("deepspeed")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 64))
    numel = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
           "zero_allow_untested_optimizer": True}
    try:
        engine, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        loss = engine(torch.randn(2, 64)).sum()
        engine.backward(loss)
        engine.step()
        chain = optimizer_chain(ds_opt)
        assert type(chain[0]).__name__ == "DeepSpeedZeroOptimizer" and chain[-1] is opt
        got = SB.optimizer_state_bytes(ds_opt, list(engine.module.parameters()))
        assert got.total == 2 * 4 * numel + 4  # one flat partition: exp_avg, exp_avg_sq, step
        assert got.master_bytes == 4 * numel  # this rank's fp32 partition
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_params_grads_and_count_helpers():
    model = _tiny_gpt2()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    assert SB.count_unique_params(params + params) == numel
    assert SB.params_storage_bytes(params) == 4 * numel
    assert SB.grads_storage_bytes(params) == 0
    model(input_ids=torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long)).loss.backward()
    assert SB.grads_storage_bytes(params) == 4 * numel


# ---------------------------------------------------------------------------------------------- FLOPs / peaks


@pytest.mark.parametrize("n_inner", [None, 100])
def test_gpt2_matmul_params_match_the_model_minus_position_table(n_inner):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=3, n_head=2, n_embd=16, vocab_size=50, n_positions=40, n_inner=n_inner)
    model = GPT2LMHeadModel(cfg)
    total = sum(p.numel() for p in model.parameters())  # tied wte counted once
    assert FL.gpt2_matmul_params(3, 16, 50, n_inner) == total - 40 * 16
    fpt = FL.flops_per_token(cfg, seq_len=32)
    assert fpt == 6 * (total - 40 * 16) + 12 * 3 * 16 * 32


def test_flops_per_token_gpt2_124m_by_hand():
    class Cfg:  # GPT-2 small: 124,439,808 parameters, 786,432 of them in wpe
        n_layer, n_embd, vocab_size, n_inner = 12, 768, 50257, None

    n = 124_439_808 - 1024 * 768
    assert FL.gpt2_matmul_params(12, 768, 50257) == n
    assert FL.flops_per_token(Cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024
    with pytest.raises(ValueError, match="GPT-2-style config"):
        FL.flops_per_token(object(), 10)


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        ("Tesla T4", "fp16", 65e12),
        ("Tesla T4", "bf16", None),
        ("Tesla T4", "tf32", 8.1e12),  # no TF32 on Turing: FP32 matmuls
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100 80GB PCIe", "tf32", 156e12),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "fp16", 835.5e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA A10", "bf16", 125e12),
        ("NVIDIA A10G", "bf16", None),  # AWS's A10G is not the A10: unlisted rather than guessed
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla P100-PCIE-16GB", "fp32", 9.3e12),
        ("Some New GPU", "bf16", None),
        (None, "fp32", None),
    ],
)
def test_device_peak_table(name, precision, expected):
    assert FL.device_peak_flops(name, precision) == expected


def test_device_peak_rejects_unknown_precision_and_mfu():
    with pytest.raises(ValueError, match="precision"):
        FL.device_peak_flops("NVIDIA A100", "int8")
    assert FL.model_flops_utilization(1e9, 1e5, 312e12, 4) == pytest.approx(1e14 / (312e12 * 4))
    assert FL.model_flops_utilization(1e9, 1e5, None, 1) is None
    assert FL.model_flops_utilization(None, 1e5, 1e12, 1) is None


# ---------------------------------------------------------------------------------------------- spikes


def _noisy(n: int, level: float = 3.0, amp: float = 0.02) -> list[float]:
    return [level + amp * math.sin(1.7 * i) for i in range(n)]


def test_spike_rule_flags_the_injected_spike_only():
    series = _noisy(120)
    series[60] += 0.5  # ~35 robust deviations above the median
    spikes = M.detect_spikes(series, window=50, threshold=6.0, min_history=10)
    assert [s.index for s in spikes] == [60]
    s = spikes[0]
    assert s.value == series[60] and abs(s.baseline - 3.0) < 0.03 and s.z > 6


def test_spike_rule_threshold_is_the_boundary():
    window = [1.0, 2.0, 3.0, 4.0, 5.0]  # median 3, MAD 1 -> robust deviation 1.4826
    just_below = 3.0 + 2.0 * 1.4826 - 1e-6
    just_above = 3.0 + 2.0 * 1.4826 + 1e-6
    assert M.detect_spikes(window + [just_below], window=5, threshold=2.0, min_history=5) == []
    assert [s.index for s in M.detect_spikes(window + [just_above], window=5, threshold=2.0, min_history=5)] == [5]


def test_no_spikes_on_a_falling_loss_curve_and_none_before_min_history():
    curve = [2.0 + 8.0 * math.exp(-i / 30) + 0.01 * math.sin(i) for i in range(300)]
    assert M.detect_spikes(curve) == []
    early = [3.0] * 5 + [30.0] + [3.0] * 10
    assert M.detect_spikes(early, min_history=10) == []


def test_spike_rule_ignores_non_finite_values_and_reports_steps():
    series = _noisy(40) + [float("nan"), float("inf"), None, 10.0]
    steps = list(range(100, 100 + len(series)))
    spikes = M.detect_spikes(series, steps=steps)
    assert [s.index for s in spikes] == [143]


def test_level_shift_stops_being_flagged_once_it_is_the_new_level():
    series = _noisy(60) + _noisy(100, level=4.0)
    spikes = M.detect_spikes(series, window=50)
    assert spikes and all(60 <= s.index < 60 + 26 for s in spikes)  # flagged until it holds half the window


def test_streaming_detector_largest_and_validation():
    det = M.SpikeDetector(window=10, threshold=3.0, min_history=5)
    for i, v in enumerate(_noisy(20)):
        det.update(v, i)
    det.update(3.5, 20)
    det.update(3.0, 21)
    det.update(5.0, 22)
    assert det.count == 2 and det.largest.index == 22
    with pytest.raises(ValueError):
        M.SpikeDetector(window=5, min_history=6)


# ---------------------------------------------------------------------------------------------- convergence


def test_targets_reached_at_the_right_step_with_smoothing():
    losses = [5.0, 4.0, 3.0, 2.9, 2.0, 1.9, 1.8]
    pts = [(i + 1, 100 * (i + 1), 0.5 * (i + 1), v) for i, v in enumerate(losses)]
    raw = M.time_to_targets(pts, [3.0, 2.0, 1.0])
    assert raw == {"3.0": {"step": 3, "tokens": 300, "seconds": 1.5},
                   "2.0": {"step": 5, "tokens": 500, "seconds": 2.5}, "1.0": None}
    smoothed = M.time_to_targets(pts, [3.0, 2.0], smoothing=2)
    # trailing means: -, 4.5, 3.5, 2.95, 2.45, 1.95, 1.85
    assert smoothed["3.0"]["step"] == 4 and smoothed["2.0"]["step"] == 6


def test_target_tracker_skips_non_finite_and_reports_each_target_once():
    tr = M.TargetTracker([2.0], smoothing=1)
    assert tr.update(float("nan"), 1, None, None) == []
    assert tr.update(1.5, 2, 20, 1.0) == [2.0]
    assert tr.update(1.0, 3, 30, 2.0) == []
    assert tr.as_dict() == {"2.0": {"step": 2, "tokens": 20, "seconds": 1.0}}


def test_trapezoid_auc_and_percentiles():
    assert M.trapezoid_auc([0, 1, 3], [2.0, 4.0, 4.0]) == pytest.approx(3.0 + 8.0)
    assert M.trapezoid_auc([0, 1, 2], [1.0, None, 1.0]) == pytest.approx(2.0)
    assert M.trapezoid_auc([0], [1.0]) is None
    vals = [0.3, 0.1, 0.2, 0.5, 0.4, 0.9, 0.7]
    med, p90 = M.median_and_p90(vals)
    np = pytest.importorskip("numpy")
    assert med == statistics.median(vals) and p90 == pytest.approx(float(np.percentile(vals, 90)))
    assert M.median_and_p90([]) == (None, None)
    assert M.median_and_p90([0.2]) == (0.2, 0.2)


def test_metrics_module_does_not_need_torch_at_import():
    import subprocess
    import sys

    code = "import sys, hf_optbench.measure.metrics as m; m.detect_spikes([1.0]*20); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
