"""Harness overhead: an hf_optbench run's training step against nanoGPT's plain loop, interleaved in one process.

The hf_optbench side is what ``hf-optbench run`` trains with, assembled by the run's own code (run_path.py: the
plan, the TrainingArguments rendered from it, every callback of a run in its order); the plain side is nanoGPT's
loop (karpathy/nanoGPT train.py): the next batch fetched right after the forward, backward, clip_grad_norm_, the
optimizer and scheduler step, zero_grad, and the loss read back (its only host sync) every log interval. Both use
the same model init, the same blocks of tokens, the same AdamW and schedule. A step's time is the wall time
between two syncs (the plain loop's loss.item(), the Trainer's loss log) over the steps between them, so neither
side pays a wait the other does not; --logging-steps sets both intervals. The "trainer" variant (a stock Trainer
built by hand, no callback of ours, the same logging interval) separates the Trainer's cost from ours.

    python benchmarks/bench_harness.py --shapes demo --threads 1   # the CPU demo's shape (issue 42: <= 1.15x)
    python benchmarks/bench_harness.py                             # every shape
    python benchmarks/bench_harness.py --rounds 2 --steps 20       # quicker
    python benchmarks/bench_harness.py --shapes demo --threads 1 --clock cpu    # on a machine others load too

Shapes: demo (the CPU demo's: tiny, micro-batch 4 x 64, 32-token vocabulary), tiny (8 x 128, vocab 4096),
tiny-b1-s16 (almost no compute: what remains is the fixed cost per step), mini-b16-s256 (a step of >= 100 ms,
where the ratio should reach 1). Targets: issue 8's ratio <= 1.03 where a step takes 100 ms or more, at most 1.10
at the demo's shape: the report divides each speedup by a step-time ratio, so the harness's own share of a step must
stay small beside the optimizers' differences. Differences between separate runs move by several ms on a shared
CPU, so what hf_optbench adds on top of the Trainer is measured three ways: unpaired (median of the per-round differences
between whole runs, with their range); toggled (with --logging-steps 1: one run per round whose callbacks handle
only every other step, so steps with and without them are neighbours under the same load); self (our callbacks'
own time per step, timed around each of their event methods). The allocator's state moved step times more than
the code did, so the script re-runs itself with glibc's malloc thresholds pinned (pinned_malloc.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import Trainer, TrainingArguments, default_data_collator  # noqa: E402
from transformers.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback  # noqa: E402

import run_path  # noqa: E402  (beside this script)
from callback_probes import EveryOtherStep, SelfTimer, split_toggled  # noqa: E402
from pinned_malloc import malloc_setting, reexec_pinned  # noqa: E402
from run_path import (  # noqa: E402
    SyncClock,
    as_examples,
    packed_split,
    per_step,
    plain_loop,
    plain_model,
    project_trainer,
    random_blocks,
    run_args,
)

SHAPES = {
    # name: (model size, micro-batch, block size, vocabulary, embedding rows padded to a multiple of)
    # recipes/sweeps/cpu_demo.yaml's shape and padding: a step of ~7 ms, where fixed costs show
    "demo": ("tiny", 4, 64, 32, 1),
    "tiny": ("tiny", 8, 128, 4096, 64),
    # almost no compute (a step of 3-4 ms here): what remains is the per-step fixed cost, measured with little noise
    "tiny-b1-s16": ("tiny", 1, 16, 128, 64),
    "mini-b16-s256": ("mini", 16, 256, 4096, 64),
}


def _blocks(batch: int, block: int, vocab: int, steps: int) -> torch.Tensor:
    return random_blocks(batch * (steps + 2), block, vocab)


def trainer_steps(
    size: str, batch: int, block: int, vocab: int, steps: int, variant: str, skip: int, *, device: str = "cpu",
    bf16: bool = False, compile_: bool = False, logging_steps: int = 1, pad: int = 64,
    compile_backend: str = "inductor",
) -> dict[str, list[float]]:
    """variant: "hf_optbench" (what ``hf-optbench run`` assembles, our callbacks timed), "toggled" (the same with
    our callbacks gated to every other step) or "trainer" (a stock Trainer given the same optimizer and schedule,
    no callback of ours). Returns step times (``run_path.per_step``, the first ``skip`` steps dropped) and our
    callbacks' own time per step. ``bf16``/``compile_``: what a GPU recipe sets (``compile_backend``:
    torch.compile's)."""
    try:
        from hf_optbench.run.step_cost import start_up_heap_frozen
    except ImportError:  # a checkout from before issue 42 (a before/after comparison): it froze nothing
        start_up_heap_frozen = contextlib.nullcontext

    blocks = _blocks(batch, block, vocab, steps)
    clock, timer = SyncClock(), SelfTimer()
    with tempfile.TemporaryDirectory() as out:
        argv = run_args(size, batch, block, vocab, steps, logging_steps, out, device=device, bf16=bf16,
                        compile_=compile_, pad=pad, compile_backend=compile_backend)
        # the run's side reads the blocks as a run reads its data (a packed split through the block view)
        trainer, _, _, built = project_trainer(argv, packed_split(blocks))
        if variant == "trainer":
            from hf_optbench.optim.schedules import build_scheduler

            args = TrainingArguments(
                output_dir=out, max_steps=steps, per_device_train_batch_size=batch, use_cpu=device == "cpu",
                report_to="none", logging_steps=logging_steps, logging_nan_inf_filter=False, save_strategy="no",
                eval_strategy="no", disable_tqdm=True, dataloader_drop_last=True, max_grad_norm=1.0, seed=0,
                bf16=bf16, torch_compile=compile_,
                # a backend set turns torch_compile on in TrainingArguments: given only when compiling
                **({"torch_compile_backend": compile_backend} if compile_ else {}))
            sched = build_scheduler("gpt3_cosine", built.optimizer, num_training_steps=steps, warmup_steps=0.1)
            trainer = Trainer(model=plain_model(trainer.model), args=args, train_dataset=as_examples(blocks),
                              data_collator=default_data_collator, optimizers=(built.optimizer, sched))
            trainer.remove_callback(PrinterCallback)  # as hf_optbench.run does (it prints its own progress)
            trainer.remove_callback(ProgressCallback)
        else:
            handler = trainer.callback_handler
            ours = [cb for cb in handler.callbacks if not isinstance(cb, DefaultFlowCallback)]
            if variant == "hf_optbench":
                for cb in ours:
                    timer.wrap(cb)
            else:
                gated = EveryOtherStep(*ours)
                handler.callbacks[:] = [cb for cb in handler.callbacks if cb not in ours] + [gated]
        trainer.add_callback(clock)
        frozen = start_up_heap_frozen() if variant != "trainer" else contextlib.nullcontext()
        with contextlib.redirect_stdout(io.StringIO()), frozen:  # stdout: keep this script's to its result table
            trainer.train()  # hf_optbench.run.train trains inside start_up_heap_frozen, as here
    return {"intervals": per_step(clock.stamps, skip), "self": timer.per_step[1 + skip:]}


