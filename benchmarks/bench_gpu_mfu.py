"""GPU throughput and MFU for gpt2 and gpt2-medium: SDPA attention, bf16, torch.compile, and the micro-batch
doubled until memory is nearly full (the largest micro-batch that fits, as GPU-utilization studies use). Skipped (exit 0, says so) where no CUDA
device exists.

Two variants per size, at the same micro-batch, interleaved: nanoGPT's plain loop (bf16 autocast, compiled model,
the loss read back every ``--logging-steps``) and an hf_optbench run (what ``hf-optbench run`` assembles, with
``bf16=True, torch_compile=True`` and a loss log every ``--logging-steps``, as a GPU recipe runs: 10). Their ratio
is the harness's cost on a GPU, where the Trainer's per-step host work and syncs matter more than on a CPU. The
micro-batch is ``--batch``, or the largest power of two whose eager step fits (compiled steps need no more memory
than eager ones), searched with the plain loop.

    python benchmarks/bench_gpu_mfu.py [--sizes gpt2 gpt2-medium] [--block 1024] [--steps 30] [--trace DIR]
    python benchmarks/bench_gpu_mfu.py --device cpu --sizes tiny --batch 2 --block 64 --steps 4 --no-compile \
        --dtype fp32        # a smoke check of the code path on a machine without a GPU (MFU n/a)

MFU = FLOPs per token (6N + 12*L*H*Q*T, PaLM appendix B) x tokens/s / the device's dense peak for the dtype from
hf_optbench.measure.metrics' table; a device missing from the table gets MFU null rather than a guessed peak.
Target (issue 8): MFU >= 40% on an A100/H100-class GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_harness import plain_steps, trainer_steps  # noqa: E402  (beside this script)

VOCAB = 50_266  # flax-community/gpt2-base-thai's tokenizer; build_model pads the embedding to 50,304 rows


def _free() -> None:
    """Between runs: drop compiled graphs (each run compiles a new model object; dynamo counts those recompiles of
    the same forward against its cache_size_limit and silently falls back to eager past it) and cached memory."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def largest_batch(size: str, block: int, bf16: bool, limit: int = 256) -> int:
    """Double the micro-batch until an eager step runs out of memory; the last that fitted (0 if none did)."""
    batch, best = 1, 0
    while batch <= limit:
        try:
            plain_steps(size, batch, block, VOCAB, 2, 0, device="cuda", bf16=bf16, compile_=False)
            best, batch = batch, batch * 2
        except torch.OutOfMemoryError:
            break
        finally:
            _free()
    return best


def _row(variant: str, size: str, batch: int, block: int, intervals: list[float], fpt: float,
         peak: float | None) -> dict[str, Any]:
    med = statistics.median(intervals)
    tokens_per_s = batch * block / med
    achieved = fpt * tokens_per_s
    return {"variant": variant, "size": size, "micro_batch": batch, "block": block, "steps": len(intervals),
            "median_step_s": round(med, 5), "tokens_per_s": round(tokens_per_s), "flops_per_token": fpt,
            "achieved_tflops": round(achieved / 1e12, 2), "mfu": round(achieved / peak, 4) if peak else None}


