"""Where a training step's time goes at the CPU demo's shape: nanoGPT's plain loop against the run's own Trainer
path, part by part, so that the difference is assigned (issue 38 item 2, issue 42).

The shape is the demo's AdamW comparison run (recipes/sweeps/cpu_demo.yaml: `tiny`, micro-batch 4 x 64 tokens,
32-token vocabulary, its own synthetic data) on one thread. The Trainer side is what ``hf-optbench run`` assembles
(``benchmarks/run_path.py``: the plan, the TrainingArguments rendered from it, every callback of a run); the plain
side is nanoGPT's loop over the same training blocks with the same model init and optimizer. Each part of a step
is timed around the method that does it (exclusive of the parts timed inside it: ``callback_probes.Sections``),
per interval between two loss logs (``--logging-steps`` apart, a run's 10 by default) over its steps; what no
timer covers is the Trainer's loop itself. Evaluation
runs once per run (the demo evaluates at its end only): it is timed apart, per run, and spread over the demo's
391 steps for comparison.

    python benchmarks/bench_step_breakdown.py                     # 5 rounds x 300 steps, writes results/step_breakdown.*
    python benchmarks/bench_step_breakdown.py --rounds 1 --steps 30 --out-dir /tmp/bd     # a quick check

The timers themselves cost about a microsecond each (some 40 per step): the figures are for assigning the
difference, while ``bench_harness.py --shapes demo`` gives the untimed ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import DefaultFlowCallback  # noqa: E402

import run_path  # noqa: E402  (beside this script)
from callback_probes import Sections  # noqa: E402
from pinned_malloc import malloc_setting, reexec_pinned  # noqa: E402
from run_path import (  # noqa: E402
    SyncClock,
    demo_run_args,
    machine_facts,
    per_step,
    plain_loop,
    plain_model,
    project_trainer,
    write_results,
)

DEMO_STEPS = 391  # the demo's compared budget at 1 token/param (recipes/sweeps/cpu_demo.yaml)
RESULTS = Path(__file__).resolve().parent / "results"
GC = "Python's garbage collector"

# (part, what it covers): the order of the table; a part one side lacks is 0 there
PARTS = (
    ("data", "the next batch: DataLoader, collator, device placement (plain: a slice of the blocks tensor)"),
    ("forward", "the model's forward and loss (Trainer: compute_loss)"),
    ("backward", "backward (Trainer: accelerator.backward)"),
    ("clip_grad_norm", "clipping at 1.0 (Trainer: _clip_grad_norm through accelerate)"),
    ("optimizer step", "AdamW's step (Trainer: inside accelerate's AcceleratedOptimizer)"),
    ("optimizer wrapper", "accelerate's AcceleratedOptimizer.step around it"),
    ("scheduler step", "the learning-rate schedule's step (Trainer: through AcceleratedScheduler)"),
    ("zero_grad", "gradients dropped"),
    ("loss log (sync)", "the loss read back: plain loss.item() every log_interval"),
    ("Trainer: training_step rest", "training_step besides forward and backward: model.train(), inputs"),
    ("Trainer: floating_point_ops", "the FLOP count per micro-batch (num_parameters walks every module)"),
    ("Trainer: grad norm, lr, tokens", "_get_grad_norm, _get_learning_rate, _track_num_input_tokens"),
    ("Trainer: logging", "_maybe_log_save_evaluate and log(): loss and grad norm read, log dict, log_history"),
    ("Trainer: callback dispatch", "CallbackHandler's loop over the callbacks of each event"),
    ("Trainer: DefaultFlowCallback", "the Trainer's own callback (when to log, evaluate, save, stop)"),
    ("Python's garbage collector", "its collections, wherever they fell, untrimmed (a run freezes start-up's "
     "objects)"),
    ("Trainer: loop", "what no timer covers: the Trainer's loop between the parts above"),
)


def _instrument(trainer: Any, sections: Sections) -> None:
    """Time the Trainer's parts (instance attributes, so ``self.part(...)`` finds the timed one) and each callback."""
    for attr, name in (("get_batch_samples", "data"), ("compute_loss", "forward"),
                       ("training_step", "Trainer: training_step rest"),
                       ("floating_point_ops", "Trainer: floating_point_ops"),
                       ("_track_num_input_tokens", "Trainer: grad norm, lr, tokens"),
                       ("_clip_grad_norm", "clip_grad_norm"), ("_get_grad_norm", "Trainer: grad norm, lr, tokens"),
                       ("_get_learning_rate", "Trainer: grad norm, lr, tokens"),
                       ("_maybe_log_save_evaluate", "Trainer: logging"), ("log", "Trainer: logging")):
        sections.wrap(trainer, attr, name)
    sections.wrap(trainer.accelerator, "backward", "backward")
    sections.wrap(trainer.callback_handler, "call_event", "Trainer: callback dispatch")
    for cb in trainer.callback_handler.callbacks:
        name = "Trainer: DefaultFlowCallback" if isinstance(cb, DefaultFlowCallback) else \
            f"callback: {type(cb).__name__.lstrip('_')}"
        sections.wrap_callback(cb, name)


