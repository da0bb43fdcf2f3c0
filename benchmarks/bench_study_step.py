"""Every registered optimizer at the cost of its arithmetic: its training step and its optimizer step alone over
AdamW's, at ``tiny`` and ``mini``, on this machine and on an emulated AVX2-only one.

The report's speedup in time is the speedup in tokens divided by the step-time ratio to AdamW, so a slow
implementation reads as a slow optimizer; this table is that ratio per optimizer, measured as the study's calibration
measures it (``hf_optbench.study.calibration``: the run's own resolved plan, forward and backward, clipping, the
optimizer's step, ``zero_grad``; every entry built afresh each round, interleaved over rounds, the first steps of a
round dropped) plus ``optimizer.step()`` alone on one backward's gradients (as many steps and rounds, interleaved
across the rows the same way; the median over rounds and the range of the per-round ratios to AdamW's).
Shape: the CPU demo's batch (4 x 64 tokens of the synthetic source's 32-token vocabulary), one torch thread.
Per round, each row's median step is divided by AdamW's of the same round; the table gives the median over all
steps and the range of those per-round ratios (a shared machine moves single figures; ratios within a round less).

Rows: every optimizer of the registry (``hf_optbench.optim.registry.OPTIMIZERS``) that runs on this machine (one
needing CUDA is named under the table as not measured on a CPU), Muon as ``ns_precision: auto`` resolves it plus both
precisions forced; the CPU study's six (:data:`STUDY`) are marked, with the study's bound on their step (1.5x AdamW's
at tiny) checked under the table. SOAP refreshes its
preconditioner (an eigendecomposition per preconditioned dimension) every ``precondition_frequency`` = 10 steps, as
its paper and README set it (Vyas et al. 2024, arXiv:2409.11321; nikhilvyas/SOAP README): 30 measured steps per
round hold three refreshes, so the median step is an Adam step in the eigenbasis and the mean carries the refresh;
the table gives both. Under ``--envs avx2`` (oneDNN, ATen and MKL held to AVX2, as ``bench_muon_step.py`` does) only
AdamW and Muon run (the rows whose arithmetic the ISA changes).

Before and after: the package measured is whichever ``hf_optbench`` Python imports. ``--before-pythonpath
<checkout>`` measures an older checkout interleaved with this one: one child process per round, package and
environment, the two packages alternating round by round, each child's rows rotated by its round; per-round ratios
then come from children that ran next to each other. (``PYTHONPATH=<checkout> ... --json before.json`` and
``--before before.json`` set a separate run's rows beside this one's instead.)

    python benchmarks/bench_study_step.py                                  # every registry optimizer, both sizes,
                                                                           # native and AVX2: ~10 min, 2 idle cores
    python benchmarks/bench_study_step.py --envs native --optimizers adamw muon lion adafactor soap \\
        schedule_free_adamw                                                # the CPU study's six only
    git worktree add /tmp/before 11c1d8d && python benchmarks/bench_study_step.py --clock cpu \
        --before-pythonpath /tmp/before --before-label "commit 11c1d8d"    # before and after, interleaved
    python benchmarks/bench_study_step.py --sizes tiny --rounds 1 --steps 2 --warmup 1 --envs native \\
        --optimizers adamw muon --out /tmp/ss                               # the test's

Writes ``<out>/study_step.md`` and ``<out>/study_step.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_muon_step import ENVS, optimizer_step_times, run_in_env  # noqa: E402
from bench_ns_precision import ROOT, demo_cell  # noqa: E402

STUDY = ("adamw", "muon", "lion", "adafactor", "soap", "schedule_free_adamw")  # recipes/sweeps/cpu_study.yaml's
STUDY_BOUND = 1.5  # a study optimizer's training step over AdamW's at tiny that the speedup in time can carry
AVX2_ROWS = ("adamw", "muon")
STEPS, WARMUP, ROUNDS = 30, 10, 3  # the calibration's (hf_optbench.study.calibration ROUNDS, STEPS_PER_ROUND, ...)


def registry_optimizers(cuda: bool) -> tuple[list[str], dict[str, str]]:
    """(the registry's optimizers this machine runs, AdamW first; {name: why skipped} for those needing CUDA)."""
    from hf_optbench.optim.registry import OPTIMIZERS

    names = ["adamw", *(n for n in OPTIMIZERS if n != "adamw")]
    skipped = {n: "needs CUDA: paged state in CUDA unified memory" for n in names
               if OPTIMIZERS[n].requires_cuda and not cuda}
    return [n for n in names if n not in skipped], skipped


def cpu_flags() -> dict[str, Any]:
    """lscpu's model name and the vector extensions among its flags (AVX-512 ones, AVX2): what the kernels may use."""
    model, flags = None, []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            model = value.strip()
        elif key.strip() == "Flags":
            flags = value.split()
    return {"model_name": model, "avx512": sorted(f for f in flags if f.startswith("avx512")),
            "avx2": "avx2" in flags}


def rows_for(optimizers: list[str], env: str) -> list[tuple[str, str | None]]:
    """(optimizer, forced ns_precision or None) per row: Muon as auto resolves it, then bf16 and fp32 forced (avx2:
    fp32 only beside auto; its bf16 is emulated at 10-20x, issue 38)."""
    out: list[tuple[str, str | None]] = []
    for opt in optimizers:
        if env == "avx2" and opt not in AVX2_ROWS:
            continue
        out.append((opt, None))
        if opt == "muon":
            out += [("muon", "fp32")] if env == "avx2" else [("muon", "bf16"), ("muon", "fp32")]
    return out


def _args(optimizer: str, size: str, precision: str | None) -> tuple[str, ...]:
    from hf_optbench.config.parse import to_tokens

    cell = demo_cell(1.0)
    extra = ["--optimizer_kwargs", json.dumps({"ns_precision": precision})] if precision else []
    if optimizer == "schedule_free_adamw":  # its warmup is inside the optimizer: no schedule (as a sweep sets it)
        extra += ["--schedule", "none"]
    return (cell["base"], *to_tokens(cell["overrides"]), "--per_device_train_batch_size", "4", "--optimizer",
            optimizer, "--model_size", size, *extra)


def _optimizer_step(entry: Any, steps: int, warmup: int) -> dict[str, Any]:
    """``optimizer.step()`` alone on one backward's gradients: median and mean seconds over ``steps`` after
    ``warmup`` (the mean carries SOAP's refresh every 10th step), and the Newton-Schulz precision it ran."""
    from hf_optbench.optim.registry import OPTIMIZERS

    if OPTIMIZERS[entry.optimizer].manual_step is not None:
        kept, precision = _steps_with_hook(entry, steps, warmup)
    else:
        kept, precision = optimizer_step_times(entry, steps, warmup)
    return {"optimizer_step_median_s": statistics.median(kept), "optimizer_step_mean_s": statistics.fmean(kept),
            "ns_precision": precision}


def _steps_with_hook(entry: Any, steps: int, warmup: int) -> tuple[list[float], str | None]:
    """``optimizer.step()`` alone, as :func:`bench_muon_step.optimizer_step_times` times it, for an optimizer whose
    loop must run its ``manual_step`` after each step (Sophia-G refuses a tenth step without a Hessian estimate): the
    hook runs untimed, and the backward's gradients, which it drops, are put back for the next step."""
    from hf_optbench.optim.registry import manual_step_hook
    from hf_optbench.study.calibration import build_case

    case = build_case(entry, Path("/nonexistent/bench-study-step"))
    x = case.batches[0]
    case.model(input_ids=x, labels=x).loss.backward()
    params = list(case.model.parameters())
    grads = [p.grad for p in params]
    after = manual_step_hook(case.optimizer)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        case.optimizer.step()
        times.append(time.perf_counter() - t0)
        after(case.model, case.optimizer, {"input_ids": x, "labels": x}, step=step, accumulation_steps=1,
              autocast_dtype=None)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    return times[warmup:], case.ns_precision


def child(env: str, optimizers: list[str], sizes: list[str], rounds: int, steps: int, warmup: int,
          clock: str = "wall", offset: int = 0) -> dict[str, Any]:
    """In the environment under test: every row's training step (interleaved rounds) and optimizer step alone.
    ``clock`` "cpu": the process's CPU time in place of the wall clock (``time.perf_counter`` is what the
    calibration and this script read, in this package and in older ones), which other processes on a shared machine
    do not add to (one torch thread: the process's CPU time is the step's). ``offset``: the rows' order rotated by
    that many (a parent running one round per child rotates it as the calibration does between rounds)."""
    if clock == "cpu":
        time.perf_counter = time.process_time  # type: ignore[assignment]
    import hf_optbench
    from hf_optbench.study.calibration import Entry, machine_record, measure, torch_threads

    plan = [(opt, size, p) for size in sizes for opt, p in rows_for(optimizers, env)]
    plan = plan[offset % len(plan):] + plan[:offset % len(plan)]
    entries = [Entry(opt, size, _args(opt, size, p)) for opt, size, p in plan]
    out = []
    with torch_threads(1):
        rows = measure(entries, rounds=rounds, steps=steps, warmup=warmup)
        # measure() keeps one row per distinct (optimizer, size, shape, precision): auto equals a forced row
        by_key = {(r["optimizer"], r["model_size"], r["ns_precision"]): r for r in rows}
        # the optimizer step alone, in as many rounds, interleaved across the rows as the training steps were
        alone: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(entries))}
        for r in range(rounds):
            for i in [(r + k) % len(entries) for k in range(len(entries))]:
                alone[i].append(_optimizer_step(entries[i], steps, warmup))
        for i, ((opt, size, forced), _) in enumerate(zip(plan, entries, strict=True)):
            per_round = alone[i]
            row = dict(by_key[(opt, size, per_round[0]["ns_precision"])])
            out.append({**row, "row": opt if forced is None else f"{opt} {forced}", "forced": forced,
                        "optimizer_step_round_s": [a["optimizer_step_median_s"] for a in per_round],
                        "optimizer_step_median_s": statistics.median(a["optimizer_step_median_s"] for a in per_round),
                        "optimizer_step_mean_s": statistics.fmean(a["optimizer_step_mean_s"] for a in per_round)})
    return {"env": env, "variables": ENVS[env], "machine": {**machine_record(), "lscpu": cpu_flags()}, "clock": clock,
            "package": str(Path(hf_optbench.__file__).resolve().parent), "rows": out}