def measure(size: str, batch: int, block: int, steps: int, device: str, bf16: bool, compile_: bool,
            rounds: int, trace: str | None, logging_steps: int = 10,
            compile_backend: str = "inductor") -> list[dict[str, Any]]:
    from hf_optbench.measure.flops import device_peak_flops, flops_per_token
    from hf_optbench.models import build_config, padded_vocab_size

    # the model's own shape: build_model pads the embedding to a multiple of 64 rows (the matmuls run at that width)
    fpt = flops_per_token(build_config(size, padded_vocab_size(VOCAB, 64), n_positions=block), seq_len=block)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    peak = device_peak_flops(name, "bf16" if bf16 else "tf32")
    # compile and allocator warm-up: the first 3 steps, in whole sync intervals; the timed steps too
    skip = -(-3 // logging_steps) * logging_steps
    steps = -(-steps // logging_steps) * logging_steps
    kw = {"device": device, "bf16": bf16, "compile_": compile_, "logging_steps": logging_steps,
          "compile_backend": compile_backend}
    times: dict[str, list[float]] = {"plain": [], "hf_optbench": []}
    peak_mem: dict[str, float] = {}
    for r in range(rounds):
        for variant in (("plain", "hf_optbench") if r % 2 == 0 else ("hf_optbench", "plain")):
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            if variant == "plain":
                times[variant] += plain_steps(size, batch, block, VOCAB, steps + skip, skip, **kw)
            else:
                times[variant] += trainer_steps(size, batch, block, VOCAB, steps + skip, "hf_optbench", skip,
                                                **kw)["intervals"]
            if device.startswith("cuda"):
                peak_mem[variant] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            med = statistics.median(times[variant])
            print(f"{size} {variant}: micro-batch {batch} x {block}, median step {med:.4f} s, "
                  f"{batch * block / med:,.0f} tokens/s", file=sys.stderr, flush=True)  # kept in a log if cut off
            _free()
    rows = [_row(v, size, batch, block, t, fpt, peak) for v, t in times.items()]
    for row in rows:
        row.update(device=name or device, dtype="bf16" if bf16 else "fp32/tf32", compile=compile_,
                   compile_backend=compile_backend if compile_ else None,
                   max_allocated_gib=peak_mem.get(row["variant"]))
    rows[1]["ratio_vs_plain"] = round(rows[1]["median_step_s"] / rows[0]["median_step_s"], 4)
    if trace:
        _trace(size, batch, block, device, bf16, compile_, trace)
    return rows


def _trace(size: str, batch: int, block: int, device: str, bf16: bool, compile_: bool, directory: str) -> None:
    """A torch.profiler chrome trace of a few plain-loop steps (open in chrome://tracing or Perfetto)."""
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(directory, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    plain_steps(size, batch, block, VOCAB, 3, 0, device=device, bf16=bf16, compile_=compile_)  # compile outside
    with profile(activities=activities) as prof:
        plain_steps(size, batch, block, VOCAB, 4, 0, device=device, bf16=bf16, compile_=compile_)
    prof.export_chrome_trace(os.path.join(directory, f"{size}_b{batch}.json"))
    _free()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["gpt2", "gpt2-medium"])
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant per round")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the two variants")
    p.add_argument("--batch", type=int, default=0, help="micro-batch; 0 = largest power of two that fits (CUDA)")
    p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke check of the code path)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--compile-backend", default="inductor", choices=["inductor", "aot_eager"],
                   help="torch.compile's backend (inductor: what a GPU run uses; aot_eager: dynamo and AOT autograd "
                        "without code generation, the smoke check's on a CPU)")
    p.add_argument("--trace", default=None, help="directory for torch.profiler chrome traces")
    p.add_argument("--logging-steps", type=int, default=10,
                   help="steps between host syncs on both sides (the GPU recipes' logging_steps: 10)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (this benchmark measures GPU throughput and MFU; --device cpu runs a smoke "
              "check of its code path)")
        return 0
    if a.device == "cpu" and not a.batch:
        p.error("--device cpu needs --batch (the fill-memory search is for GPUs)")
    bf16 = a.dtype == "bf16"
    if not bf16 and a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 on a GPU means TF32 matmuls, as the peak assumes
    rows = []
    for size in a.sizes:
        batch = a.batch or largest_batch(size, a.block, bf16)
        print(f"{size}: micro-batch {batch}", file=sys.stderr, flush=True)
        if batch == 0:
            print(f"{size}: not even a micro-batch of 1 fits at block {a.block}; skipped")
            continue
        try:
            rows += measure(size, batch, a.block, a.steps, a.device, bf16, not a.no_compile, a.rounds, a.trace,
                            a.logging_steps, a.compile_backend)
        except torch.OutOfMemoryError:  # the Trainer's step can need a little more than the searched eager one
            _free()
            print(f"{size}: micro-batch {batch} ran out of memory in the timed runs; measuring at {batch // 2}")
            rows += measure(size, batch // 2, a.block, a.steps, a.device, bf16, not a.no_compile, a.rounds, a.trace,
                            a.logging_steps, a.compile_backend)
    print(f"torch {torch.__version__}; {rows[0]['device'] if rows else a.device}")
    print("| size | variant | micro-batch x block | median step s | tokens/s | TFLOP/s | MFU | vs plain | "
          "max allocated GiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"| {r['size']} | {r['variant']} | {r['micro_batch']} x {r['block']} | {r['median_step_s']} | "
              f"{r['tokens_per_s']} | {r['achieved_tflops']} | {mfu} | {r.get('ratio_vs_plain', '')} | "
              f"{r['max_allocated_gib'] if r['max_allocated_gib'] is not None else '-'} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