class _WrapAtBegin(TrainerCallback):
    """At train begin (the optimizer, scheduler and model are the prepared ones by then): time their steps."""

    def __init__(self, sections: Sections) -> None:
        super().__init__()
        self.sections = sections

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        s = self.sections
        inner = getattr(optimizer, "optimizer", optimizer)
        if inner is not optimizer:
            s.wrap(optimizer, "step", "optimizer wrapper")
        s.wrap(inner, "step", "optimizer step")
        s.wrap(lr_scheduler, "step", "scheduler step")
        s.wrap(model, "zero_grad", "zero_grad")


def _summarise(sections: Sections, stamps: list[tuple[int, float]], skip: int) -> dict[str, Any]:
    """Per part: its mean exclusive ms per step over the timed intervals (10 % trimmed at each end: preemption on a
    shared machine; the garbage collector's untrimmed, since it runs in few steps); the step median; the untimed
    rest; the untrimmed mean step (what a run's wall time pays)."""
    steps = per_step(stamps, skip)
    # interval i (0-based, after the first stamp) ends at stamps[i + 1]; sections.intervals[i + 1] holds it
    kept = [i for i, (s0, _) in enumerate(stamps[:-1]) if s0 >= skip and stamps[i + 1][0] > s0]
    spans = [stamps[i + 1][0] - stamps[i][0] for i in kept]  # steps per interval (a sync every logging_steps)
    intervals = [{k: v / n for k, v in sections.intervals[i + 1].items()} for i, n in zip(kept, spans, strict=True)]
    totals = [(stamps[i + 1][1] - stamps[i][1]) / n for i, n in zip(kept, spans, strict=True)]

    def trimmed(values: list[float]) -> float:
        values = sorted(values)
        cut = len(values) // 10
        kept = values[cut:len(values) - cut] or values
        return statistics.fmean(kept)

    names = sorted({k for iv in intervals for k in iv})
    parts = {k: (statistics.fmean if k == GC else trimmed)([iv.get(k, 0.0) for iv in intervals]) for k in names}
    parts["Trainer: loop" if "forward" in parts and "Trainer: logging" in parts else "plain: loop"] = \
        trimmed([t - sum(iv.values()) for t, iv in zip(totals, intervals, strict=True)])
    return {"median_step_s": statistics.median(steps), "mean_step_s": trimmed(totals), "parts_s": parts,
            "mean_all_s": statistics.fmean(totals), "intervals": len(intervals)}


def run_plain(steps: int, skip: int, out: str, logging_steps: int) -> dict[str, Any]:
    """nanoGPT's loop on the demo run's model, optimizer (as its plan builds it), schedule and training blocks."""
    from hf_optbench.optim.schedules import build_scheduler

    trainer, _, prepared, built = project_trainer(demo_run_args(steps, logging_steps, out))
    model = plain_model(prepared.model)
    blocks = torch.tensor(prepared.train_dataset[: 4 * (steps + 1)]["input_ids"], dtype=torch.long)
    args = trainer.args
    sched = build_scheduler("gpt3_cosine", built.optimizer, num_training_steps=steps, warmup_steps=0.1)
    sections = Sections(run_path.clock)
    watcher = sections.watch_gc()
    stamps = plain_loop(model, blocks, args.per_device_train_batch_size, built.optimizer, sched, steps, logging_steps,
                        timed=sections.time, on_sync=lambda _step: sections.cut(), grad_clip=args.max_grad_norm)
    gc.callbacks.remove(watcher)
    return _summarise(sections, stamps, skip)


