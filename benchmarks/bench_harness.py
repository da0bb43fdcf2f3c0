"""Harness overhead: an hf_optbench run (stock Trainer + our optimizer factory + our callbacks) against the
plainest loop (nanoGPT's: forward, backward, clip_grad_norm_, AdamW step, zero_grad), interleaved in one process.

Both sides use the same model init, the same packed data, the same batch and the same torch AdamW, so the ratio
of median step times is the harness's cost. A "step" is the wall time between consecutive optimizer steps, so
everything the harness adds between steps (data loading, logging, callbacks, scheduler) is inside it.

    python benchmarks/bench_harness.py                 # tiny (fixed cost in ms) and a >=100 ms shape (ratio)
    python benchmarks/bench_harness.py --rounds 2 --steps 10   # quicker

Targets (issue 8): ratio <= 1.03 on shapes whose step takes >= 100 ms; on the tiny shape, the fixed cost per step
in ms (the Trainer alone adds about 3-5 ms here) plus no more than 1 ms of ours. The "trainer only" variant (stock
Trainer without our callbacks) separates the two.
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
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator  # noqa: E402
from transformers.trainer_callback import PrinterCallback, ProgressCallback  # noqa: E402

from hf_optbench.bench_config import BenchArguments  # noqa: E402
from hf_optbench.callbacks import default_callbacks  # noqa: E402
from hf_optbench.models import build_model  # noqa: E402
from hf_optbench.optimizers import build_optimizer  # noqa: E402
from hf_optbench.run import ConsoleProgress  # noqa: E402
from hf_optbench.schedules import build_scheduler  # noqa: E402
from hf_optbench.trainer import OptBenchTrainer  # noqa: E402

SHAPES = {
    # name: (model size, micro-batch, block size)
    "tiny": ("tiny", 8, 128),
    "mini-b16-s256": ("mini", 16, 256),
}
VOCAB = 4096


class _StepClock(TrainerCallback):
    """Timestamps at each optimizer step end: consecutive differences are full step times."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())


def _data(n_blocks: int, block: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n_blocks, block), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _deltas(stamps: list[float], skip: int) -> list[float]:
    d = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return d[skip:]


def trainer_steps(size: str, batch: int, block: int, steps: int, with_callbacks: bool, skip: int) -> list[float]:
    torch.manual_seed(0)
    model = build_model(size, VOCAB, n_positions=block)
    data = _data(batch * (steps + 2), block)
    opt = build_optimizer("adamw", model, lr=6e-4, weight_decay=0.1, model_size=size)
    sched = build_scheduler("gpt3_cosine", opt, num_training_steps=steps, warmup_steps=0.1)
    clock = _StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=batch, use_cpu=True, report_to="none",
            logging_steps=1, logging_nan_inf_filter=False, save_strategy="no", eval_strategy="no",
            disable_tqdm=True, dataloader_drop_last=True, max_grad_norm=1.0, seed=0,
        )
        callbacks: list = [clock]
        trainer_cls = Trainer
        if with_callbacks:  # exactly what hf_optbench.run assembles
            callbacks = default_callbacks(BenchArguments(), out, tokens_per_step=batch * block) + [
                ConsoleProgress(steps), clock]
            trainer_cls = OptBenchTrainer
        trainer = trainer_cls(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                              optimizers=(opt, sched), callbacks=callbacks)
        # Both variants drop transformers' per-log printing (with logging_steps=1 it prints a dict every step);
        # hf_optbench.run replaces it with ConsoleProgress, a line every ~10% of the run.
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        with contextlib.redirect_stdout(io.StringIO()):  # keep this script's stdout to its result table
            trainer.train()
    return _deltas(clock.stamps, skip)


def plain_steps(size: str, batch: int, block: int, steps: int, skip: int) -> list[float]:
    """nanoGPT's loop, with a torch DataLoader over the same examples (the Trainer also uses one)."""
    torch.manual_seed(0)
    model = build_model(size, VOCAB, n_positions=block)
    model.train()
    data = _data(batch * (steps + 2), block)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, collate_fn=default_data_collator, drop_last=True)
    opt = build_optimizer("adamw", model, lr=6e-4, weight_decay=0.1, model_size=size)
    sched = build_scheduler("gpt3_cosine", opt, num_training_steps=steps, warmup_steps=0.1)
    stamps = []
    for i, batch_ in enumerate(loader):
        if i >= steps:
            break
        loss = model(**batch_).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the Trainer logs the loss every step (logging_steps=1): same sync here
        stamps.append(time.perf_counter())
    return _deltas(stamps, skip)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of each variant")
    p.add_argument("--steps", type=int, default=25, help="optimizer steps per variant per round")
    p.add_argument("--skip", type=int, default=3, help="first step intervals dropped per round (warm-up)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    results = []
    for shape in a.shapes:
        size, batch, block = SHAPES[shape]
        times: dict[str, list[float]] = {"plain": [], "trainer": [], "hf_optbench": []}
        shape_args = (size, batch, block, a.steps)
        runners = {
            "plain": lambda s=shape_args: plain_steps(*s, a.skip),
            "trainer": lambda s=shape_args: trainer_steps(*s, False, a.skip),
            "hf_optbench": lambda s=shape_args: trainer_steps(*s, True, a.skip),
        }
        order = list(runners)
        for r in range(a.rounds):
            # interleaved, and the order rotated every round: a variant that always ran last was measured ~8 ms/step
            # slower on the tiny shape than the same code run first (allocator and cache state, not the code)
            for name in order[r % 3:] + order[:r % 3]:
                times[name] += runners[name]()
        med = {k: statistics.median(v) for k, v in times.items()}
        results.append({
            "shape": shape, "model_size": size, "micro_batch": batch, "block_size": block,
            "steps_measured": {k: len(v) for k, v in times.items()},
            "median_step_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
            "ratio_hf_optbench_vs_plain": round(med["hf_optbench"] / med["plain"], 4),
            "fixed_cost_ms_trainer": round((med["trainer"] - med["plain"]) * 1e3, 2),
            "fixed_cost_ms_callbacks": round((med["hf_optbench"] - med["trainer"]) * 1e3, 2),
        })
    if a.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {sys.version.split()[0]}")
        print("| shape | plain loop ms | Trainer ms | hf_optbench ms | ratio vs plain | Trainer fixed cost ms "
              "| hf_optbench on top of Trainer ms |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            m = r["median_step_ms"]
            print(f"| {r['shape']} | {m['plain']} | {m['trainer']} | {m['hf_optbench']} | "
                  f"{r['ratio_hf_optbench_vs_plain']} | {r['fixed_cost_ms_trainer']} | "
                  f"{r['fixed_cost_ms_callbacks']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