def _run_env(env: str, args: argparse.Namespace, *, rounds: int | None = None, offset: int = 0,
             pythonpath: str | None = None) -> dict[str, Any]:
    """One child in ``env`` (``pythonpath``: the package it imports, else this process's)."""
    child = ["--child", env, "--optimizers", *args.optimizers, "--sizes", *args.sizes, "--rounds",
             str(rounds or args.rounds), "--steps", str(args.steps), "--warmup", str(args.warmup), "--clock",
             args.clock, "--offset", str(offset)]
    return run_in_env(__file__, env, child, pythonpath)


def merge(children: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from children that each measured one round: the rounds' medians side by side, each figure the
    median over rounds (the optimizer step's mean: the mean over rounds)."""
    rows = []
    for first in children[0]["rows"]:  # each child's rows are in its own rotated order: matched by name and size
        same = [next(r for r in c["rows"] if (r["row"], r["model_size"]) == (first["row"], first["model_size"]))
                for c in children]
        rounds = [m for r in same for m in r["step_time_round_medians_s"]]
        alone = [r["optimizer_step_median_s"] for r in same]
        rows.append({**first, "step_time_round_medians_s": rounds, "step_time_median_s": statistics.median(rounds),
                     "spread": [min(rounds), max(rounds)], "optimizer_step_round_s": alone,
                     "optimizer_step_median_s": statistics.median(alone),
                     "optimizer_step_mean_s": statistics.fmean(r["optimizer_step_mean_s"] for r in same)})
    return {**children[0], "rows": rows}


def interleaved(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(after, before): per environment, one child per round and package, the two packages alternating (after
    first in even rounds), each child's rows rotated by its round, so a change of the machine's load falls on both."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for env in args.envs:
            order = [("after", None), ("before", args.before_pythonpath)]
            for which, path in order if r % 2 == 0 else order[::-1]:
                runs.setdefault((which, env), []).append(_run_env(env, args, rounds=1, offset=r, pythonpath=path))
    args.children = runs  # kept in the JSON file as measured
    return ([merge(runs[("after", env)]) for env in args.envs], [merge(runs[("before", env)]) for env in args.envs])


def _range(mine: list[float] | None, base: list[float] | None) -> list[float] | None:
    if not mine or not base:
        return None
    per_round = [x / y for x, y in zip(mine, base, strict=True)]
    return [min(per_round), max(per_round)]


def ratios(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row over AdamW's at its size and environment: the medians' ratio, the per-round ratios' range, the
    optimizer step alone over AdamW's."""
    base = {r["model_size"]: r for r in res["rows"] if r["row"] == "adamw"}
    out = []
    for r in res["rows"]:
        a = base[r["model_size"]]
        per_round = [x / y for x, y in zip(r["step_time_round_medians_s"], a["step_time_round_medians_s"], strict=True)]
        out.append({"env": res["env"], "size": r["model_size"], "row": r["row"], "ns_precision": r["ns_precision"],
                    "step_ms": 1e3 * r["step_time_median_s"], "ratio": r["step_time_median_s"] / a["step_time_median_s"],
                    "round_range": [min(per_round), max(per_round)],
                    # the step with the optimizer's mean in place of its median (SOAP's refresh amortised)
                    "mean_ratio": (r["step_time_median_s"] + r["optimizer_step_mean_s"] - r["optimizer_step_median_s"])
                    / (a["step_time_median_s"] + a["optimizer_step_mean_s"] - a["optimizer_step_median_s"]),
                    "opt_ms": 1e3 * r["optimizer_step_median_s"], "opt_mean_ms": 1e3 * r["optimizer_step_mean_s"],
                    "opt_ratio": r["optimizer_step_median_s"] / a["optimizer_step_median_s"],
                    "opt_round_range": _range(r.get("optimizer_step_round_s"), a.get("optimizer_step_round_s"))})
    return out


def arithmetic(size: str, tokens: int = 4 * 64, ns_steps: int = 5) -> dict[str, float]:
    """GFLOP per step over GPT-2's hidden matrices at ``size`` (an (m, n) matrix, m <= n once oriented):
    their forward and backward, 6 m n T for T tokens; Muon's Newton-Schulz, ns_steps x (4 m^2 n + 2 m^3) (the Gram
    matrix, its square, the product with X); SOAP's per-step preconditioner work, 6 m n (m + n) (the gradient
    projected into the eigenbasis and the update back, 2 (m^2 n + m n^2) each, and both statistics updated, as
    much again); the reason the two cost what they cost at the demo's 256-token batch."""
    from hf_optbench.models import GPT2_SIZES

    d, layers = GPT2_SIZES[size]["n_embd"], GPT2_SIZES[size]["n_layer"]
    shapes = [(d, 3 * d), (d, d), (d, 4 * d), (d, 4 * d)] * layers
    return {"forward_backward": sum(6 * m * n * tokens for m, n in shapes) / 1e9,
            "newton_schulz": sum(ns_steps * (4 * m * m * n + 2 * m ** 3) for m, n in shapes) / 1e9,
            "soap": sum(6 * m * n * (m + n) for m, n in shapes) / 1e9}


def _cells(x: dict[str, Any] | None) -> str:
    if x is None:
        return "– | – | – | –"
    ns = f" ({x['ns_precision']})" if x["row"] == "muon" and x["ns_precision"] else ""
    opt = x.get("opt_round_range")
    spread = f" [{opt[0]:.1f}, {opt[1]:.1f}]" if opt else ""
    return (f"{x['step_ms']:.2f}{ns} | x{x['ratio']:.2f} [{x['round_range'][0]:.2f}, {x['round_range'][1]:.2f}] | "
            f"x{x['mean_ratio']:.2f} | {x['opt_ms']:.2f} (mean {x['opt_mean_ms']:.2f}; x{x['opt_ratio']:.1f}{spread})")


def _machine(m: dict[str, Any]) -> str:
    """The CPU as lscpu names it, its AVX-512 and AVX2 flags, torch's kernel capability."""
    cpu = m.get("lscpu") or {}
    avx = ", ".join(filter(None, ["AVX-512 (" + " ".join(cpu["avx512"]) + ")" if cpu.get("avx512") else "no AVX-512",
                                  "AVX2" if cpu.get("avx2") else "no AVX2"])) if cpu else ""
    name = cpu.get("model_name") or m["cpu_model"]
    return f"{name} ({avx}; torch's CPU capability {m['cpu_capability']})" if avx else f"{name} ({m['cpu_capability']})"


def bound_line(after: list[dict[str, Any]]) -> str:
    """Which of the CPU study's optimizers exceed :data:`STUDY_BOUND` x AdamW's training step at tiny (native), with
    their optimizer step alone as the measured reason."""
    rows = [x for x in after if x["env"] == "native" and x["size"] == "tiny" and x["row"] in STUDY]
    over = [x for x in rows if x["ratio"] > STUDY_BOUND]
    within = ", ".join(f"{x['row']} x{x['ratio']:.2f}" for x in rows if x["ratio"] <= STUDY_BOUND)
    text = f"The CPU study's optimizers within {STUDY_BOUND}x AdamW's training step at tiny: {within or 'none'}."
    for x in over:
        adamw = next(a for a in rows if a["row"] == "adamw")
        text += (f" Over it: {x['row']} x{x['ratio']:.2f} (amortised x{x['mean_ratio']:.2f}), its optimizer step alone "
                 f"{x['opt_ms']:.2f} ms (mean {x['opt_mean_ms']:.2f}) of a {x['step_ms']:.2f} ms step, against "
                 f"AdamW's {adamw['opt_ms']:.2f} ms.")
    return text


def render(after: list[dict[str, Any]], meta: dict[str, Any], before: list[dict[str, Any]] | None,
           machine: dict[str, Any]) -> str:
    m = machine
    lines = [
        "# Every registered optimizer's step over AdamW's (before and after)" if before else
        "# Every registered optimizer's step over AdamW's",
        "",
        f"Generated by `benchmarks/bench_study_step.py` on {meta['date']}: {_machine(m)}, "
        f"torch {m['torch']}, one thread; the demo's batch 4 x 64 (32-token vocabulary); {meta['rounds']} interleaved "
        f"rounds of {meta['steps']} steps after {meta['warmup']} dropped; "
        + ("the process's CPU time (`--clock cpu`: other processes do not add to it). " if meta.get("clock") == "cpu"
           else "wall clock. ") + f"{meta['load']} Training step: forward, "
        "backward, clipping, optimizer step, zero_grad (hf_optbench.study.calibration), its median over all rounds "
        "and, in brackets, the range of the per-round ratios to AdamW's; amortised: the same ratio with each optimizer "
        "step's mean in place of its median (SOAP's preconditioner refresh every 10th step is in the mean, not the "
        "median); optimizer step: `optimizer.step()` "
        "alone, median ms (mean) and its ratio to AdamW's [the range of the per-round ratios]. avx2: oneDNN, ATen and MKL held to AVX2 (" + " ".join(
            f"{k}={v}" for k, v in ENVS["avx2"].items()) + "), as on a CPU without AVX-512.",
        "",
    ]
    if before:
        how = ("measured interleaved with it (one child process per round and package, alternating)"
               if meta.get("interleaved") else "measured in a run of its own")
        lines += [f"Before: the package at {meta['before_label']}, {how}; after: this commit's. The optimizer step's "
                  "range in brackets: per-round ratios to AdamW's, where rounds ran in children of their own.", ""]
    head = "| env | size | optimizer | step ms | x AdamW [per round] | x AdamW amortised | optimizer step ms (x AdamW) |"
    if before:
        head = ("| env | size | optimizer | before: step ms | x AdamW [per round] | x AdamW amortised | optimizer step ms "
                "| after: step ms | x AdamW [per round] | x AdamW amortised | optimizer step ms (x AdamW) |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    old = {(x["env"], x["size"], x["row"]): x for x in before or []}
    for x in after:
        mark = " (study)" if x["row"].split()[0] in STUDY else ""
        key = f"| {x['env']} | {x['size']} | {x['row']}{mark} | "
        lines.append(key + (_cells(old.get((x["env"], x["size"], x["row"]))) + " | " if before else "")
                     + _cells(x) + " |")
    if meta.get("skipped"):
        lines += ["", "Not measured here: " + "; ".join(f"{n} ({why})" for n, why in meta["skipped"].items()) + "."]
    lines += ["", bound_line(after)]
    lines += ["", "Arithmetic per step over the hidden matrices at this batch (256 tokens; `arithmetic()` in the "
              "script), GFLOP:"]
    for size in meta["sizes"]:
        a = arithmetic(size)
        lines.append(f"- {size}: forward and backward {a['forward_backward']:.3f}; Muon's Newton-Schulz "
                     f"{a['newton_schulz']:.3f} ({a['newton_schulz'] / a['forward_backward']:.2f}x); SOAP's "
                     f"preconditioner per step {a['soap']:.3f} ({a['soap'] / a['forward_backward']:.2f}x).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizers", nargs="+", help="default: every registry optimizer this machine runs")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--json", help="write this run's measurements here only (no table): a 'before' to compare")
    parser.add_argument("--before", help="a --json file of an older checkout, set beside this run's rows")
    parser.add_argument("--before-label", default="an older checkout")
    parser.add_argument("--before-pythonpath", help="an older checkout's directory: measured interleaved with this "
                        "one, one child per round and package, alternating")
    parser.add_argument("--load", default="", help="what else ran on the machine, for the header")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU time, which other processes do not add to (a shared machine)")
    parser.add_argument("--child", choices=list(ENVS), help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    skipped: dict[str, str] = {}
    if args.optimizers is None:
        import torch

        args.optimizers, skipped = registry_optimizers(torch.cuda.is_available())
    if args.child:
        print(json.dumps(child(args.child, args.optimizers, args.sizes, args.rounds, args.steps, args.warmup,
                                args.clock, args.offset)))
        return 0
    before_results = None
    if args.before_pythonpath:
        results, before_results = interleaved(args)
    else:
        results = [_run_env(env, args) for env in args.envs]
    meta = {"date": _dt.date.today().isoformat(), "sizes": args.sizes, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup, "clock": args.clock, "interleaved": bool(args.before_pythonpath), "load": args.load, "before_label": args.before_label, "skipped": skipped,
            "argv": sys.argv[1:] if argv is None else argv}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1), encoding="utf-8")
        return 0
    before = None
    if before_results is not None:
        before = [x for res in before_results for x in ratios(res)]
    elif args.before:
        before = [x for res in json.loads(Path(args.before).read_text(encoding="utf-8"))["results"]
                  for x in ratios(res)]
    after = [x for res in results for x in ratios(res)]
    text = render(after, meta, before, results[0]["machine"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study_step.md").write_text(text, encoding="utf-8")
    (out / "study_step.json").write_text(json.dumps({"meta": meta, "results": results, "before": before,
                                                     "before_results": before_results,
                                                     "children": {f"{k[0]} {k[1]}": v for k, v in
                                                                  getattr(args, "children", {}).items()}},
                                                    indent=1), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