def run_trainer(steps: int, skip: int, out: str, logging_steps: int) -> dict[str, Any]:
    """The demo run's Trainer as ``hf-optbench run`` builds it, every part timed; then its evaluations, once."""
    import contextlib
    import io

    from hf_optbench.run.step_cost import start_up_heap_frozen
    from hf_optbench.run.train import tuning_loss

    trainer, _, prepared, _ = project_trainer(demo_run_args(steps, logging_steps, out))
    sections, clock = Sections(run_path.clock), SyncClock()
    _instrument(trainer, sections)
    trainer.add_callback(_WrapAtBegin(sections))  # after the instrumenting: its own time is not a part
    original = clock.on_log

    def stamp_and_cut(args, state, control, logs=None, **kwargs):
        original(args, state, control, logs=logs, **kwargs)
        if logs and "loss" in logs:
            sections.cut()

    clock.on_log = stamp_and_cut
    trainer.add_callback(clock)
    watcher = sections.watch_gc()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's console lines
        with start_up_heap_frozen():  # as hf_optbench.run.train trains
            trainer.train()
        gc.callbacks.remove(watcher)
        t0 = run_path.clock()
        trainer.evaluate()
        t1 = run_path.clock()
        tuning_loss(trainer, prepared)
        t2 = run_path.clock()
    result = _summarise(sections, clock.stamps, skip)
    result["eval_s"] = {"evaluate (eval split, accuracy)": t1 - t0, "tuning-split loss": t2 - t1}
    return result


def measure(rounds: int, steps: int, skip: int, logging_steps: int = 10) -> dict[str, Any]:
    """Rounds of the plain loop and the Trainer path, alternating which runs first; medians over rounds."""
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "hf_optbench": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in (("plain", "hf_optbench") if r % 2 == 0 else ("hf_optbench", "plain")):
                out = str(Path(tmp) / f"{name}{r}")
                runs[name].append((run_plain if name == "plain" else run_trainer)(steps, skip, out, logging_steps))
    out: dict[str, Any] = {"rounds": rounds, "steps": steps, "skip": skip, "threads": torch.get_num_threads(),
                           "logging_steps": logging_steps}
    for name, rs in runs.items():
        keys = sorted({k for r in rs for k in r["parts_s"]})
        out[name] = {
            "median_step_ms": _ms(statistics.median(r["median_step_s"] for r in rs)),
            "median_step_ms_per_round": [_ms(r["median_step_s"]) for r in rs],
            "mean_step_ms": _ms(statistics.median(r["mean_step_s"] for r in rs)),
            "mean_all_ms": _ms(statistics.median(r["mean_all_s"] for r in rs)),
            "parts_ms": {k: _ms(statistics.median(r["parts_s"].get(k, 0.0) for r in rs), 3) for k in keys},
        }
    evals = [r["eval_s"] for r in runs["hf_optbench"]]
    out["eval_per_run_s"] = {k: round(statistics.median(e[k] for e in evals), 3) for k in evals[0]}
    ratios = sorted(h["median_step_s"] / p["median_step_s"] for h, p in zip(runs["hf_optbench"], runs["plain"],
                                                                             strict=True))
    out["ratio"] = {"median": round(statistics.median(ratios), 4), "range": [round(ratios[0], 4),
                                                                             round(ratios[-1], 4)]}
    return out


def _ms(seconds: float, digits: int = 2) -> float:
    return round(seconds * 1e3, digits)


