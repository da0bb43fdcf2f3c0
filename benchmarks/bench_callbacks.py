"""Overhead of hf_optbench's measurement callbacks: the same tiny-GPT-2 Trainer training with and without them.

Every variant uses the stock ``transformers.Trainer`` with ``logging_steps=1`` and ``logging_nan_inf_filter=False``
(what the callbacks need), the same model init, data and optimizer, in one process. A step is the wall time
between consecutive ``on_step_end`` events, so everything the callbacks add between steps (their ``on_log``, JSON
rows, spike rule, timers) is inside it. The first ``--skip`` intervals of every run (warm-up, and the one-off
optimizer-state walk after step 1) are dropped. Three figures, because on a shared CPU a ratio of medians moves
by several percent from run to run while the effect sought is < 1%:

* alternating runs: whole runs without / with the recorder, in alternating order; ratio of median step times and
  the spread of the per-round ratios;
* toggled steps: one run per round where the recorder handles only every other step (the others skip it
  entirely), so "with" and "without" steps are neighbours under the same machine load; ratio of their medians;
* self time: every recorder method wrapped in a timer, summed per step, as a share of the median step: this one
  does not depend on the noise in the rest of the step.

    python benchmarks/bench_callbacks.py                       # 6 rounds x 40 steps, vocab 4096
    python benchmarks/bench_callbacks.py --vocab 128 --json    # a ~10x shorter step: fixed costs show most

Target (issue 4): the callbacks cost < 1% of the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

from hf_optbench.config.bench_args import BenchArguments  # noqa: E402
from hf_optbench.measure.recorder import default_callbacks  # noqa: E402

from callback_probes import EveryOtherStep, SelfTimer, split_toggled  # noqa: E402  (beside this script)


class _StepClock(TrainerCallback):
    """Timestamps at each optimizer step's end (placed after the recorder): differences are full step times."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())


def run_once(shape: dict, steps: int, variant: str) -> dict:
    """variant: "without", "with" or "toggled". Returns step intervals (index i = interval ending at step i+2)."""
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=shape["n_layer"], n_head=max(1, shape["n_embd"] // 32), n_embd=shape["n_embd"],
                     vocab_size=shape["vocab"], n_positions=shape["block"], use_cache=False, bos_token_id=0,
                     eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape["vocab"], (shape["batch"] * (steps + 1), shape["block"]), generator=g)
    data = [{"input_ids": r, "labels": r} for r in ids]
    clock = _StepClock()
    timer = SelfTimer()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            out, max_steps=steps, per_device_train_batch_size=shape["batch"], use_cpu=True, report_to="none",
            logging_steps=1, logging_nan_inf_filter=False, save_strategy="no", eval_strategy="no",
            disable_tqdm=True, dataloader_drop_last=True, max_grad_norm=1.0, seed=0, learning_rate=6e-4,
        )
        callbacks: list = [clock]
        if variant != "without":
            recorder = default_callbacks(BenchArguments(target_losses=[8.0, 7.0]), out,
                                         tokens_per_step=shape["batch"] * shape["block"])[0]
            callbacks = [timer.wrap(recorder) if variant == "with" else EveryOtherStep(recorder), clock]
        trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                          callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)  # the per-step print is the same on every side: keep stdout clean
        trainer.train()
    intervals = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    # per_step[0] is step 1 (with the one-off optimizer-state walk)
    return {"intervals": intervals, "self": timer.per_step[1:], "once": sum(timer.once)}


def measure(shape: dict, rounds: int, steps: int, skip: int) -> dict:
    times: dict[str, list[float]] = {"without": [], "with": []}
    round_ratios: list[float] = []
    toggled: dict[str, list[float]] = {"on": [], "off": []}
    self_time: list[float] = []
    once: list[float] = []
    for r in range(rounds):
        medians = {}
        for variant in (("without", "with") if r % 2 == 0 else ("with", "without")):
            res = run_once(shape, steps, variant)
            kept = res["intervals"][skip:]
            times[variant] += kept
            medians[variant] = statistics.median(kept)
            if variant == "with":
                self_time += res["self"][skip:]
                once.append(res["once"])
        round_ratios.append(medians["with"] / medians["without"])
        for k, v in split_toggled(run_once(shape, steps, "toggled")["intervals"], skip).items():
            toggled[k] += v
    med = {k: statistics.median(v) for k, v in times.items()}
    tog = {k: statistics.median(v) for k, v in toggled.items()}
    round_ratios.sort()
    self_mean = statistics.fmean(self_time)
    return {
        "shape": shape, "rounds": rounds, "steps_per_run": steps, "skipped_per_run": skip,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "python": sys.version.split()[0],
        "alternating_runs": {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "ratio": round(med["with"] / med["without"], 4),
            "per_round_ratio_median": round(statistics.median(round_ratios), 4),
            "per_round_ratio_range": [round(round_ratios[0], 4), round(round_ratios[-1], 4)],
        },
        "toggled_steps": {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in tog.items()},
            "ratio_on_vs_off": round(tog["on"] / tog["off"], 4),
            "steps": {k: len(v) for k, v in toggled.items()},
        },
        "self_time": {
            "median_us_per_step": round(statistics.median(self_time) * 1e6, 1),
            "mean_us_per_step": round(self_mean * 1e6, 1),
            "share_of_median_step": round(self_mean / med["without"], 5),
            "one_off_ms_per_run": round(statistics.median(once) * 1e3, 2),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6, help="rounds; each runs without, with (alternating order) "
                   "and toggled")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--skip", type=int, default=3, help="first step intervals dropped per run")
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4096, help="4096: the LM head dominates the step; 128: a several "
                   "times shorter step, where a fixed per-step cost shows most")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: steadier on a shared CPU, where the spinning OpenMP threads of "
                        "several processes slow each other down)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    shape = {"n_layer": a.n_layer, "n_embd": a.n_embd, "vocab": a.vocab, "batch": a.batch, "block": a.block}
    res = measure(shape, a.rounds, a.steps, a.skip)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    alt, tog, st = res["alternating_runs"], res["toggled_steps"], res["self_time"]
    print(f"torch {res['torch']}, {res['threads']} thread(s), python {res['python']}; tiny GPT-2 "
          f"{a.n_layer}x{a.n_embd}, vocab {a.vocab}, micro-batch {a.batch}, block {a.block}; {a.rounds} rounds x "
          f"{a.steps} steps per run, first {a.skip} dropped")
    print(f"alternating runs: median step without {alt['median_step_ms']['without']:.2f} ms, with "
          f"{alt['median_step_ms']['with']:.2f} ms, ratio {alt['ratio']:.4f} (per-round ratios: median "
          f"{alt['per_round_ratio_median']:.4f}, range {alt['per_round_ratio_range'][0]:.3f}-"
          f"{alt['per_round_ratio_range'][1]:.3f})")
    print(f"toggled steps:    median step off {tog['median_step_ms']['off']:.2f} ms, on "
          f"{tog['median_step_ms']['on']:.2f} ms, ratio {tog['ratio_on_vs_off']:.4f}")
    print(f"self time:        median {st['median_us_per_step']:.0f} us/step, mean {st['mean_us_per_step']:.0f} "
          f"us/step = {100 * st['share_of_median_step']:.2f}% of the median step (target < 1%); one-off per run "
          f"(train begin + end) {st['one_off_ms_per_run']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
