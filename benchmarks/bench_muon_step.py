"""Muon's step over AdamW's at ``tiny`` and ``mini``, before and after batching its Newton-Schulz iteration, per
precision, on this machine and on an emulated AVX2-only one.

The step is the demo's (batch 4 x 64 of the synthetic source's 32-token vocabulary, one torch thread): the training
step of ``hf_optbench.study.calibration`` (forward and backward, clipping, the optimizer's step, ``zero_grad``, built
from each run's own resolved plan) and the optimizer's step alone (``optimizer.step()`` on one backward's gradients).
Rows: AdamW, then Muon with ``ns_precision`` bf16 and fp32, each by two paths: ``per-matrix`` (before: one matrix
at a time, ``muon_impl.muon_per_matrix``, torch.optim.Muon's loop, swapped in for the row) and ``batched`` (after:
``muon_impl.muon_batched``, what MuonNS runs). Every round builds each row afresh, in an order rotated by one per
round (interleaved rounds), drops ``--warmup`` steps and keeps ``--steps``; per round each row's median is divided by
AdamW's of the same round, and the table gives the median over all steps with the range of those per-round ratios.
``--clock cpu`` reads the process's CPU time (one torch thread: the step's own), which other processes on a shared
machine do not add to. What ``auto`` picks is resolved per size in each environment, with its reason and its cost.

Each environment is a child process (the variables must be set before torch loads): ``native`` as the machine is,
and ``avx2``: ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``, which holds oneDNN,
ATen and MKL to AVX2: torch then reports no native bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False) and
runs bf16 matmuls in ATen's reference gemm, as on a CPU without AVX-512 (2.6-3.1 GFLOP/s against 54-92 in fp32 on
this project's AMD EPYC at n = 64-256, one thread).

    python benchmarks/bench_muon_step.py --clock cpu                      # ~8 min idle; -> benchmarks/results/
    python benchmarks/bench_muon_step.py --sizes tiny --rounds 1 --steps 2 --envs native --out /tmp/ms   # the test's

Writes ``<out>/muon_step.md`` and ``<out>/muon_step.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ns_precision import ROOT, demo_cell  # noqa: E402

ENVS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
PATHS = ("per-matrix", "batched")
# (optimizer, forced ns_precision, Newton-Schulz path): AdamW, then Muon per precision before and after
ROWS: tuple[tuple[str, str | None, str | None], ...] = (
    ("adamw", None, None), *(("muon", p, path) for p in ("bf16", "fp32") for path in PATHS))
TARGET = 1.30  # Muon's training step over AdamW's that batching aims at, at tiny and mini, on both environments


def _args(optimizer: str, size: str, precision: str | None) -> tuple[str, ...]:
    from hf_optbench.config.parse import to_tokens

    cell = demo_cell(1.0)
    extra = ["--optimizer_kwargs", json.dumps({"ns_precision": precision})] if precision else []
    return (cell["base"], *to_tokens(cell["overrides"]), "--per_device_train_batch_size", "4", "--optimizer",
            optimizer, "--model_size", size, *extra)


def optimizer_step_times(entry: Any, steps: int, warmup: int) -> tuple[list[float], str | None]:
    """Seconds of each ``optimizer.step()`` alone, on the gradients of one forward and backward pass, after
    ``warmup`` dropped ones, and the Newton-Schulz precision the entry resolved to (also bench_study_step's)."""
    from hf_optbench.study.calibration import build_case

    case = build_case(entry, Path("/nonexistent/bench-muon-step"))
    x = case.batches[0]
    case.model(input_ids=x, labels=x).loss.backward()
    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        case.optimizer.step()
        times.append(time.perf_counter() - t0)
    return times[warmup:], case.ns_precision


@contextlib.contextmanager
def newton_schulz_path(path: str | None) -> Iterator[None]:
    """MuonNS steps through ``muon_impl.muon_per_matrix`` (the path before batching) for the block when ``path`` is
    "per-matrix"; otherwise as it is (``muon_batched``). Both take the same arguments; MuonNS reads the name at each
    step."""
    from hf_optbench.optim import muon_impl

    if path != "per-matrix":
        yield
        return
    batched = muon_impl.muon_batched
    muon_impl.muon_batched = muon_impl.muon_per_matrix  # type: ignore[assignment]
    try:
        yield
    finally:
        muon_impl.muon_batched = batched  # type: ignore[assignment]


def _auto(sizes: list[str]) -> dict[str, dict[str, Any]]:
    """What ``ns_precision: auto`` picks for each size's matrices here, its reason and what resolving it cost (a fresh
    measurement: no cache directory, the process's memo emptied)."""
    from hf_optbench.models import GPT2_SIZES
    from hf_optbench.optim import muon, muon_precision

    out = {}
    for size in sizes:
        shapes = muon_precision.gpt2_matrix_shapes(GPT2_SIZES[size]["n_layer"], GPT2_SIZES[size]["n_embd"])
        muon_precision._MEMO.clear()
        t0 = time.perf_counter()
        precision, why = muon.resolve_ns_precision("auto", "cpu", shapes=shapes)
        out[size] = {"precision": precision, "reason": why, "cost_s": time.perf_counter() - t0}
    return out


def child(sizes: list[str], rounds: int, steps: int, warmup: int, clock: str = "wall") -> dict[str, Any]:
    """In the environment under test: every row's training step and optimizer step alone, interleaved over rounds
    (each round one row later), and what auto picks. ``clock`` "cpu": ``time.perf_counter`` (what the calibration
    and this script read) replaced by the process's CPU time."""
    if clock == "cpu":
        time.perf_counter = time.process_time  # type: ignore[assignment]
    import gc

    from hf_optbench.optim import muon
    from hf_optbench.study.calibration import Entry, build_case, machine_record, time_steps, torch_threads

    plan = [(opt, size, p, path) for size in sizes for opt, p, path in ROWS]
    entries = [Entry(opt, size, _args(opt, size, p)) for opt, size, p, _ in plan]
    steps_kept: list[list[list[float]]] = [[] for _ in plan]
    alone_kept: list[list[list[float]]] = [[] for _ in plan]
    with torch_threads(1):
        for r in range(rounds):
            for i in [(r + k) % len(plan) for k in range(len(plan))]:
                with newton_schulz_path(plan[i][3]):
                    case = build_case(entries[i], Path("/nonexistent/bench-muon-step"))
                    steps_kept[i].append(time_steps(case, warmup + steps)[warmup:])
                    del case
                    alone_kept[i].append(optimizer_step_times(entries[i], steps, warmup)[0])
                gc.collect()
        auto = _auto(sizes)
    rows = []
    for (opt, size, precision, path), st, al in zip(plan, steps_kept, alone_kept, strict=True):
        rows.append({"optimizer": opt, "model_size": size, "ns_precision": precision, "path": path,
                     "step_time_median_s": statistics.median([t for ts in st for t in ts]),
                     "step_time_round_medians_s": [statistics.median(ts) for ts in st],
                     "optimizer_step_s": statistics.median([t for ts in al for t in ts]),
                     "optimizer_step_round_medians_s": [statistics.median(ts) for ts in al]})
    native, seen = muon.bf16_matmul_native("cpu")
    return {"machine": machine_record(), "clock": clock, "bf16_native": native, "capability": seen, "auto": auto,
            "rows": rows}


def run_in_env(script: str, env: str, child_args: list[str], pythonpath: str | None = None) -> dict[str, Any]:
    """``python SCRIPT CHILD_ARGS`` in environment ``env`` of :data:`ENVS` (one OpenMP thread; ``pythonpath``: the
    package it imports, else this process's): the JSON its last line of output prints. The variables must be set
    before torch loads, hence a child per environment (also bench_study_step.py's and bench_muon_floor.py's)."""
    environ = {**os.environ, **ENVS[env], "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        environ["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, script, *child_args], env=environ, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{env}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_env(name: str, args: argparse.Namespace) -> dict[str, Any]:
    child = ["--child", "--sizes", *args.sizes, "--rounds", str(args.rounds), "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--clock", args.clock]
    return {"env": name, "variables": ENVS[name], **run_in_env(__file__, name, child)}


def _ratio(row: dict[str, Any], base: dict[str, Any], key: str) -> str:
    """``x<median ratio> [<lowest>, <highest> per-round ratio]`` of ``row``'s ``key`` to ``base``'s."""
    per_round = [a / b for a, b in zip(row[f"{key}_round_medians_s"], base[f"{key}_round_medians_s"], strict=True)]
    median_key = "step_time_median_s" if key == "step_time" else "optimizer_step_s"
    return f"x{row[median_key] / base[median_key]:.2f} [{min(per_round):.2f}, {max(per_round):.2f}]"


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    machine = results[0]["machine"]
    clock = ("the process's CPU time (`--clock cpu`: other processes on the shared machine do not add to it)"
             if meta.get("clock") == "cpu" else "the wall clock")
    lines = [
        "# Muon's step over AdamW's, before and after batching Newton-Schulz",
        "",
        f"Generated by `benchmarks/bench_muon_step.py` on {meta['date']}: {meta['lscpu_model']} (lscpu model name; "
        f"torch capability {machine['cpu_capability']}), torch {machine['torch']}, one thread; the demo's batch 4 x 64 "
        f"(32-token vocabulary); {meta['rounds']} rounds of {meta['steps']} steps after {meta['warmup']} dropped, "
        "interleaved (every row built afresh each round, the order rotated by one row per round); "
        f"{clock}. Training step: forward, backward, clipping, optimizer step, zero_grad "
        "(hf_optbench.study.calibration); optimizer step: `optimizer.step()` alone. Before: Newton-Schulz one matrix "
        "at a time (`muon_impl.muon_per_matrix`, torch.optim.Muon's loop); after: the matrices of one shape stacked "
        "(`muon_impl.muon_batched`, what Muon runs). Ratios: to AdamW's median, in brackets the range of the per-round "
        "ratios. avx2: oneDNN, ATen and MKL held to AVX2 (" + " ".join(f"{k}={v}" for k, v in ENVS["avx2"].items())
        + "), as on a CPU without AVX-512.",
        "",
        "| env | size | Newton-Schulz | auto picks | AdamW step (ms) | Muon step before (ms, x AdamW) | "
        "Muon step after (ms, x AdamW) | AdamW optimizer step (ms) | Muon optimizer step before (ms, x AdamW) | "
        "Muon optimizer step after (ms, x AdamW) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for res in results:
        by = {(r["optimizer"], r["model_size"], r["ns_precision"], r["path"]): r for r in res["rows"]}
        for size in meta["sizes"]:
            a = by[("adamw", size, None, None)]
            auto = res["auto"][size]["precision"]
            for precision in ("bf16", "fp32"):
                b, f = by[("muon", size, precision, "per-matrix")], by[("muon", size, precision, "batched")]
                lines.append(
                    f"| {res['env']} | {size} | {precision} | {'yes' if auto == precision else ''} | "
                    f"{1e3 * a['step_time_median_s']:.2f} | {1e3 * b['step_time_median_s']:.2f} "
                    f"({_ratio(b, a, 'step_time')}) | {1e3 * f['step_time_median_s']:.2f} ({_ratio(f, a, 'step_time')}) | "
                    f"{1e3 * a['optimizer_step_s']:.2f} | {1e3 * b['optimizer_step_s']:.2f} "
                    f"({_ratio(b, a, 'optimizer_step')}) | {1e3 * f['optimizer_step_s']:.2f} "
                    f"({_ratio(f, a, 'optimizer_step')}) |")
            after = by[("muon", size, auto, "batched")]
            ratio = after["step_time_median_s"] / a["step_time_median_s"]
            verdicts.append(f"{res['env']} {size}: x{ratio:.2f} ({auto}, "
                            f"{'within' if ratio <= TARGET else 'over'} x{TARGET:.2f})")
    lines += ["", f"Muon's training step after, at the precision auto picks, over AdamW's (target at most "
              f"x{TARGET:.2f}): " + "; ".join(verdicts) + ".", "", "What auto picked and why (resolving it, a "
              "fresh measurement, took the seconds given):", ""]
    for res in results:
        for size in meta["sizes"]:
            got = res["auto"][size]
            lines.append(f"- {res['env']} {size}: {got['precision']}, {got['cost_s']:.2f} s: {got['reason']}")
    lines += ["", "What torch reported: " + "; ".join(f"{r['env']}: {r['capability']}" for r in results) + "."]
    return "\n".join(lines) + "\n"


def lscpu_model() -> str:
    """lscpu's "Model name" (the machine the table was measured on), else the platform's processor string."""
    import platform

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                platform.processor() or "unknown CPU")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.sizes, args.rounds, args.steps, args.warmup, args.clock)))
        return 0
    results = [_run_env(name, args) for name in args.envs]
    meta = {"date": _dt.date.today().isoformat(), "sizes": args.sizes, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup, "clock": args.clock, "interleaved": True, "lscpu_model": lscpu_model()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = render(results, meta)
    (out / "muon_step.md").write_text(text, encoding="utf-8")
    (out / "muon_step.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
