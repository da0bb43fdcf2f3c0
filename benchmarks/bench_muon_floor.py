"""The least Muon's training step can cost over AdamW's on this CPU at the demo's step, from its arithmetic.

Muon replaces AdamW's update of the hidden matrices by ``ns_steps`` Newton-Schulz iterations per matrix. For a
matrix of m x n (m <= n, the orientation ``muon_impl`` runs it in) one iteration is three matmuls: the Gram matrix
X X^T (2 m^2 n FLOPs), the quintic's b A + c A^2 (2 m^3) and its product with X (2 m^2 n), so 4 m^2 n + 2 m^3 per
iteration (``muon_impl.newton_schulz_batched``). At the demo's step (4 x 64 tokens) that arithmetic is of the order
of the model's own forward and backward (6 x parameters x tokens), so no implementation makes it vanish.

For each size and environment this measures, on one torch thread and the process's CPU time:

* the FLOP rate of one large matmul (1,024 x 1,024 x 1,024) in fp32 and, where torch runs bf16 matmuls natively,
  in bf16: the most this CPU's GEMM gives to one thread (the Newton-Schulz matrices are smaller, so they get less);
* AdamW's training step (``hf_optbench.study.calibration``: forward, backward, clipping, optimizer step,
  zero_grad, built from the run's resolved plan), AdamW's optimizer step alone, and Muon's training step at the
  precision ``ns_precision: auto`` picks, interleaved over rounds (as ``bench_muon_step.py``);
* one Newton-Schulz pass over the run's matrices in each precision (``muon_precision.measure``).

The floor is AdamW's training step without its optimizer step, plus Newton-Schulz's FLOPs at the faster measured
GEMM rate: a lower bound on Muon's step, since Muon still does its momentum, its AdamW on the embeddings and gains,
and runs Newton-Schulz below the large matmul's rate. Environments as in ``bench_muon_step.py`` (``native``, and
``avx2``: oneDNN, ATen and MKL held to AVX2).

    python benchmarks/bench_muon_floor.py                                 # ~1 min idle; -> benchmarks/results/
    python benchmarks/bench_muon_floor.py --sizes tiny --rounds 1 --steps 2 --envs native --out /tmp/mf

Writes ``<out>/muon_floor.md`` and ``<out>/muon_floor.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_muon_step import ENVS, TARGET, _args, lscpu_model, optimizer_step_times, run_in_env  # noqa: E402
from bench_ns_precision import ROOT  # noqa: E402

NS_STEPS = 5  # Muon's default (KellerJordan/Muon README, the registry's cited value)
GEMM_N = 1024


def ns_flops(shapes: list[tuple[int, int]], ns_steps: int = NS_STEPS) -> int:
    """FLOPs of Newton-Schulz over these matrices: ``ns_steps`` x (4 m^2 n + 2 m^3) each, m <= n."""
    total = 0
    for rows, cols in shapes:
        m, n = min(rows, cols), max(rows, cols)
        total += ns_steps * (4 * m * m * n + 2 * m ** 3)
    return total


def gemm_gflops(dtype: Any, n: int = GEMM_N, reps: int = 5) -> float:
    """The best of ``reps`` timings of one n x n x n matmul on this thread, as GFLOP/s (after two warm-ups)."""
    import torch

    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        a @ b
        best = min(best, time.process_time() - t0)
    return 2 * n ** 3 / best / 1e9


def child(sizes: list[str], rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """In the environment under test: per size, the GEMM rates, AdamW's and Muon's steps interleaved over rounds,
    AdamW's optimizer step alone and one Newton-Schulz pass per precision; the process's CPU time throughout."""
    time.perf_counter = time.process_time  # type: ignore[assignment]  # what calibration's timers read
    import gc

    import torch

    from hf_optbench.models import GPT2_SIZES
    from hf_optbench.optim import muon_precision
    from hf_optbench.study.calibration import Entry, build_case, machine_record, time_steps, torch_threads

    native, seen = muon_precision.bf16_matmul_native("cpu")
    out: dict[str, Any] = {"machine": machine_record(), "bf16_native": native, "capability": seen, "sizes": {}}
    with torch_threads(1):
        rates = {"fp32": gemm_gflops(torch.float32)}
        if native:  # emulated bf16 runs torch's reference gemm at a few GFLOP/s: never the faster precision
            rates["bf16"] = gemm_gflops(torch.bfloat16)
        out["gemm_gflops"] = rates
        for size in sizes:
            entries = {opt: Entry(opt, size, _args(opt, size, None)) for opt in ("adamw", "muon")}
            kept: dict[str, list[float]] = {"adamw": [], "muon": []}
            for r in range(rounds):
                for opt in (("adamw", "muon") if r % 2 == 0 else ("muon", "adamw")):
                    case = build_case(entries[opt], Path("/nonexistent/bench-muon-floor"))
                    kept[opt].append(statistics.median(time_steps(case, warmup + steps)[warmup:]))
                    if opt == "muon":
                        out["sizes"].setdefault(size, {})["muon_ns_precision"] = case.ns_precision
                    del case
                    gc.collect()
            alone = optimizer_step_times(entries["adamw"], steps, warmup)[0]
            shapes = muon_precision.gpt2_matrix_shapes(GPT2_SIZES[size]["n_layer"], GPT2_SIZES[size]["n_embd"])
            ns = muon_precision.measure(shapes)
            out["sizes"].setdefault(size, {}).update({
                "shapes": muon_precision.shapes_key(shapes), "ns_gflop": ns_flops(shapes) / 1e9,
                "adamw_step_s": statistics.median(kept["adamw"]), "muon_step_s": statistics.median(kept["muon"]),
                "round_ratios": [m / a for m, a in zip(kept["muon"], kept["adamw"], strict=True)],
                "adamw_optimizer_step_s": statistics.median(alone),
                "ns_pass_ms": {"fp32": ns["fp32_ms"], **({"bf16": ns["bf16_ms"]} if ns["bf16_timed"] else {})},
            })
    return out


def floor(env: dict[str, Any], size: str) -> dict[str, Any]:
    """The floor's figures for one size of one environment's result (see the module docstring), per precision
    whose GEMM rate was measured; ``lowest`` is the least of them."""
    row = env["sizes"][size]
    rest_s = row["adamw_step_s"] - row["adamw_optimizer_step_s"]
    per: dict[str, dict[str, float | None]] = {}
    for precision, rate in env["gemm_gflops"].items():
        ns_s = row["ns_gflop"] / rate
        measured = row["ns_pass_ms"].get(precision)
        per[precision] = {"ns_floor_ms": 1e3 * ns_s, "floor_ratio": (rest_s + ns_s) / row["adamw_step_s"],
                          "share_of_gemm_rate": row["ns_gflop"] / (measured / 1e3) / rate if measured else None}
    lowest = min(v["floor_ratio"] for v in per.values())
    return {"per_precision": per, "lowest": lowest, "measured_ratio": statistics.median(row["round_ratios"]),
            "target_reachable": lowest <= TARGET}


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results as Markdown: one row per environment and size."""
    lines = [
        "# The least Muon's training step can cost over AdamW's here, from its arithmetic",
        "",
        f"Generated by `benchmarks/bench_muon_floor.py` on {meta['date']}: {meta['cpu']}, torch {meta['torch']}, one "
        f"thread, the process's CPU time; the demo's step (batch 4 x 64, the synthetic source); {meta['rounds']} "
        f"rounds of {meta['steps']} steps after {meta['warmup']} dropped, AdamW and Muon interleaved (a "
        "round's median step each, the median over rounds; ratios paired by round). Newton-Schulz: "
        f"{NS_STEPS} iterations of 4 m^2 n + 2 m^3 FLOPs per m x n matrix (m <= n). Floor: AdamW's training step "
        "without its optimizer step, plus Newton-Schulz's FLOPs at the GEMM rate of one 1,024-cube matmul in the "
        "faster precision; a lower bound on Muon's step (its momentum, its AdamW on embeddings and gains, and "
        "Newton-Schulz's smaller matmuls below that rate all add to it). Target: Muon's step at most "
        f"x{TARGET:.2f} AdamW's.",
        "",
        "| env | size | matrices | Newton-Schulz GFLOP per step | GEMM GFLOP/s (one thread) | AdamW step (ms) | "
        "AdamW optimizer step (ms) | Newton-Schulz at the GEMM rate (ms) | one Newton-Schulz pass measured (ms, "
        "share of the GEMM rate) | floor (x AdamW) | Muon measured (x AdamW: median [range] of the per-round ratios) | "
        "target reachable |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env in results:
        rates = ", ".join(f"{k} {v:.1f}" for k, v in env["gemm_gflops"].items())
        for size, row in env["sizes"].items():
            f = floor(env, size)
            per = f["per_precision"]
            at_rate = ", ".join(f"{k} {v['ns_floor_ms']:.2f}" for k, v in per.items())
            passes = ", ".join(f"{k} {v:.2f}" + (f" ({per[k]['share_of_gemm_rate']:.0%})" if k in per else "")
                               for k, v in row["ns_pass_ms"].items())
            floors = ", ".join(f"{k} x{v['floor_ratio']:.2f}" for k, v in per.items())
            rr = row["round_ratios"]
            lines.append(
                f"| {env['env']} | {size} | {row['shapes']} | {row['ns_gflop']:.3f} | {rates} | "
                f"{1e3 * row['adamw_step_s']:.2f} | {1e3 * row['adamw_optimizer_step_s']:.2f} | {at_rate} | "
                f"{passes}; auto: {row['muon_ns_precision']} | {floors} | x{f['measured_ratio']:.2f} "
                f"[{min(rr):.2f}, {max(rr):.2f}] | {'yes' if f['target_reachable'] else 'no'} |")
    lines.append("")
    return "\n".join(lines)


def _run_env(name: str, args: argparse.Namespace) -> dict[str, Any]:
    child = ["--child", "--sizes", *args.sizes, "--rounds", str(args.rounds), "--steps", str(args.steps),
             "--warmup", str(args.warmup)]
    return {"env": name, "variables": ENVS[name], **run_in_env(__file__, name, child)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["tiny", "mini"])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.sizes, args.rounds, args.steps, args.warmup)))
        return 0
    import torch

    results = [_run_env(name, args) for name in args.envs]
    meta = {"date": _dt.date.today().isoformat(), "cpu": lscpu_model(), "torch": torch.__version__,
            "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "muon_floor.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    text = render(results, meta)
    (out / "muon_floor.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
