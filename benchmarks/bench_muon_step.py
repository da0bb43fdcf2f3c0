"""Muon's step time over AdamW's at ``tiny`` and ``mini``, per Newton-Schulz precision, on this machine and on an
emulated AVX2-only one (issue 38, item 1: "Muon 4.1x AdamW's step time here, 1.8x there").

The step is the demo's (batch 4 x 64 of the synthetic source's 32-token vocabulary, one torch thread): the training
step of ``hf_optbench.study.calibration`` (forward and backward, clipping, the optimizer's step, built from each run's
own resolved plan), measured alone and interleaved over rounds, first steps dropped; and the optimizer's step alone
(``optimizer.step()`` on the same gradients). Rows: AdamW, Muon with ``ns_precision`` bf16 (torch.optim.Muon's own
code: "before"), fp32, and what ``auto`` picks here ("after").

Each environment is a child process (the variables must be set before torch loads): ``native`` as the machine is,
and ``avx2``: ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``, which holds oneDNN,
ATen and MKL to AVX2: torch then reports no native bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False) and
runs bf16 matmuls in ATen's reference gemm, as on a CPU without AVX-512 (2.6-3.1 GFLOP/s against 54-92 in fp32 on
this project's AMD EPYC at n = 64-256, one thread).

    python benchmarks/bench_muon_step.py                                  # ~2 min idle; -> benchmarks/results/
    python benchmarks/bench_muon_step.py --sizes tiny --rounds 1 --steps 2 --envs native --out /tmp/ms   # the test's

Writes ``<out>/muon_step.md`` and ``<out>/muon_step.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ns_precision import ROOT, demo_cell  # noqa: E402

ENVS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
ROWS = (("adamw", None), ("muon", "bf16"), ("muon", "fp32"))


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


def _optimizer_step_s(entry: Any, steps: int, warmup: int) -> float:
    """Median seconds of ``optimizer.step()`` alone (:func:`optimizer_step_times`)."""
    return statistics.median(optimizer_step_times(entry, steps, warmup)[0])


def child(sizes: list[str], rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """In the environment under test: the training step (interleaved rounds) and the optimizer step of each row."""
    from hf_optbench.models import GPT2_SIZES
    from hf_optbench.optim import muon
    from hf_optbench.study.calibration import Entry, machine_record, measure, torch_threads

    entries = [Entry(opt, size, _args(opt, size, p)) for size in sizes for opt, p in ROWS]
    with torch_threads(1):
        rows = measure(entries, rounds=rounds, steps=steps, warmup=warmup)
        for row, entry in zip(rows, entries, strict=True):
            row["optimizer_step_s"] = _optimizer_step_s(entry, steps, warmup)
    native, seen = muon.bf16_matmul_native("cpu")
    # what auto picks for each size's matrices (timed in this process; older checkouts read the capability alone)
    auto = {}
    for size in sizes:
        d = GPT2_SIZES[size]["n_embd"]
        matrices = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * GPT2_SIZES[size]["n_layer"]
        try:
            auto[size] = muon.resolve_ns_precision("auto", "cpu", shapes=matrices)[0]
        except TypeError:
            auto[size] = muon.resolve_ns_precision("auto", "cpu")[0]
    return {"machine": machine_record(), "bf16_native": native, "capability": seen, "auto": auto, "rows": rows}


def _run_env(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, **ENVS[name], "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", "--sizes", *args.sizes, "--rounds", str(args.rounds), "--steps",
           str(args.steps), "--warmup", str(args.warmup)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return {"env": name, "variables": ENVS[name], **json.loads(proc.stdout.strip().splitlines()[-1])}


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Muon's step over AdamW's, per Newton-Schulz precision",
        "",
        f"Generated by `benchmarks/bench_muon_step.py` on {meta['date']}: {results[0]['machine']['cpu_model']}, torch "
        f"{results[0]['machine']['torch']}, one thread; the demo's batch 4 x 64 (32-token vocabulary); "
        f"{meta['rounds']} interleaved rounds of {meta['steps']} steps after {meta['warmup']} dropped. Training step: "
        "forward, backward, clipping, optimizer step (hf_optbench.study.calibration); optimizer step: "
        "`optimizer.step()` alone. avx2: oneDNN, ATen and MKL held to AVX2 (" + " ".join(
            f"{k}={v}" for k, v in ENVS["avx2"].items()) + "), as on a CPU without AVX-512.",
        "",
        "| environment | bf16 native | auto picks | size | AdamW step (ms) | Muon bf16 (ms, x AdamW) | "
        "Muon fp32 (ms, x AdamW) | optimizer step: AdamW / Muon bf16 / Muon fp32 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        by = {(r["optimizer"], r["model_size"], r["ns_precision"]): r for r in res["rows"]}
        for size in meta["sizes"]:
            a, b, f = (by[("adamw", size, None)], by[("muon", size, "bf16")], by[("muon", size, "fp32")])
            base = a["step_time_median_s"]
            auto = res["auto"][size] if isinstance(res["auto"], dict) else res["auto"]
            lines.append(
                f"| {res['env']} | {res['bf16_native']} | {auto} | {size} | {1e3 * base:.2f} | "
                f"{1e3 * b['step_time_median_s']:.2f} (x{b['step_time_median_s'] / base:.2f}) | "
                f"{1e3 * f['step_time_median_s']:.2f} (x{f['step_time_median_s'] / base:.2f}) | "
                f"{1e3 * a['optimizer_step_s']:.2f} / {1e3 * b['optimizer_step_s']:.2f} / "
                f"{1e3 * f['optimizer_step_s']:.2f} |")
    lines += ["", "Before this change every Muon ran the bf16 row; with `ns_precision: auto` (the default) it runs "
              "the row its environment's `auto picks` names. What torch reported: " + "; ".join(
                  f"{r['env']}: {r['capability']}" for r in results) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.sizes, args.rounds, args.steps, args.warmup)))
        return 0
    results = [_run_env(name, args) for name in args.envs]
    meta = {"date": _dt.date.today().isoformat(), "sizes": args.sizes, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = render(results, meta)
    (out / "muon_step.md").write_text(text, encoding="utf-8")
    (out / "muon_step.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
