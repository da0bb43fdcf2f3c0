"""Muon with its Newton-Schulz iteration in bf16 and in fp32 on the demo's 1 token/param cell: does the precision
change the science? (issue 38, item 1)

The cell of ``recipes/sweeps/cpu_demo.yaml`` at 1 token per non-embedding parameter (``tiny``, batch 4 x 64, the
synthetic source S1), at the tuned values of a finished demo (``--tuned``: its ``tuned_hparams__tpp1.yaml``, which
gives every rung of AdamW's ladder its own rate and Muon its matrix and non-matrix rates): AdamW's ladder (0.25-4x
the budget) and Muon at ``ns_precision`` bf16 (torch.optim.Muon's own code) and fp32 (optim.muon_impl.MuonNS), each at
the same seeds. Per seed: Muon's final eval loss at each precision and its speedup off that seed's AdamW ladder, read
by the project's own rule (``measure.speedup.fit_ladder`` / ``speedup`` on ``study.budget.ladder_points``, as
``report.speedups.derive_speedups`` does). The paired differences (fp32 - bf16) get the verdict's words and
margins (``measure.verdict``: 0.01 nats, 3 % of speedup), their 95 % t interval and the smallest effect 3 seeds
could show. Two sweeps run (``hf-optbench sweep`` machinery, one process per run, warm workers, two at a time on two
cores): the ladder with Muon at bf16, then Muon at fp32.

    make demo    # first: writes runs/cpu_demo/tuned_hparams__tpp1.yaml
    python benchmarks/bench_ns_precision.py --tuned runs/cpu_demo/tuned_hparams__tpp1.yaml      # ~3 min idle
    python benchmarks/bench_ns_precision.py --seeds 1 --tokens_per_param 0.02 --multiples 0.5 1 2 \\
        --work /tmp/nsp --out /tmp/nsp/results                                                  # the test's

Writes ``<out>/ns_precision.md`` and ``<out>/ns_precision.json`` (default ``benchmarks/results``). Without a tuned
file every run takes the registry's cited values (`hf-optbench optimizers`), and the results say so.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import math
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recipes" / "sweeps" / "cpu_demo.yaml"
DEFAULT_TUNED = ROOT / "runs" / "cpu_demo" / "tuned_hparams__tpp1.yaml"
PRECISIONS = ("bf16", "fp32")


def demo_cell(tokens_per_param: float) -> dict[str, Any]:
    """The demo's sweep file at one data ratio, its tuning, its matrix and its ladder left out: base, overrides,
    per-size keys, launcher (read from recipes/sweeps/cpu_demo.yaml, so the cell stays the demo's)."""
    raw = yaml.safe_load(DEMO.read_text(encoding="utf-8"))
    return {"base": str(ROOT / raw["base"]), "overrides": dict(raw["overrides"]),
            "per_model_size": raw.get("per_model_size") or {}, "budget": {"tokens_per_param": tokens_per_param},
            "launcher": {**raw["launcher"], "progress_interval_s": 600}, "calibration": False}


def _sweep(work: Path, name: str, cell: dict[str, Any], optimizers: list[str], seeds: list[int], precision: str,
           multiples: list[float] | None, tuned: Path | None) -> Path:
    sweep = {**cell, "name": name, "output_dir": str(work / name),
             "matrix": {"optimizer": optimizers, "model_size": ["tiny"], "seed": seeds},
             "per_optimizer": {"muon": {"optimizer_kwargs": {"ns_precision": precision}}}}
    if tuned is not None:
        sweep["overrides"] = {**sweep["overrides"], "tuned_hparams_file": str(tuned)}
    if multiples:
        sweep["ladder"] = {"multiples": multiples, "optimizer": "adamw", "max_multiple": max(multiples)}  # no growth
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False), encoding="utf-8")
    return path