def plain_steps(
    size: str, batch: int, block: int, vocab: int, steps: int, skip: int, *, device: str = "cpu", bf16: bool = False,
    compile_: bool = False, logging_steps: int = 1, pad: int = 64, compile_backend: str = "inductor",
) -> list[float]:
    """nanoGPT's loop (``run_path.plain_loop``) on the model and optimizer an hf_optbench run builds for this shape
    (its plan's AdamW), the schedule stepped as the Trainer steps it; bf16 autocast and ``torch.compile`` as
    nanoGPT's train.py uses them. Returns step times, the first ``skip`` dropped."""
    from hf_optbench.optim.schedules import build_scheduler

    blocks = _blocks(batch, block, vocab, steps)
    with tempfile.TemporaryDirectory() as out:
        argv = run_args(size, batch, block, vocab, steps, logging_steps, out, device=device, pad=pad)
        trainer, _, prepared, built = project_trainer(argv, as_examples(blocks))
    model = plain_model(prepared.model).to(device)
    step_model = torch.compile(model, backend=compile_backend) if compile_ else model
    sched = build_scheduler("gpt3_cosine", built.optimizer, num_training_steps=steps, warmup_steps=0.1)
    stamps = plain_loop(model, blocks, batch, built.optimizer, sched, steps, logging_steps, device=device, bf16=bf16,
                        step_model=step_model)
    del trainer
    return per_step(stamps, skip)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def _spread(values: list[float], digits: int = 4) -> dict[str, Any]:
    values = sorted(values)
    return {"median": round(statistics.median(values), digits), "range": [round(values[0], digits),
                                                                          round(values[-1], digits)]}


