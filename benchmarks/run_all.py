"""Run every benchmark in sequence and write their printed tables to benchmarks/RESULTS.md, headed by the date,
the machine and the exact commands, so that the README's figures can be checked and rerun.

    python benchmarks/run_all.py            # ~10-15 min on 2 CPU cores
    python benchmarks/run_all.py --quick    # fewer rounds/steps, ~5 min

Each benchmark is its own process (clean memory figures, no shared allocator state). Run it on a quiet machine:
the figures are medians and ratios measured within one run, but other load still widens their spread.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

FULL = [
    ("Harness overhead (hf_optbench vs a plain PyTorch loop)", ["bench_harness.py"]),
    ("Harness overhead at the CPU demo's shape, one thread (issue 42: at most 1.15x)",
     ["bench_harness.py", "--shapes", "demo", "--threads", "1", "--steps", "200", "--skip", "20"]),
    ("One training step at the CPU demo's shape, part by part", ["bench_step_breakdown.py"]),
    ("torch.compile at the CPU demo's shape: compile time, step time, results", ["bench_compile.py"]),
    ("Callback overhead (with vs without our callbacks)", ["bench_callbacks.py"]),
    ("Optimizer step cost on a GPT-2 124M parameter set", ["bench_optimizer_step.py", "--threads", "1"]),
    ("Data pipeline: tokenize + pack throughput and peak RSS", ["bench_data.py"]),
    ("CLI start-up", ["bench_startup.py"]),
    ("Data cache checksums: write + verify cost", ["bench_cache_verify.py"]),
    ("Verdict error rates (simulation)", ["verdict_rates.py"]),
    ("Speedup protocol: coverage, null false-verdict rate and power (simulation)", ["speedup_rates.py"]),
    ("Per-run fixed cost of a local sweep (subprocess vs warm worker)", ["bench_run_overhead.py"]),
    ("GPU throughput and MFU", ["bench_gpu_mfu.py"]),
    ("CPU MFU per size against a measured GEMM peak; gelu_new vs fused tanh GELU", ["bench_cpu_mfu.py"]),
]
QUICK = {
    "bench_harness.py": ["--rounds", "2", "--steps", "20"],
    "bench_callbacks.py": ["--rounds", "3", "--steps", "25"],
    "bench_data.py": ["--mb", "2", "--workers", "1"],
    "bench_startup.py": ["--repeats", "3"],
    "bench_cache_verify.py": ["--mb", "5", "--repeats", "2"],
    "verdict_rates.py": ["--trials", "200"],
    "speedup_rates.py": ["--trials", "100"],
    "bench_run_overhead.py": ["--pairs", "2"],
    "bench_cpu_mfu.py": ["--rounds", "2", "--steps", "8"],
    "bench_step_breakdown.py": ["--rounds", "2", "--steps", "100"],
    "bench_compile.py": ["--steps", "100"],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", default=str(HERE / "RESULTS.md"))
    a = p.parse_args(argv)
    import torch

    lines = [
        "# Benchmark results",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}; "
        f"python {platform.python_version()}, torch {torch.__version__}",
        f"- command: `python benchmarks/run_all.py{' --quick' if a.quick else ''}`",
        "",
    ]
    failed = 0
    for title, cmd in FULL:
        extra = QUICK.get(cmd[0], []) if a.quick else []
        full_cmd = [sys.executable, str(HERE / cmd[0]), *cmd[1:], *extra]
        shown = "python benchmarks/" + " ".join([cmd[0], *cmd[1:], *extra])
        print(f"== {title}: {shown}", flush=True)
        proc = subprocess.run(full_cmd, capture_output=True, text=True, cwd=HERE.parent)
        # drop library start-up chatter (DeepSpeed's accelerator banner is printed to stdout at import)
        out = "\n".join(line for line in proc.stdout.splitlines()
                        if not line.startswith("[20") and "real_accelerator" not in line).strip()
        print(out, flush=True)
        lines += [f"## {title}", "", f"`{shown}`", ""]
        if proc.returncode != 0:
            failed += 1
            lines += ["```", f"FAILED (exit {proc.returncode})", proc.stderr.strip()[-3000:], "```", ""]
        else:
            lines += [out if "|" in out else f"```\n{out}\n```", ""]
    Path(a.output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"written: {a.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