def run_cell(work: Path, tokens_per_param: float, seeds: list[int], multiples: list[float],
             tuned: Path | None) -> dict[str, list[dict[str, Any]]]:
    """Both sweeps, run (or continued: a finished run is kept); {precision: run records}, AdamW's ladder with bf16."""
    from hf_optbench.study.records import load_runs
    from hf_optbench.study.sweep import run_sweep

    work.mkdir(parents=True, exist_ok=True)
    cell = demo_cell(tokens_per_param)
    out: dict[str, list[dict[str, Any]]] = {}
    for precision in PRECISIONS:
        ladder = precision == PRECISIONS[0]
        path = _sweep(work, f"ns_{precision}", cell, ["adamw", "muon"] if ladder else ["muon"], seeds, precision,
                      multiples if ladder else None, tuned)
        log = io.StringIO()
        counts = run_sweep(path, stream=log)
        if set(counts) - {"completed", "diverged"}:
            raise SystemExit(f"sweep {path} did not finish: {counts}\n{log.getvalue()[-2000:]}")
        out[precision] = load_runs(work / f"ns_{precision}")
    return out


def speedups(records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per seed: Muon's final eval loss and speedup off that seed's AdamW ladder, at each precision."""
    from hf_optbench.measure.speedup import fit_ladder, speedup
    from hf_optbench.study.budget import budget_tokens, ladder_points

    ladder_runs = records[PRECISIONS[0]]
    rows = []
    for seed in sorted({r["seed"] for r in ladder_runs if r["optimizer"] == "muon"}):
        pts, reference = ladder_points(ladder_runs, "adamw", "tiny", seed)
        fit = fit_ladder([t for t, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None
        row: dict[str, Any] = {"seed": seed, "adamw_loss": reference, "ladder_method": fit.method if fit else None}
        for precision in PRECISIONS:
            (run,) = [r for r in records[precision] if r["optimizer"] == "muon" and r["seed"] == seed]
            loss = float(run["final_eval_loss"]) if run.get("final_eval_loss") is not None else math.nan
            s = speedup(fit, loss, budget_tokens(run), reference) if fit and math.isfinite(loss) else None
            row[precision] = {"final_eval_loss": loss, "speedup": s.value if s else None,
                              "censored": s.censored if s else None, "status": run["status"],
                              "implementation": run.get("optimizer_impl"),
                              "step_time_median_s": run.get("step_time_median_s")}
        rows.append(row)
    return rows


def compare(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The paired differences fp32 - bf16 (final eval loss in nats; speedup as a log ratio, seeds where both are
    measured, not bounds), with the verdict's words, margins and 95 % t interval, and the smallest effect the seeds
    could show (80 % power)."""
    from hf_optbench.measure.intervals import minimal_detectable_effect, t_interval
    from hf_optbench.measure.verdict import ALPHA, LOSS_MARGIN_NATS, SPEEDUP_MARGIN, stance

    b, f = PRECISIONS
    out = {}
    for key, margin, diff in (
            ("final_eval_loss", LOSS_MARGIN_NATS, lambda r: r[f]["final_eval_loss"] - r[b]["final_eval_loss"]),
            ("speedup", SPEEDUP_MARGIN, lambda r: math.log(r[f]["speedup"] / r[b]["speedup"])
             if r[f]["speedup"] and r[b]["speedup"] and not (r[f]["censored"] or r[b]["censored"]) else math.nan)):
        values = [d for d in map(diff, rows) if math.isfinite(d)]
        if not values:
            continue
        mean, sd, low, high = t_interval(values, ALPHA)
        out[key] = {"differences": values, "mean": mean, "sd": sd, "interval": [low, high], "margin": margin,
                    "word": stance(low, high, margin) if len(values) > 1 else "no difference (one seed)",
                    "smallest_detectable": minimal_detectable_effect(sd, len(values), ALPHA, margin)
                    if len(values) > 1 else math.inf, "scale": "nats" if key == "final_eval_loss" else "log ratio"}
    return out


def _fmt(value: Any, spec: str = "{:.4f}") -> str:
    return "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else spec.format(value)


def render(rows: list[dict[str, Any]], stats: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    b, f = PRECISIONS
    lines = [
        "# Muon's Newton-Schulz in bf16 and in fp32: the demo's 1 token/param cell",
        "",
        f"Generated by `benchmarks/bench_ns_precision.py` on {meta['date']}: {meta['machine']}, torch {meta['torch']}; "
        f"bf16 matmuls native here: {meta['bf16_native']} ({meta['capability']}). Tuned values: {meta['tuned']}. "
        f"Cell: tiny at {meta['tokens_per_param']:g} tokens per non-embedding parameter, batch 4 x 64, seeds "
        f"{meta['seeds']}; AdamW's ladder at {meta['multiples']} x the budget.",
        "",
        "| seed | AdamW x1 loss | Muon bf16 loss | Muon fp32 loss | speedup bf16 | speedup fp32 | ladder curve |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cens = {p: {"above": "≥ ", "below": "≤ "}.get(r[p]["censored"] or "", "") for p in PRECISIONS}
        lines.append(f"| {r['seed']} | {_fmt(r['adamw_loss'])} | {_fmt(r[b]['final_eval_loss'])} | "
                     f"{_fmt(r[f]['final_eval_loss'])} | {cens[b]}{_fmt(r[b]['speedup'], '{:.2f}')} | "
                     f"{cens[f]}{_fmt(r[f]['speedup'], '{:.2f}')} | {r['ladder_method'] or '–'} |")
    lines += ["", "Paired by seed, fp32 - bf16 (speedup as the log of their ratio); words and margins of "
              "`measure.verdict` (level: the 95 % interval inside the margin; no difference: neither shown):", ""]
    lines += ["| figure | mean difference | 95 % interval | margin | word | smallest detectable (80 % power) |",
              "|---|---|---|---|---|---|"]
    for key, s in stats.items():
        lines.append(f"| {key} ({s['scale']}) | {s['mean']:+.4f} | [{s['interval'][0]:+.4f}, {s['interval'][1]:+.4f}] "
                     f"| ±{s['margin']:.4f} | {s['word']} | {_fmt(s['smallest_detectable'])} |")
    impl = {p: next((r[p]["implementation"] for r in rows if r[p]["implementation"]), "–") for p in PRECISIONS}
    step = {p: statistics.median([r[p]["step_time_median_s"] for r in rows if r[p]["step_time_median_s"]] or [math.nan])
            for p in PRECISIONS}
    lines += ["", "Implementations, and the runs' median step (two runs at a time: a figure of this sweep, not a "
              "calibration; `benchmarks/bench_muon_step.py` measures steps alone):", ""]
    lines += [f"- {p}: `{impl[p]}`, median step {_fmt(step[p] * 1e3, '{:.2f}')} ms" for p in PRECISIONS]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tuned", default=str(DEFAULT_TUNED), help="a demo's tuned_hparams__tpp1.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tokens_per_param", type=float, default=1.0)
    parser.add_argument("--multiples", type=float, nargs="+", default=[0.5, 1, 2, 4])  # the demo's ladder
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_ns_precision"), help="where the runs go")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    tuned = Path(args.tuned).resolve()
    if not tuned.is_file():
        warnings.warn(f"no tuned file at {tuned}: every run takes the registry's cited values (hf-optbench "
                      "optimizers). Run `make demo` first for the demo's tuned values.", stacklevel=1)
        tuned = None
    records = run_cell(Path(args.work), args.tokens_per_param, args.seeds, args.multiples, tuned)
    rows = speedups(records)
    stats = compare(rows)
    from hf_optbench.optim.muon_precision import bf16_matmul_native
    from hf_optbench.study.calibration import machine_record

    native, seen = bf16_matmul_native("cpu")
    machine = machine_record()
    meta = {"date": _dt.date.today().isoformat(), "machine": f"{machine['cpu_model']} ({machine['cpu_capability']})",
            "torch": machine["torch"], "bf16_native": native, "capability": seen,
            "tuned": str(tuned) if tuned else "none: the registry's cited values",
            "tokens_per_param": args.tokens_per_param, "seeds": args.seeds, "multiples": args.multiples}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = render(rows, stats, meta)
    (out / "ns_precision.md").write_text(text, encoding="utf-8")
    (out / "ns_precision.json").write_text(json.dumps({"meta": meta, "rows": rows, "paired": stats}, indent=1,
                                                      default=str), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