def measure(shape: str, rounds: int, steps: int, skip: int, logging_steps: int = 1) -> dict[str, Any]:
    """Rounds of plain, trainer and hf_optbench runs (order rotated each round), plus one toggled run per round when
    the Trainer logs every step."""
    size, batch, block, vocab, pad = SHAPES[shape]
    dims = (size, batch, block, vocab, steps)
    kw = {"logging_steps": logging_steps, "pad": pad}
    runners = {
        "plain": lambda: plain_steps(*dims, skip, **kw),
        "trainer": lambda: trainer_steps(*dims, "trainer", skip, **kw)["intervals"],
        "hf_optbench": lambda: trainer_steps(*dims, "hf_optbench", skip, **kw),
    }
    times: dict[str, list[float]] = {k: [] for k in runners}
    per_round: list[dict[str, float]] = []
    toggled: dict[str, list[float]] = {"on": [], "off": []}
    self_time: list[float] = []
    order = list(runners)
    for r in range(rounds):
        # the order rotated every round: a variant that always ran last was measured ~8 ms/step slower on the tiny
        # shape than the same code run first (allocator and cache state, not the code)
        medians = {}
        for name in order[r % 3:] + order[:r % 3]:
            res = runners[name]()
            if name == "hf_optbench":
                self_time += res["self"]
                res = res["intervals"]
            times[name] += res
            medians[name] = statistics.median(res)
        per_round.append(medians)
        if logging_steps == 1:  # split_toggled reads each step's parity from its index: every step a sync
            for k, v in split_toggled(trainer_steps(*dims, "toggled", 0, pad=pad)["intervals"], skip).items():
                toggled[k] += v
    med = {k: statistics.median(v) for k, v in times.items()}
    ours_unpaired = [m["hf_optbench"] - m["trainer"] for m in per_round]
    fixed = [m["trainer"] - m["plain"] for m in per_round]
    return {
        "shape": shape, "model_size": size, "micro_batch": batch, "block_size": block, "vocab": vocab,
        "logging_steps": logging_steps, "threads": torch.get_num_threads(), "rounds": rounds,
        "malloc": malloc_setting(),
        "steps_measured": {k: len(v) for k, v in times.items()},
        "median_step_ms": {k: _ms(v) for k, v in med.items()},
        "median_step_ms_per_round": {k: [_ms(m[k]) for m in per_round] for k in runners},
        "ratio_hf_optbench_vs_plain": round(med["hf_optbench"] / med["plain"], 4),
        "ratio_per_round": _spread([m["hf_optbench"] / m["plain"] for m in per_round]),
        "trainer_fixed_cost_ms": {"median": _ms(statistics.median(fixed)), "range": [_ms(min(fixed)),
                                                                                      _ms(max(fixed))]},
        "ours_on_top_ms": {
            "unpaired_median": _ms(statistics.median(ours_unpaired)),
            "unpaired_range": [_ms(min(ours_unpaired)), _ms(max(ours_unpaired))],
            "toggled": _ms(statistics.median(toggled["on"]) - statistics.median(toggled["off"]))
            if toggled["on"] and toggled["off"] else None,
            "toggled_steps": {k: len(v) for k, v in toggled.items()},
            "self_median": round(statistics.median(self_time) * 1e3, 3) if self_time else None,
            "self_mean": round(statistics.fmean(self_time) * 1e3, 3) if self_time else None,
        },
    }


def main(argv: list[str] | None = None, reexec: bool = False) -> int:
    """``reexec``: allowed to replace the process to pin malloc (the script's entry point; not for callers)."""
    head, rest = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                   help="shapes to measure (default: all)")
    p.add_argument("--rounds", type=int, default=6, help="rounds; each runs every variant once (default 6)")
    p.add_argument("--steps", type=int, default=25, help="optimizer steps per run (default 25)")
    p.add_argument("--skip", type=int, default=3, help="first steps dropped per run: warm-up (default 3)")
    p.add_argument("--logging-steps", type=int, default=10,
                   help="the Trainer's logging_steps and the plain loop's log interval: one host sync per that many "
                        "steps on each side (default 10, a run's default since issue 42; 1 adds the toggled figure)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default 0: torch's default; "
                   "the CPU demo runs with 1)")
    p.add_argument("--clock", choices=list(run_path.CLOCKS), default="wall",
                   help="wall: elapsed time (default); cpu: this process's CPU time, which other processes on a "
                        "shared machine do not add to (one thread, a CPU; not for a GPU)")
    p.add_argument("--malloc", choices=["pinned", "default"], default="pinned",
                   help="pinned: re-run under fixed glibc malloc thresholds (see pinned_malloc.py); default: as is")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    a = p.parse_args(argv)
    if a.malloc == "pinned" and reexec:
        reexec_pinned(__file__, sys.argv[1:])
    if a.threads:
        torch.set_num_threads(a.threads)
    run_path.use_clock(a.clock)
    results = [{**measure(shape, a.rounds, a.steps, a.skip, a.logging_steps), "clock": a.clock}
               for shape in a.shapes]
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {sys.version.split()[0]}, "
          f"malloc thresholds {malloc_setting()}; {a.rounds} rounds x {a.steps} steps per run, first {a.skip} "
          f"dropped, a sync every {a.logging_steps} step(s), {a.clock} clock; differences are medians of "
          "per-round differences [range]")
    print("| shape | plain loop ms | Trainer ms | hf_optbench ms | ratio vs plain | per-round ratio "
          "| Trainer fixed cost ms | ours on top of Trainer: unpaired ms | toggled ms | self ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m, t, o, q = r["median_step_ms"], r["trainer_fixed_cost_ms"], r["ours_on_top_ms"], r["ratio_per_round"]
        print(f"| {r['shape']} | {m['plain']} | {m['trainer']} | {m['hf_optbench']} | "
              f"{r['ratio_hf_optbench_vs_plain']} | {q['median']} [{q['range'][0]}, {q['range'][1]}] | "
              f"{t['median']} [{t['range'][0]}, {t['range'][1]}] | "
              f"{o['unpaired_median']} [{o['unpaired_range'][0]}, {o['unpaired_range'][1]}] | {o['toggled']} | "
              f"{o['self_median']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(reexec=True))