def render(result: dict[str, Any], command: str) -> str:
    """The markdown results file: the step by part, plain against the Trainer path, and evaluation per run."""
    plain, ours = result["plain"], result["hf_optbench"]
    load = result.get("load_average")
    lines = [
        "# One training step at the CPU demo's shape, part by part (generated by benchmarks/bench_step_breakdown.py)",
        "",
        f"`{command}`: {result['date']}, {result['machine']}, torch {result['torch']}, {result['threads']} "
        f"thread(s), malloc thresholds {result['malloc']}, load average before the run {load}, clock "
        f"{result.get('clock', 'wall')} ({'CPU time of the process' if result.get('clock') == 'cpu' else 'wall time'}). "
        f"{result['rounds']} rounds x {result['steps']} steps per side, a loss read every "
        f"{result.get('logging_steps', 1)} step(s), the first {result['skip']} dropped; each figure is the median "
        "over rounds of a part's mean exclusive time per step (10 % trimmed).",
        "",
        f"Median step: plain loop {plain['median_step_ms']} ms, hf_optbench's Trainer path {ours['median_step_ms']} "
        f"ms; ratio {result['ratio']['median']} (per-round range {result['ratio']['range'][0]}-"
        f"{result['ratio']['range'][1]}). Per round, plain: {plain['median_step_ms_per_round']}; "
        f"hf_optbench: {ours['median_step_ms_per_round']}.",
        "",
        "| part | plain ms | hf_optbench ms | difference ms | what it covers |",
        "|---|---:|---:|---:|---|",
    ]
    known = dict(PARTS)
    names = [p for p, _ in PARTS] + sorted(k for k in {**plain["parts_ms"], **ours["parts_ms"]} if k not in known)
    for name in names:
        a, b = plain["parts_ms"].get(name, 0.0), ours["parts_ms"].get(name, 0.0)
        if name == "Trainer: loop":
            a = plain["parts_ms"].get("plain: loop", 0.0)
        if name == "plain: loop" or (a == 0.0 and b == 0.0):
            continue
        what = known.get(name, "one of hf_optbench's callbacks, every event" if name.startswith("callback") else "")
        lines.append(f"| {name} | {a:.3f} | {b:.3f} | {b - a:+.3f} | {what} |")
    lines.append(f"| **step (mean of the parts)** | {plain['mean_step_ms']:.3f} | {ours['mean_step_ms']:.3f} | "
                 f"{ours['mean_step_ms'] - plain['mean_step_ms']:+.3f} | trimmed as the parts |")
    lines.append(f"| **step, every step** | {plain['mean_all_ms']:.3f} | {ours['mean_all_ms']:.3f} | "
                 f"{ours['mean_all_ms'] - plain['mean_all_ms']:+.3f} | untrimmed: what a run's wall time pays |")
    lines += ["", "Evaluation, once per run (the demo evaluates at the end only), seconds and ms per step of the "
              f"demo's {DEMO_STEPS}-step run:", ""]
    for k, v in result["eval_per_run_s"].items():
        lines.append(f"- {k}: {v} s ({v / DEMO_STEPS * 1e3:.2f} ms per step)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, reexec: bool = False) -> int:
    """``reexec``: allowed to replace the process to pin malloc (the script's entry point; not for callers)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs both sides once (default 5)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--skip", type=int, default=20, help="first steps dropped per run: warm-up (default 20)")
    p.add_argument("--logging-steps", type=int, default=10,
                   help="the run's logging_steps and the plain loop's log interval (default 10, a run's default)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the demo runs)")
    p.add_argument("--clock", choices=list(run_path.CLOCKS), default="wall",
                   help="wall: elapsed time (default); cpu: this process's CPU time, which other processes on a "
                        "shared machine do not add to (one thread, a CPU)")
    p.add_argument("--malloc", choices=["pinned", "default"], default="pinned",
                   help="pinned: re-run under fixed glibc malloc thresholds (see pinned_malloc.py); default: as is")
    p.add_argument("--out-dir", default=str(RESULTS), help="where step_breakdown.md and .json go (default "
                   "benchmarks/results)")
    a = p.parse_args(argv)
    if a.malloc == "pinned" and reexec:
        reexec_pinned(__file__, sys.argv[1:])
    torch.set_num_threads(a.threads)
    run_path.use_clock(a.clock)
    facts = machine_facts()
    result = {**measure(a.rounds, a.steps, a.skip, a.logging_steps), **facts, "malloc": malloc_setting(), "clock": a.clock}
    print(write_results(a.out_dir, "step_breakdown", result, render, "bench_step_breakdown.py", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(reexec=True))
