"""Does ``torch.compile`` pay for the CPU demo's runs, and does it keep their results? (issue 38 item 2, issue 42)

A sweep's warm worker forks one fresh process per run (hf_optbench/study/worker.py), every run of the demo at the
same shape (recipes/sweeps/cpu_demo.yaml: `tiny`, 4 x 64 tokens, one thread). The worker itself never runs a
torch op (forking after one is unsafe), so each run would compile its own model: the first run with an empty
inductor cache (cold), every later one with the on-disk cache the first left (warm). This script runs the demo's
AdamW comparison run in fresh processes exactly so: eager twice, then compiled (``--torch_compile true``) cold and
warm twice, all with one thread, and reports per variant

* the process's wall time, its training time (``train_runtime_s``), the median step, and the wall time beyond
  ``steps x median step`` (start-up, the first steps, evaluation: compiling its graphs for training and for
  evaluation is in there), whose difference to eager's is what compiling costs per run;
* the break-even: that cost over the step time it saves, in steps, against the demo's runs' lengths (every run
  the sweep knows before it starts), and the net seconds over those runs;
* the results: each step's loss against the first eager run's (the largest difference), the final eval loss,
  and whether runs of one variant are identical to each other (run to run reproducibility).

    python benchmarks/bench_compile.py                         # 391 steps (the demo's budget at 1 token/param)
    python benchmarks/bench_compile.py --steps 40 --out-dir /tmp/compile     # a quick check

Writes ``compile_demo.md`` and ``compile_demo.json`` (default ``benchmarks/results``). The decision it supports is
the project's (benchmarks/README.md): compiled steps change the floating-point results, so compiling must pay
clearly and keep every run reproducible before the demo's science would be moved onto it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run_path import DEMO_SWEEP, ROOT, demo_run_args, machine_facts, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = (("eager", False, "a"), ("eager", False, "b"), ("compiled, cold cache", True, "cold"),
            ("compiled, warm cache", True, "warm1"), ("compiled, warm cache", True, "warm2"))


def _run(args: list[str], out: Path, compile_: bool, cache: Path, timeout: float) -> dict[str, Any]:
    """One run in a fresh process (one thread, the given inductor cache); its summary figures and step losses."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(cache),
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    cmd = [sys.executable, "-m", "hf_optbench.run", *args, "--output_dir", str(out), "--torch_compile",
           str(compile_).lower()]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}
    steps, median = summary["steps"], summary["step_time_median_s"]
    return {"process_wall_s": round(wall, 2), "startup_s": summary.get("startup_s"),
            "train_runtime_s": summary["train_runtime_s"], "step_time_median_s": median,
            "beyond_steady_s": wall - steps * median, "steps": steps,
            "final_train_loss": summary["final_train_loss"], "final_eval_loss": summary["final_eval_loss"],
            "losses": losses}


def demo_run_lengths(out: str) -> list[int]:
    """The max_steps of every run the demo's sweep knows before it starts (tuning grids, comparison, ladder)."""
    import contextlib

    from hf_optbench.study.sweep_spec import load_sweep

    with contextlib.chdir(ROOT):
        spec = load_sweep(DEMO_SWEEP, output_dir=out)
    lengths = []
    for run in [*spec.tuning.runs, *spec.runs]:
        last = max(i for i, arg in enumerate(run.args) if arg == "--max_steps")
        lengths.append(int(run.args[last + 1]))
    return lengths


