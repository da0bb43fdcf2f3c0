"""Per-run fixed cost of a local sweep: a plain ``python -m hf_optbench.run`` subprocess per run (accelerate/command
launchers, GPU machines) against a fork of the warm worker (``launcher.type: python``, the demo's), interleaved.

    python benchmarks/bench_run_overhead.py                # 5 pairs of tiny runs, --max_steps 1
    python benchmarks/bench_run_overhead.py --pairs 3 --json

Each run is the demo's tiny shape (recipes/quickstart_cpu.yaml with recipes/sweeps/cpu_demo.yaml's overrides), one
step and one evaluation, started exactly as the sweep starts it (processes.execute / WarmWorker.execute, the sweep's
environment). Overhead = the run's wall time from launch to exit minus its own training and evaluation: summary.json
``train_runtime_s`` (the whole trainer.train() call, with its in-loop evaluation and checkpoint save) plus the
``eval_runtime`` of evaluations logged after training ended. What is left is start-up, imports, data preparation,
model build, Trainer set-up, the summary and model card, and process exit. The pairs alternate order (subprocess
first, then worker first) so that a drift in the machine's load falls on both. Target (issue 12): <= 1 s per run.
The worker's own start (its imports) is paid once per sweep and is printed separately, with the number of runs
after which it has paid for itself. The same seed must give the same losses on both paths (checked, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf_optbench.study.processes import RUN_DIR_ENV, execute, kill_tree  # noqa: E402
from hf_optbench.study.worker_client import WarmWorker, unavailable_reason  # noqa: E402

RECIPE = str(ROOT / "recipes" / "quickstart_cpu.yaml")
DEMO_OVERRIDES = ["--data_source", "synthetic", "--block_size", "64", "--per_device_train_batch_size", "8",
                  "--per_device_eval_batch_size", "8", "--validation_blocks", "16", "--model_size", "tiny",
                  "--optimizer", "adamw", "--seed", "0"]


def _own_work_s(run_dir: Path) -> tuple[float, dict]:
    """train_runtime_s + evaluations after training (trainer_state.json log entries after the train_runtime one)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    after_train = 0.0
    state = run_dir / "trainer_state.json"
    if state.is_file():
        history = json.loads(state.read_text()).get("log_history", [])
        ended = next((i for i, row in enumerate(history) if "train_runtime" in row), len(history))
        after_train = sum(float(row.get("eval_runtime") or 0.0) for row in history[ended + 1:])
    return float(summary["train_runtime_s"]) + after_train, summary


def one_run(path: str, out: Path, name: str, steps: int, worker: WarmWorker | None) -> dict:
    run_dir = out / name
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "hf_optbench.run", RECIPE, *DEMO_OVERRIDES, "--max_steps", str(steps),
           "--eval_steps", str(steps), "--output_dir", str(run_dir)]
    env = {"PYTHONUNBUFFERED": "1", RUN_DIR_ENV: str(run_dir)}
    log = str(run_dir / "stdout.log")
    t0 = time.perf_counter()
    if worker is None:
        rc = execute(cmd, log, env, str(ROOT))
    else:
        rc = worker.execute(cmd, log, env, str(ROOT))
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{name} ({path}) exited {rc}:\n{(run_dir / 'stdout.log').read_text()[-3000:]}")
    own, summary = _own_work_s(run_dir)
    return {"path": path, "name": name, "wall_s": wall, "own_s": own, "overhead_s": wall - own,
            "final_train_loss": summary.get("final_train_loss"), "final_eval_loss": summary.get("final_eval_loss"),
            "peak_memory_bytes": summary.get("peak_memory_bytes")}


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(rows: list[dict], worker_start_s: float) -> str:
    lines = ["| path | runs | wall s per run | train+eval s | overhead s per run | peak RSS MiB |",
             "|---|---|---|---|---|---|"]
    med = {}
    for path in ("subprocess", "warm_worker"):
        rs = [r for r in rows if r["path"] == path]
        med[path] = statistics.median(r["overhead_s"] for r in rs)
        peaks = [r["peak_memory_bytes"] / 2**20 for r in rs if r["peak_memory_bytes"]]
        lines.append(f"| {path} | {len(rs)} | {_stats([r['wall_s'] for r in rs])} | "
                     f"{_stats([r['own_s'] for r in rs])} | {_stats([r['overhead_s'] for r in rs])} | "
                     f"{_stats(peaks) if peaks else '-'} |")
    saved = med["subprocess"] - med["warm_worker"]
    lines += ["", "median (range). overhead = wall - (train_runtime_s + evaluations after training).",
              f"warm worker start (imports, once per sweep): {worker_start_s:.2f} s; saves {saved:.2f} s per run "
              f"(median), so it has paid for itself after {worker_start_s / saved:.1f} runs" if saved > 0 else
              f"warm worker start (imports, once per sweep): {worker_start_s:.2f} s; saves nothing here"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=5, help="runs per path (interleaved)")
    p.add_argument("--steps", type=int, default=1, help="--max_steps of each run (one evaluation at the end)")
    p.add_argument("--warmup", type=int, default=1, help="pairs run first and not counted (data cache, page cache)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    reason = unavailable_reason({"type": "python", "executor": "local"})
    if reason:
        raise SystemExit(f"the warm worker is not available here: {reason}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_run_overhead_") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        worker = WarmWorker.start({**os.environ, "PYTHONUNBUFFERED": "1"}, str(ROOT), str(out / "worker.log"),
                                  kill_tree)
        worker_start_s = time.perf_counter() - t0
        try:
            for i in range(a.warmup + a.pairs):
                order = [("subprocess", None), ("warm_worker", worker)]
                for path, w in (order if i % 2 == 0 else order[::-1]):
                    row = one_run(path, out, f"{path}-{i}", a.steps, w)
                    if i >= a.warmup:
                        rows.append(row)
        finally:
            worker.close()
    losses = {(r["final_train_loss"], r["final_eval_loss"]) for r in rows}
    if a.json:
        print(json.dumps({"rows": rows, "worker_start_s": worker_start_s, "same_losses": len(losses) == 1},
                         indent=2))
    else:
        print(table(rows, worker_start_s))
        print(f"same seed, same losses on both paths: {'yes' if len(losses) == 1 else f'NO: {sorted(losses)}'}")
    return 0 if len(losses) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
