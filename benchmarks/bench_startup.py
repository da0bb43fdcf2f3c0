"""Start-up cost of the CLI: `hf-optbench --help`, `hf-optbench run --help` and recipe validation must not import
torch/transformers eagerly (targets: under 1 s; `run --help` under 0.5 s and 80 lines). Each command runs in a fresh
interpreter, N times; the median is reported with the lines it printed, next to a bare `python -c pass`,
`python -c "import torch"` and `run --help-all` (every TrainingArguments field, through transformers) for scale.

    python benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "lion_gpt2_large.yaml")
PROBE = "import sys; from hf_optbench.cli import main; main({args!r}); " \
        "print('HEAVY=' + ','.join(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))"

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "hf-optbench --help": [sys.executable, "-c", PROBE.format(args=["--help"])],
    "hf-optbench validate RECIPE": [sys.executable, "-c", PROBE.format(args=["validate", RECIPE])],
    "hf-optbench run --help": [sys.executable, "-c", PROBE.format(args=["run", "--help"])],
    "hf-optbench run --help-all": [sys.executable, "-c", PROBE.format(args=["run", "--help-all"])],
}


def time_command(cmd: list[str], repeats: int) -> tuple[float, str, int]:
    """(median wall seconds, heavy modules imported, lines printed besides the probe's own)."""
    times, out = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        # COLUMNS=80: help text laid out for the narrowest terminal, where it is longest
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "80"})
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd} failed: {proc.stderr[-2000:]}")
        out = proc.stdout
    heavy = next((line[6:] for line in out.splitlines() if line.startswith("HEAVY=")), "")
    lines = sum(1 for line in out.splitlines() if not line.startswith("HEAVY="))
    return statistics.median(times), heavy, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = []
    for name, cmd in COMMANDS.items():
        median, heavy, lines = time_command(cmd, a.repeats)
        rows.append({"command": name, "median_s": round(median, 3), "lines": lines,
                     "heavy_modules_imported": heavy if name.startswith("hf-optbench") else None})
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| command | median wall s | lines printed | torch/transformers/datasets imported |")
        print("|---|---|---|---|")
        for r in rows:
            heavy = "-" if r["heavy_modules_imported"] is None else (r["heavy_modules_imported"] or "none")
            print(f"| {r['command']} | {r['median_s']} | {r['lines']} | {heavy} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