def measure(steps: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        args = [a for a in demo_run_args(steps, 1, str(tmp_path / "probe"))]
        args = args[: args.index("--output_dir")] + args[args.index("--output_dir") + 2:]
        runs = []
        for label, compile_, tag in VARIANTS:
            res = _run(args, tmp_path / f"run_{tag}", compile_, tmp_path / "inductor", timeout)
            runs.append({"variant": label, "tag": tag, **res})
            print(f"{label} ({tag}): train {res['train_runtime_s']:.1f} s, median step "
                  f"{1e3 * res['step_time_median_s']:.2f} ms", file=sys.stderr, flush=True)
        lengths = demo_run_lengths(str(tmp_path / "sweep"))
    return _analyse(runs, lengths, steps)


def _max_diff(a: dict[Any, Any], b: dict[Any, Any]) -> float | None:
    diffs = [abs(a[k] - b[k]) for k in a if k in b and a[k] is not None and b[k] is not None]
    return max(diffs) if diffs else None


def _analyse(runs: list[dict[str, Any]], lengths: list[int], steps: int) -> dict[str, Any]:
    eager = [r for r in runs if r["variant"] == "eager"]
    warm = [r for r in runs if r["tag"].startswith("warm")]
    reference = eager[0]["losses"]
    for r in runs:
        r["max_abs_loss_diff_vs_eager"] = _max_diff(reference, r["losses"])
    eager_step = statistics.median(r["step_time_median_s"] for r in eager)
    eager_beyond = statistics.median(r["beyond_steady_s"] for r in eager)
    warm_step = statistics.median(r["step_time_median_s"] for r in warm)
    saving = eager_step - warm_step
    cost = {r["tag"]: r["beyond_steady_s"] - eager_beyond for r in runs if r["variant"] != "eager"}
    warm_cost = statistics.median(cost[r["tag"]] for r in warm)
    net = sum(n * saving for n in lengths) - warm_cost * (len(lengths) - 1) - cost["cold"]
    return {
        "steps": steps, "runs": [{k: v for k, v in r.items() if k != "losses"} for r in runs],
        "eager_identical_run_to_run": eager[0]["losses"] == eager[1]["losses"],
        "compiled_identical_run_to_run": len({json.dumps(r["losses"], sort_keys=True) for r in runs
                                              if r["variant"] != "eager"}) == 1,
        "step_saving_s": saving, "compile_cost_s": cost, "warm_compile_cost_s": warm_cost,
        "break_even_steps": warm_cost / saving if saving > 0 else None,
        "demo_runs_known_at_start": len(lengths), "demo_run_steps": sorted(set(lengths)),
        "net_over_demo_runs_s": net,
    }


def render(res: dict[str, Any], command: str) -> str:
    lines = [
        "# torch.compile at the CPU demo's shape (generated by benchmarks/bench_compile.py)", "",
        f"`{command}`: {res['date']}, {res['machine']}, torch {res['torch']}, one thread, load average before the "
        f"run {res['load_average']}. The demo's AdamW comparison run, {res['steps']} steps, each variant a fresh "
        "process (as a sweep's warm worker forks one per run); compiled with an empty inductor cache (cold), then "
        "with the cache it left (warm).", "",
        "| variant | process s | train s | median step ms | beyond steady steps s | compile cost s | final train "
        "loss | final eval loss | max abs loss diff vs eager |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        cost = res["compile_cost_s"].get(r["tag"])
        diff = r["max_abs_loss_diff_vs_eager"]
        lines.append(f"| {r['variant']} ({r['tag']}) | {r['process_wall_s']:.2f} | {r['train_runtime_s']:.2f} | "
                     f"{1e3 * r['step_time_median_s']:.3f} | {r['beyond_steady_s']:.2f} | "
                     f"{'-' if cost is None else f'{cost:.2f}'} | {r['final_train_loss']:.6f} | "
                     f"{r['final_eval_loss']:.6f} | {'-' if diff is None else f'{diff:.3g}'} |")
    even = res["break_even_steps"]
    lines += [
        "",
        f"Step time saved by compiling (warm): {1e3 * res['step_saving_s']:.3f} ms; compile cost per warm run "
        f"{res['warm_compile_cost_s']:.2f} s; break-even after "
        + ("never (no step time saved)" if even is None else f"{even:.0f} steps")
        + f". The demo's {res['demo_runs_known_at_start']} runs known at its start have "
        f"{', '.join(str(n) for n in res['demo_run_steps'])} steps; compiling all of them would "
        + ("save" if res["net_over_demo_runs_s"] > 0 else "cost")
        + f" {abs(res['net_over_demo_runs_s']):.0f} s of CPU time in all (one cold compile, the rest warm).",
        "",
        f"Run to run: eager runs identical to each other: {'yes' if res['eager_identical_run_to_run'] else 'no'}; "
        f"compiled runs identical to each other: {'yes' if res['compiled_identical_run_to_run'] else 'no'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    head, rest = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=391, help="steps per run (default 391: the demo's budget at 1 "
                   "token/param)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run before it is called failed")
    p.add_argument("--out-dir", default=str(RESULTS), help="where compile_demo.md and .json go (default "
                   "benchmarks/results)")
    a = p.parse_args(argv)
    facts = machine_facts()
    res = {**measure(a.steps, a.timeout), **facts}
    print(write_results(a.out_dir, "compile_demo", res, render, "bench_compile.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
