"""CPU MFU per model size against this machine's measured GEMM peak, and GPT-2's ``gelu_new`` against torch's fused
tanh GELU (``gelu_pytorch_tanh``, the default of hf_optbench.models.build_config since 2026-11-25).

    python benchmarks/bench_cpu_mfu.py                       # tiny, mini, midi at the demo's shape (~1-2 min)
    python benchmarks/bench_cpu_mfu.py --rounds 2 --steps 8  # quicker (the --quick of run_all.py)

1. **Peak**: one thread, fp32, ``torch.mm`` of square matrices (256, 512, 1024; 2 n^3 FLOPs per product); the
   best product's GFLOP/s (the median of each size is printed beside it). Measured, not a datasheet figure: a CPU's
   peak depends on its vector units, clock and memory, and MFU against a measured GEMM is what a training step
   could reach at best on this machine with this BLAS.
2. **Training step** at the demo's shape (recipes/sweeps/cpu_demo.yaml: micro-batch 8 x block 64, the synthetic
   source's 32 tokens padded to 64 embedding rows, one thread as its OMP_NUM_THREADS=1): nanoGPT's plain loop
   (forward, backward, clip_grad_norm_, fused AdamW step, zero_grad, loss.item() as the Trainer's per-step log), one
   step = the wall time between consecutive step ends, the first ``--skip`` dropped. The Trainer adds a few ms per
   step on top (benchmarks/bench_harness.py), so a run's own ``mfu`` is a little lower.
3. **MFU** = FLOPs per token (6N + 12 L H Q T, PaLM appendix B: hf_optbench.measure.metrics.flops_per_token) x
   tokens/s / the measured peak.
4. **gelu_new vs gelu_pytorch_tanh**: the two run interleaved (order alternating by round), from the same init on the
   same batches; "tanh/new" is the ratio of the medians of all their steps, with the median and range of the
   per-round ratios (each round's tanh median over its gelu_new median) as its spread: short rounds, so that load
   from other processes moves both sides of a round alike; |delta loss| is the largest difference between their losses over the steps (the same function up
   to float rounding, so it should stay near 1e-7).

The process keeps the default allocator (as the demo's runs do; bench_harness pins malloc for its ratio instead).
Run it on a quiet machine: other load lowers MFU and widens the spread, while the interleaved ratio holds up better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_mfu.json"
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")


def gemm_peak(sizes: list[int], seconds: float = 1.0) -> dict[str, Any]:
    """fp32 ``torch.mm`` on this process's threads: {"best": {n: GFLOP/s}, "median": {n: GFLOP/s}, "peak_gflops":
    the best of all}. Each size runs for about ``seconds`` after one warm-up product. The peak is the best product,
    not the median: on a shared machine a product that ran without being descheduled shows what the core does,
    and products of n <= 1024 (a few ms) mostly fit in one scheduler slice."""
    best, median = {}, {}
    for n in sizes:
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        torch.mm(a, b, out=c)
        rates, spent = [], 0.0
        while spent < seconds or len(rates) < 3:
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            dt = time.perf_counter() - t0
            spent += dt
            rates.append(2 * n**3 / dt / 1e9)
        best[n], median[n] = round(max(rates), 2), round(statistics.median(rates), 2)
    return {"best": best, "median": median, "peak_gflops": max(best.values())}


def train_steps(size: str, activation: str, steps: int, batch: int, block: int, vocab: int) -> dict[str, Any]:
    """Step-end timestamps and losses of ``steps`` plain-loop steps of a fresh model (seeded: the same init and
    batches for every activation)."""
    from transformers import GPT2LMHeadModel

    from hf_optbench.models import build_config, padded_vocab_size
    from hf_optbench.optim.registry import build_optimizer

    torch.manual_seed(0)
    cfg = build_config(size, padded_vocab_size(vocab, 64), n_positions=block, activation_function=activation)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # as hf_optbench.models.build_model sets it
    model.train()
    opt = build_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, model_size=size)
    data = torch.randint(0, vocab, (steps, batch, block), generator=torch.Generator().manual_seed(1))
    stamps, losses = [time.perf_counter()], []
    for ids in data:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        stamps.append(time.perf_counter())
    return {"intervals": [b - a for a, b in zip(stamps, stamps[1:], strict=False)], "losses": losses,
            "config": cfg, "num_params": sum(p.numel() for p in model.parameters())}


def measure(size: str, rounds: int, steps: int, skip: int, batch: int, block: int, vocab: int,
            peak_gflops: float) -> dict[str, Any]:
    """Both activations, interleaved over ``rounds``: median step, tokens/s, MFU each; their ratio and spread."""
    from hf_optbench.measure.flops import flops_per_token

    times: dict[str, list[float]] = {a: [] for a in ACTIVATIONS}
    per_round: list[float] = []
    max_loss_diff, info = 0.0, {}
    for r in range(rounds):
        order = ACTIVATIONS if r % 2 == 0 else ACTIVATIONS[::-1]
        got = {a: train_steps(size, a, steps + skip, batch, block, vocab) for a in order}
        for a in ACTIVATIONS:
            times[a] += got[a]["intervals"][skip:]
        per_round.append(statistics.median(got["gelu_pytorch_tanh"]["intervals"][skip:])
                         / statistics.median(got["gelu_new"]["intervals"][skip:]))
        max_loss_diff = max(max_loss_diff, *(abs(x - y) for x, y in zip(got["gelu_new"]["losses"],
                                                                         got["gelu_pytorch_tanh"]["losses"],
                                                                         strict=True)))
        info = got["gelu_new"]
    fpt = flops_per_token(info["config"], seq_len=block)
    row: dict[str, Any] = {"size": size, "num_params": info["num_params"], "micro_batch": batch, "block": block,
                           "flops_per_token": fpt, "steps_per_variant": len(times["gelu_new"])}
    for a in ACTIVATIONS:
        med = statistics.median(times[a])
        tokens_per_s = batch * block / med
        row[a] = {"median_step_ms": round(med * 1e3, 3), "tokens_per_s": round(tokens_per_s),
                  "gflops": round(fpt * tokens_per_s / 1e9, 2), "mfu": round(fpt * tokens_per_s / 1e9 / peak_gflops, 4)}
    row["ratio_tanh_over_new"] = round(row["gelu_pytorch_tanh"]["median_step_ms"] / row["gelu_new"]["median_step_ms"],
                                       4)
    row["per_round_ratio_median"] = round(statistics.median(per_round), 4)  # robust to load moving between rounds
    row["per_round_ratio_range"] = [round(min(per_round), 4), round(max(per_round), 4)]
    row["max_abs_loss_diff"] = max_loss_diff
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "mini", "midi"])
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (each runs both activations)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per activation per round")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps dropped per run")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gemm-sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--gemm-seconds", type=float, default=1.0)
    p.add_argument("--json", default=str(RESULTS), help=f"where the results go (default {RESULTS})")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    peak = gemm_peak(a.gemm_sizes, a.gemm_seconds)
    rows = [measure(s, a.rounds, a.steps, a.skip, a.batch, a.block, a.vocab, peak["peak_gflops"]) for s in a.sizes]
    result = {"torch": torch.__version__, "threads": a.threads, "cpu": _cpu_name(), "cores": os.cpu_count(),
              "gemm": peak, "rows": rows, "seconds": round(time.perf_counter() - t0, 1),
              "load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    gemm = ", ".join(f"{n}: {g} ({peak['median'][n]})" for n, g in peak["best"].items())
    print(f"torch {torch.__version__}, {a.threads} thread(s), {result['cpu']} ({result['cores']} cores, 1-min load "
          f"{result['load_average_1min'][0]} -> {result['load_average_1min'][1]}); fp32 GEMM GFLOP/s best (median) by "
          f"size {gemm} -> peak {peak['peak_gflops']} GFLOP/s; {a.rounds} interleaved rounds x {a.steps} steps per "
          f"activation, micro-batch {a.batch} x block {a.block}; {result['seconds']} s")
    print("| size | params | gelu_new ms/step | tanh ms/step | tanh/new | per-round: median [range] | gelu_new MFU | "
          "tanh MFU | tanh GFLOP/s | max abs loss diff |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        new, tanh = r["gelu_new"], r["gelu_pytorch_tanh"]
        lo, hi = r["per_round_ratio_range"]
        print(f"| {r['size']} | {r['num_params'] / 1e6:.2f}M | {new['median_step_ms']:.1f} | {tanh['median_step_ms']:.1f} | "
              f"{r['ratio_tanh_over_new']:.3f} | {r['per_round_ratio_median']:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{100 * new['mfu']:.1f}% | {100 * tanh['mfu']:.1f}% | "
              f"{tanh['gflops']:.1f} | {r['max_abs_loss_diff']:.1e} |")
    print(f"written: {a.json}")
    return 0


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
