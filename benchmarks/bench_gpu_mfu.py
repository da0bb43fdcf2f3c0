"""GPU throughput and MFU for gpt2 and gpt2-medium: SDPA attention, bf16 autocast, torch.compile, and the
micro-batch doubled until memory is nearly full (seed 004's utilization experiment). Skipped (exit 0, says so)
where no CUDA device exists.

    python benchmarks/bench_gpu_mfu.py [--sizes gpt2 gpt2-medium] [--block 1024] [--steps 30] [--trace DIR]

MFU = FLOPs per token (6N + 12*L*H*Q*T, PaLM appendix B) x tokens/s / the device's dense bf16 peak from
hf_optbench.metrics' table; a device missing from the table gets MFU "n/a" rather than a guessed peak.
Target (issue 8): MFU >= 40% on an A100/H100-class GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _measure(size: str, block: int, batch: int, steps: int, compile_: bool, trace: str | None) -> dict:
    import torch

    from hf_optbench.metrics import flops_per_token
    from hf_optbench.models import build_model
    from hf_optbench.optimizers import build_optimizer

    torch.manual_seed(0)
    model = build_model(size, 50_266, n_positions=block).cuda()
    opt = build_optimizer("adamw", model, lr=6e-4, weight_decay=0.1, model_size=size)
    step_model = torch.compile(model) if compile_ else model
    x = torch.randint(0, 50_266, (batch, block), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # compile + allocator warm-up, excluded
        step()
    torch.cuda.synchronize()
    times = []
    prof = None
    if trace:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if prof is not None:
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(f"{trace}/{size}_b{batch}.json")
    med = statistics.median(times)
    tokens_per_s = batch * block / med
    fpt = flops_per_token(model.config, seq_len=block)
    return {"size": size, "micro_batch": batch, "block": block, "compile": compile_,
            "median_step_s": round(med, 4), "tokens_per_s": round(tokens_per_s),
            "flops_per_token": fpt, "achieved_tflops": round(fpt * tokens_per_s / 1e12, 1),
            "max_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def _largest_batch(size: str, block: int, compile_: bool) -> int:
    """Double the micro-batch until a step runs out of memory; keep the last that fitted (power of two)."""
    import torch

    batch, best = 1, 0
    while batch <= 256:
        try:
            _measure(size, block, batch, 1, compile_, None)
            best = batch
            batch *= 2
        except torch.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["gpt2", "gpt2-medium"])
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=0, help="micro-batch; 0 = largest power of two that fits")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--trace", default=None, help="directory for torch.profiler chrome traces")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA device (this benchmark measures GPU throughput and MFU)")
        return 0
    from hf_optbench.metrics import device_peak_flops

    name = torch.cuda.get_device_name(0)
    peak = device_peak_flops(name, "bf16")
    rows = []
    for size in a.sizes:
        batch = a.batch or _largest_batch(size, a.block, not a.no_compile)
        r = _measure(size, a.block, batch, a.steps, not a.no_compile, a.trace)
        r["device"] = name
        r["mfu"] = round(r["achieved_tflops"] * 1e12 / peak, 3) if peak else None
        rows.append(r)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
